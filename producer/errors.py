"""Errors a caller can catch. Each names what was wrong, never a secret value."""

from __future__ import annotations


class RerankqError(Exception):
    pass


class ValidationError(RerankqError, ValueError):
    """Bad input; ``field`` is the dotted path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ConfigError(RerankqError, ValueError):
    """A bad configuration value; ``variable`` is the environment variable."""

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        self.message = message
        super().__init__(f"{variable}: {message}")


class StreamNotFound(RerankqError, LookupError):
    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        super().__init__(f"stream {stream_id!r} does not exist or has expired")


class StreamCorrupted(RerankqError):
    """A stream's stored data cannot be decoded (a foreign write to its keys); other streams are unaffected."""

    def __init__(self, stream_id: str, detail: str) -> None:
        self.stream_id = stream_id
        super().__init__(f"stream {stream_id!r} holds data that cannot be decoded: {detail}")


class IdempotencyConflict(RerankqError):
    """An idempotency key was reused for a different job."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"idempotency_key {key!r} already opened a stream with a different query or candidates"
        )


class WindowFailed(RerankqError):
    """Raised by a pull that asked to raise on a failed window."""

    def __init__(self, stream_id: str, window: int, reason: str) -> None:
        self.stream_id = stream_id
        self.window = window
        self.reason = reason
        super().__init__(f"stream {stream_id} window {window} failed: {reason}")


class StoreError(RerankqError):
    """Redis could not do what was asked; the message says what to do about it.

    ``stream_written`` says whether the stream exists: True, False (nothing was written),
    or None (unknown: the connection broke while the write was in flight). ``retry_safe``
    says whether calling again can neither open a second job nor pay a provider twice.
    """

    def __init__(self, message: str, *, stream_id: str | None = None, stream_written: bool | None,
                 retry_safe: bool) -> None:
        self.stream_id = stream_id
        self.stream_written = stream_written
        self.retry_safe = retry_safe
        super().__init__(message)


class StoreFull(StoreError):
    """Redis refuses writes: it reached ``maxmemory`` (with ``noeviction``, nothing is evicted)."""


class StoreUnavailable(StoreError):
    """Redis could not be reached, timed out, or went away mid-call."""


class UnsupportedRedis(RerankqError):
    """The server is older than the oldest Redis rerankq runs on."""
