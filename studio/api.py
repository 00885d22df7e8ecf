"""The one NinjaAPI. Every error leaves as {"detail": sentence, "errors": [{field, message}]}.

Write bodies are parsed inside the endpoints (parse_body) rather than by ninja's signature, so the
status-code precedence of the contract holds: 401 → 404 → 403 → 402 → 409 → 400/422. A schema
error on a run you cannot see must still be a 404.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import Error, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from pydantic import BaseModel, Field
from pydantic import ValidationError as PydanticValidationError

from studio.auth import Actor, StudioAuth
from studio.database import database_unavailable
from studio.errors import ApiError, BadRequest, Finding, NotFound, PayloadTooLarge, Unauthorized, UnsupportedMediaType

S = TypeVar("S", bound=BaseModel)  # a ninja Schema, or a plain pydantic model (training.schemas.IngestBatchIn)


class FindingOut(Schema):
    field: str = Field(description='The field path, e.g. "config.loss.type" ("body" for the whole body)')
    message: str = Field(description="What to do about it")


class ErrorOut(Schema):
    """The body of every 4xx."""

    detail: str = Field(description="A sentence saying what is wrong")
    errors: list[FindingOut] = Field(description="One finding per bad field; empty when no field is to blame")


COMPONENTS = "#/components/schemas/{model}"
ERROR_RESPONSE = {
    "description": "The error body (401 → 404 → 403 → 402 → 409 → 400/422, the first that applies; a query "
                   "parameter the endpoint does not take, or one given twice, is a 400 right after the 401)",
    "content": {"application/json": {"schema": {"$ref": COMPONENTS.format(model="ErrorOut")}}},
}


class StudioApi(NinjaAPI):
    def get_openapi_schema(self, **kwargs: Any):
        """Ninja's schema, plus the error body on every operation: errors leave through the
        exception handlers below, never as an endpoint's return value, so ninja cannot see them."""
        schema = super().get_openapi_schema(**kwargs)
        error = ErrorOut.model_json_schema(ref_template=COMPONENTS)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(error.pop("$defs", {}), ErrorOut=error)
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation["responses"].setdefault("4XX", ERROR_RESPONSE)
                if "requestBody" in operation:
                    operation["requestBody"] = hoist_defs(operation["requestBody"], components)
        return schema


def hoist_defs(request_body: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """`request_body` with its schemas' nested models ($defs, as body_schema() builds them) moved into
    components, where their $refs point: left in the body they resolved nowhere, and /api/docs showed a
    resolver error for that operation. A copy: the endpoint's openapi_extra is the very dict ninja
    merges into the document on every call, so changing it in place lost the $defs after one call."""
    content = {}
    for media_type, entry in request_body.get("content", {}).items():
        schema = dict(entry.get("schema", {}))
        for name, definition in schema.pop("$defs", {}).items():
            if components.setdefault(name, definition) != definition:
                # Two models of one name: a $ref would read the wrong one. Rename one of the classes.
                raise ValueError(f"two schemas are named {name!r} in the OpenAPI document, with different fields")
        content[media_type] = {**entry, "schema": schema} if "schema" in entry else entry
    return {**request_body, "content": content} if "content" in request_body else request_body


api = StudioApi(title="Studio API", version="1.0", urls_namespace="api", auth=StudioAuth(), docs=Swagger())


# The list endpoints' limit and offset (training runs, rollouts, a hub repo's branches). PostgreSQL's
# LIMIT/OFFSET are bigints: ninja's own Input lets any integer through, and ?limit=3e26 was a 500
# (found by schemathesis). Bounded, so it is a 400 naming the field.
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1


def query_names(operation: Any) -> frozenset[str]:
    """The query parameters an operation takes: those of its signature (Query[...] and plain
    values, pagination's included) and those it reads by hand and documents in openapi_extra."""
    names = {name for model in operation.models if model.__ninja_param_source__ == "query"
             for name in model.__ninja_flatten_map__}
    extra = (operation.openapi_extra or {}).get("parameters", [])
    return frozenset(names | {p["name"] for p in extra if p.get("in") == "query"})


def refuse_unknown_query(run: Any) -> Any:
    """A misspelt filter (`?stauts=failed`) must not quietly list every run. Applied to each
    operation as it is bound: its parameters are read (after authentication, as ninja reads its
    own, so 401 still comes first) only once every query name is one it takes."""
    operation = run.__self__
    known, read = query_names(operation), operation._get_values

    def get_values(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        unknown = sorted(set(request.GET) - known)
        if unknown:
            takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
            raise BadRequest("The request has unknown query parameters.",
                             [Finding(name, f"unknown query parameter: remove it ({takes})") for name in unknown[:20]])
        # ?status=completed&status=queued read as status=queued alone: the list looked filtered by both.
        repeated = sorted(name for name in request.GET if len(request.GET.getlist(name)) > 1)
        if repeated:
            raise BadRequest("The request repeats query parameters that take one value.", [
                Finding(name, f"given {len(request.GET.getlist(name))} times, and only one value is read: give it once"
                              + (" (several keys go in one, comma-separated: keys=loss,kd_loss)" if name == "keys" else ""))
                for name in repeated[:20]])
        return read(request, *args, **kwargs)

    operation._get_values = get_values
    return run


api.add_decorator(refuse_unknown_query, mode="view")


# The tags pydantic puts in an error's loc for each member of a union (`str | int` → "str", "int";
# "list[...]", "function-after[...]"): they name a type, not a field, so a path leaves them out.
UNION_TAG = re.compile(r"^(str|int|float|bool|bytes|none|[a-z_-]+\[.*\])$")


NINJA_MARKERS = ("body", "payload", "query", "path", "filters")


def field_path(loc: tuple | list, *, ninja: bool = False) -> str:
    """`config.loss.type`, `metrics[0].step`. With ninja, the leading markers ninja puts before the
    field ("query", "path", "body"…) are dropped; a field that is itself called "path" is kept."""
    loc = list(loc)
    while ninja and loc and loc[0] in NINJA_MARKERS:
        loc.pop(0)
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif UNION_TAG.match(str(item)):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "body"


def findings_from_pydantic(errors: Sequence[Mapping[str, Any]], *, ninja: bool = False) -> list[Finding]:
    """One finding per field: a value no member of a union accepts is one problem, not one per member."""
    messages: dict[str, list[str]] = {}
    for err in errors:
        message = err.get("msg", "is not valid")
        if err.get("type") == "missing":
            message = "this field is required"
        elif err.get("type") == "extra_forbidden":
            message = "unknown field: remove it"
        field = messages.setdefault(field_path(err.get("loc", ()), ninja=ninja), [])
        if message not in field:
            field.append(message)
    return [Finding(field, "; or ".join(found)) for field, found in messages.items()]


MAX_JSON_DEPTH = 32


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large for a number")
    return value


def unstorable(value: Any) -> Finding | None:
    """What PostgreSQL cannot store (NUL characters, lone surrogates) or is nested absurdly deep.

    Python's json accepts all of it; left alone, it fails at the INSERT as a 500. Iterative, so a
    deep value cannot exhaust the stack here either.
    """
    stack: list[tuple[Any, tuple, int]] = [(value, (), 0)]
    while stack:
        item, loc, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return Finding(field_path(loc), f"nested more than {MAX_JSON_DEPTH} levels deep: flatten it")
        if isinstance(item, str):
            if "\x00" in item:
                return Finding(field_path(loc), "contains a NUL character (\\u0000): remove it")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return Finding(field_path(loc), "contains an unpaired surrogate (\\ud800-\\udfff): send valid UTF-8 text")
        elif isinstance(item, dict):
            for key, child in item.items():
                key_problem = unstorable(key)
                if key_problem is not None:
                    readable = key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\u0000")
                    return Finding(field_path((*loc, readable)), "this key " + key_problem.message)
                stack.append((child, (*loc, key), depth + 1))
        elif isinstance(item, list):
            stack.extend((child, (*loc, i), depth + 1) for i, child in enumerate(item))
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"the key {key!r} appears twice in one object: keep one")
        obj[key] = value
    return obj


def loads_json(text: str | bytes) -> Any:
    """JSON as the Studio reads it, from an API body or a page's JSON box: NaN, Infinity and numbers
    too large for a float are refused (no JSON column can store them), and so is a key given twice in
    one object (only the last would count). Raises ValueError with the reason (json.JSONDecodeError,
    with its line and column, for a syntax error)."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def json_body(request: HttpRequest) -> bytes:
    """The body of a request the API reads as JSON. A multipart form is a 415: it is no JSON, and
    once parsed as a form its bytes cannot be read again (parse_body answers a url-encoded one alike)."""
    if request.content_type == "multipart/form-data":
        raise UnsupportedMediaType("The API takes a JSON body, not a form.",
                                   [Finding("Content-Type", "send the body as JSON, with Content-Type: application/json")])
    return request.body


def parse_body(request: HttpRequest, schema: type[S]) -> S:
    """Parse the JSON body into `schema`, or raise a 400 naming each bad field."""
    try:
        raw = loads_json(json_body(request) or b"{}")
    except ValueError as exc:
        if request.content_type == "application/x-www-form-urlencoded" and b"=" in request.body:  # curl -d 'name=x' sends a form
            raise UnsupportedMediaType("The request body is a form, not JSON.", [Finding("Content-Type", "send a JSON object with Content-Type: application/json, e.g. curl -H 'content-type: application/json' -d '{\"name\": ...}'")]) from exc
        raise BadRequest("The request body is not valid JSON.", [Finding("body", f"send a JSON object ({str(exc)[:200]})")]) from exc
    if not isinstance(raw, dict):
        raise BadRequest("The request body must be a JSON object.", [Finding("body", "send a JSON object, e.g. {\"name\": ...}")])
    return validate_data(schema, raw)


def validate_data(schema: type[S], raw: dict[str, Any]) -> S:
    """`raw` checked as parse_body checks a body (storable, then `schema`), or a 400 naming each bad
    field: a page's form that does what an endpoint does validates its values here, the same way."""
    problem = unstorable(raw)
    if problem is not None:
        raise BadRequest("The request body has a value that cannot be stored.", [problem])
    try:
        return schema.model_validate(raw)
    except PydanticValidationError as exc:
        raise BadRequest("The request body has invalid fields.", findings_from_pydantic(exc.errors())) from exc


def body_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for an endpoint that parses its body with parse_body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema.model_json_schema(ref_template="#/components/schemas/{model}")}},
        }
    }


def actor(request: HttpRequest) -> Actor:
    return request.auth  # type: ignore[attr-defined, return-value]


def error_response(request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
    return api.create_response(request, body, status=status)


@api.exception_handler(ApiError)
def on_api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    response = error_response(request, exc.status, exc.body())
    for name, value in exc.headers().items():
        response[name] = value
    return response


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    findings = findings_from_pydantic(exc.errors, ninja=True)
    return error_response(request, 400, BadRequest("The request has invalid fields.", findings).body())


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(request, 401, Unauthorized().body())


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return error_response(request, exc.status_code, {"detail": str(exc), "errors": []})


@api.exception_handler(RequestDataTooBig)
def on_body_too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    """A JSON body over DATA_UPLOAD_MAX_MEMORY_SIZE: Django refuses to read it, which was a 500."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    size = request.META.get("CONTENT_LENGTH") or "?"
    error = PayloadTooLarge(f"The request body ({size} bytes) is over the {limit} bytes one request may carry; nothing of it was stored.", [
        Finding("body", f"send at most {limit} bytes: shorten the longest values, and put a file's content in the Data Hub "
                        "(POST /api/hub/repos/{name}/uploads sends it in chunks) rather than in a JSON body")])
    return error_response(request, 413, error.body())


@api.exception_handler(OperationalError)
def on_database_error(request: HttpRequest, exc: Error) -> HttpResponse:
    """SQLite still locked by other writers after the busy timeout, or a database the Studio cannot
    reach: a 503 to send again, not a 500. Any other database error is raised as it was."""
    unavailable = database_unavailable(exc)
    if unavailable is None:
        raise exc
    return on_api_error(request, unavailable)


api.add_exception_handler(InterfaceError, on_database_error)  # psycopg's "the connection is closed"


def on_not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, NotFound().body())


api.add_exception_handler(Http404, on_not_found)


def register_routers() -> None:
    from experiments.api import router as experiments_router
    from studio.health_api import router as health_router
    from studio.secrets_api import router as secrets_router
    from studio.webhooks_api import router as webhooks_router
    from training.api import router as runs_router
    from training.ingest import router as ingest_router

    api.add_router("/experiments", experiments_router)
    api.add_router("/training-runs", runs_router)
    api.add_router("/secrets", secrets_router)
    api.add_router("/webhooks", webhooks_router)
    api.add_router("/ingest", ingest_router)
    api.add_router("/hub", "datahub.api.router")
    api.add_router("/environments", "environments.api.router")
    api.add_router("/health", health_router)


register_routers()
