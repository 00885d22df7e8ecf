"""Every error under /api/ leaves in the API's shape: {"detail": sentence, "errors": [...]}.

ninja's handlers shape the errors raised inside endpoints. Two kinds never reach them: a path no
route matches (Django's HTML 404, e.g. /api/training-runs/null) and a method a route does not
serve (ninja's plain-text 405). Schemathesis found both; this middleware reshapes any non-JSON 4xx
or 5xx under /api/ after the fact.
"""
from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

API_PREFIX = "/api/"
SENTENCES = {
    400: "The request could not be understood.",
    403: "You are not allowed to do this.",
    404: "Not found: check the URL (ids are integers, names as listed by the API).",
    405: "This method is not allowed here.",
    413: "The request body is too large.",
    500: "Something went wrong on the server: it has been logged; try again, and report it if it persists.",
}


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
