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
