"""What can go wrong with a request, said once; each API renders it in its own error shape.

A route raises ``Problem(kind, message, field=...)``; the Cohere routes answer
``{"message": ...}``, the TEI route ``{"error", "error_type"}``, the stream API
``{"error": {"type", "message", "field"}}``, each with the status codes its API uses for that
kind (``producer.gateway.cohere``, ``.tei``, ``.streams``). Messages are built from our own
words and the caller's own input, never from a secret or a server's answer.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from kernel.errors import ValidationError
from kernel.field_errors import from_msgspec
from producer.nesting import too_deep_field
from producer.validation import MAX_NESTING_DEPTH

Kind = Literal[
    "invalid",  # a field is wrong (named)
    "empty",  # no documents to rerank
    "too_many",  # more documents than a request may carry
    "too_large",  # the body is over the byte limit
    "malformed",  # the body is not JSON
    "unauthenticated",  # no key, or a key we do not know
    "forbidden",  # the key may not use this device or chain
    "not_found",  # no such stream (or not this tenant's)
    "conflict",  # an idempotency key reused for another job
    "overloaded",  # the device queue's backlog is over its bound (Retry-After)
    "failed",  # every chain member failed on a window
    "timeout",  # the windows did not commit in time (the stream id rides along)
    "unserved",  # no live worker consumes the device queue: not now (Retry-After)
    "unavailable",  # Redis is full or unreachable
]


class Problem(Exception):
    def __init__(
        self,
        kind: Kind,
        message: str,
        *,
        field: str | None = None,
        stream_id: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        self.kind = kind
        self.message = message
        self.field = field
        self.stream_id = stream_id
        self.retry_after_s = retry_after_s
        super().__init__(f"{kind}: {message}")

    @classmethod
    def from_validation(cls, error: ValidationError, kind: Kind = "invalid") -> Problem:
        return cls(kind, f"{error.field}: {error.message}" if error.field else error.message, field=error.field)

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.stream_id:
            headers[STREAM_HEADER] = self.stream_id
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers


#: Every answer about a stream names it here, so a caller who timed out can fetch it later.
STREAM_HEADER = "X-Rerankq-Stream-Id"


def decode(body: bytes, type_: type) -> object:
    """A JSON body as ``type_``; a wrong field is ``invalid`` naming its path (an unknown one
    with the field it is close to), broken JSON ``malformed``."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        known = getattr(type_, "__struct_fields__", ())
        raise Problem.from_validation(from_msgspec(exc, known=known)) from None
    except msgspec.DecodeError as exc:
        raise Problem("malformed", f"the body is not valid JSON ({exc})") from None
    except RecursionError:
        field = too_deep_field(body)
        where = field or "the body"
        raise Problem("invalid", f"{where}: is nested more than {MAX_NESTING_DEPTH} levels deep", field=field) from None
