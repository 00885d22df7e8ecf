"""The one error shape of the API: {"detail": sentence, "errors": [{"field", "message"}]}."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    """One problem with an input: the dotted field path and what the user should do."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class ApiError(Exception):
    status = 400
    default_detail = "The request is not valid."

    def __init__(self, detail: str | None = None, errors: list[Finding] | None = None) -> None:
        self.detail = detail or self.default_detail
        self.errors = list(errors or [])
        super().__init__(self.detail)

    def body(self) -> dict:
        return {"detail": self.detail, "errors": [e.as_dict() for e in self.errors]}

    def headers(self) -> dict[str, str]:
        """Headers its answer carries besides the body (a 429's Retry-After)."""
        return {}


class BadRequest(ApiError):
    status = 400


# Where a signed-in user makes and revokes their own API tokens (studio/token_views.py); the 401s name it.
TOKENS_PAGE = "Settings → API tokens (/settings/api-tokens/)"


class Unauthorized(ApiError):
    status = 401
    default_detail = (f"Authentication required: send Authorization: Bearer <token> or log in. Make a token in {TOKENS_PAGE}, "
                      "or ask a Studio administrator for one.")


class PaymentRequired(ApiError):
    status = 402


class Forbidden(ApiError):
    status = 403
    default_detail = "You do not have permission to do this in this project."


class NotFound(ApiError):
    status = 404
    default_detail = "Not found."


class Conflict(ApiError):
    status = 409


class PayloadTooLarge(ApiError):
    """413: the body is over DATA_UPLOAD_MAX_MEMORY_SIZE; nothing of it was read or stored."""

    status = 413


class UnsupportedMediaType(ApiError):
    """A body the API cannot read as JSON: a multipart form."""

    status = 415


class Unprocessable(ApiError):
    status = 422
    default_detail = "The run cannot start until these problems are fixed."


class ServiceUnavailable(ApiError):
    """503: the request is fine but cannot be done now; send it again after Retry-After seconds."""

    status = 503

    def __init__(self, detail: str, errors: list[Finding], retry_after: int) -> None:
        super().__init__(detail, errors)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class InsufficientStorage(ApiError):
    """507: the Studio's own disk is full, so nothing could be stored (datahub.storage.disk_full)."""

    status = 507


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 run', '2 runs', '0 GPUs': a count with its noun, for messages people read."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def joined(names: list[str], word: str = "and") -> str:
    """'a', 'a and b', 'a, b and c' (or another `word`): names in a sentence people read."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"
