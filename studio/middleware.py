"""Every error under /api/ leaves in the API's shape: {"detail": sentence, "errors": [...]}.

ninja's handlers shape the errors raised inside endpoints. Two kinds never reach them: a path no
route matches (Django's HTML 404, e.g. /api/training-runs/null) and a method a route does not
serve (ninja's plain-text 405). Schemathesis found both; this middleware reshapes any non-JSON 4xx
or 5xx under /api/ after the fact.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from functools import partial
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParser
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.datastructures import ImmutableList
from django.utils.encoding import force_str

from datahub.storage import disk_full, disk_full_error
from studio.database import UNREACHABLE_ADVICE, database_unreachable
from studio.errors import ApiError
from studio.ratelimit import TooManyRequests
from studio.sqlite import database_busy
from studio.views import bad_request, too_many_log_ins

API_PREFIX = "/api/"
SENTENCES = {
    400: "The request could not be understood.",
    403: "You are not allowed to do this.",
    404: "Not found: check the URL (ids are integers, names as listed by the API).",
    405: "This method is not allowed here.",
    413: "The request body is too large.",
    503: "The Studio is busy: send the request again after Retry-After seconds.",
    500: "Something went wrong on the server: it has been logged; try again, and report it if it persists.",
}


class ApiHeadMiddleware:
    """HEAD on the API answers as its GET would, less the body (RFC 9110, 9.3.2): ninja routes GET
    only, so a HEAD was a 405."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "HEAD" or not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        request.method = "GET"
        response = self.get_response(request)
        if not getattr(response, "streaming", False):
            response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response


class ApiErrorShapeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            response.status_code >= 400
            and request.path.startswith(API_PREFIX)
            and not response.get("Content-Type", "").startswith("application/json")
            and not getattr(response, "streaming", False)
        ):
            status = response.status_code
            detail = SENTENCES.get(status) or SENTENCES[500 if status >= 500 else 400]
            if status == 405 and response.get("Allow"):
                detail = f"{detail} Use {response['Allow']}."
            shaped = JsonResponse({"detail": detail, "errors": []}, status=status)
            for header in ("Allow", "Vary", "Retry-After"):
                if header in response:
                    shaped[header] = response[header]
            return shaped
        return response


class DatabaseUnavailableMiddleware:
    """A page or form whose database is busy past its wait (studio.sqlite.database_busy) or cannot be
    reached (studio.database.database_unreachable) is the 503 page with Retry-After, not a 500: htmx's
    error banner shows its card, which says to send it again. (The API answers its own, in its shape:
    studio.api.on_database_error.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        busy = database_busy(exception)
        if busy is not None:
            advice = f"wait {busy.retry_after} s, then send it again (press the button again, or reload the page)"
            return with_headers(render(request, "503.html", {"detail": busy.detail, "advice": advice}, status=busy.status), busy)
        unreachable = database_unreachable(exception)
        if unreachable is None:
            return None
        advice = (f"reload the page in {unreachable.retry_after} s, or press the button again; if it stays, tell the Studio's "
                  f"administrator to {UNREACHABLE_ADVICE}")
        # Rendered without the request: the header's user, projects and messages would ask the database again.
        page = render_to_string("503.html", {"title": "Database unreachable", "heading": "The Studio cannot reach its database",
                                             "detail": unreachable.detail, "advice": advice})
        return with_headers(HttpResponse(page, status=unreachable.status), unreachable)


def with_headers(response: HttpResponse, error: ApiError) -> HttpResponse:
    for name, value in error.headers().items():
        response[name] = value
    return response


class FormParseMiddleware:
    """A multipart form read on a full disk is a 507, not a 500; one over Django's limits (files,
    fields, bytes) is the 400 page's sentence, under DEBUG too (which skips handler400 and shows
    its technical page).

    Django spools each file of a form over FILE_UPLOAD_MAX_MEMORY_SIZE to FILE_UPLOAD_TEMP_DIR as
    it parses the body, and the first to parse it is the CSRF check, before any view that could
    answer. Placed before CsrfViewMiddleware, this parses the form first, and a full disk there
    (ENOSPC, EDQUOT) answers as the Data Hub's own writes do: nothing was stored, free space, send
    it again."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The API takes no forms (studio.api.json_body answers a form with a 415 before reading it).
        if request.method == "POST" and request.content_type == "multipart/form-data" and not request.path.startswith(API_PREFIX):
            request.parse_file_upload = partial(parse_keeping_names, request)  # type: ignore[method-assign]
            try:
                request.POST  # noqa: B018 (parsing is the point)
            except (TooManyFilesSent, TooManyFieldsSent, RequestDataTooBig) as exc:
                return bad_request(request, exc)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                discard_spooled_files(request)
                error = disk_full_error(exc, "files", "send the form again")
                return render(request, "507.html", {"detail": error.detail, "advice": error.errors[0].message}, status=error.status)
        return self.get_response(request)


class NameKeepingParser(MultiPartParser):
    """Django's multipart parser, which also keeps each file's name as the browser sent it, as
    `given_name` on its UploadedFile. Django's `name` is a safe name for a local disk: HTML entities
    unescaped (R&amp;D.txt → R&D.txt), what precedes a / or \\ dropped, unprintable characters
    removed, cut to 255 characters. A form that stores the file under the name its user chose (the
    Data Hub's Upload files) must read given_name, and refuse it as the API would, rather than
    store another name."""

    given_name = ""

    def sanitize_file_name(self, file_name: str) -> str | None:
        self.given_name = file_name  # the file's handle_file_complete runs before the next file's name is read
        return super().sanitize_file_name(file_name)

    def handle_file_complete(self, old_field_name: Any, counters: list[int]) -> None:
        field = force_str(old_field_name, self._encoding, errors="replace")
        before = len(self._files.getlist(field))
        super().handle_file_complete(old_field_name, counters)
        files = self._files.getlist(field)
        if len(files) > before:
            files[-1].given_name = self.given_name


def parse_keeping_names(request: HttpRequest, meta: Any, post_data: Any) -> tuple[Any, Any]:
    """HttpRequest.parse_file_upload with NameKeepingParser."""
    request.upload_handlers = ImmutableList(request.upload_handlers, warning="You cannot alter upload handlers after the upload has been processed.")
    return NameKeepingParser(meta, post_data, request.upload_handlers, request.encoding).parse()


def discard_spooled_files(request: HttpRequest) -> None:
    """Close (so delete) the temp file a parse left half-written: Django would only at garbage
    collection, holding the space the user is asked to free."""
    for handler in request.upload_handlers:
        spooled = getattr(handler, "file", None)
        if spooled is not None:
            with suppress(OSError):
                spooled.close()


class TooManyLogInsMiddleware:
    """A password check over its failure budget raises TooManyRequests out of authenticate()
    (studio.auth.RateLimitedModelBackend); from a form that does not answer it itself, as the
    admin's log-in, it is a 429 page with Retry-After rather than a 500. (The API and the Hub answer
    their own TooManyRequests, so none reaches here from them.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return too_many_log_ins(request, exception) if isinstance(exception, TooManyRequests) else None
