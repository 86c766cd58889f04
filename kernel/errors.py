"""Errors a caller can catch. Each names what was wrong, never a secret value."""

from __future__ import annotations

from kernel.masking import mask_url

__all__ = ["mask_url"]  # re-exported: the errors' own masking, and their callers'


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
        super().__init__(f"idempotency_key {key!r} already opened a stream with a different query or candidates")


class WindowFailed(RerankqError):
    """Raised by a pull that asked to raise on a failed window."""

    def __init__(self, stream_id: str, window: int, reason: str) -> None:
        self.stream_id = stream_id
        self.window = window
        self.reason = reason
        super().__init__(f"stream {stream_id} window {window} failed: {reason}")


class NotScoredInTime(RerankqError, TimeoutError):
    """A caller that needs the rows now (a framework's reranker) waited its timeout and the page
    is still short: the windows are queued or being scored, and asking again later reads them."""

    def __init__(self, stream_id: str, timeout_s: float, pending_windows: int) -> None:
        self.stream_id = stream_id
        self.timeout_s = timeout_s
        self.pending_windows = pending_windows
        super().__init__(
            f"stream {stream_id} was not scored within {timeout_s:g} s ({pending_windows} window(s) still "
            "queued or being scored; is a worker running on its device queue?)"
        )


class StoreError(RerankqError):
    """Redis could not do what was asked; the message says what to do about it.

    ``problem`` is what went wrong, naming the URL tried (``url``, its password masked);
    ``advice`` what a caller of the library can do. ``stream_written`` says what is known of
    the stream: True (it exists), False (nothing was written), or None (unknown: the
    connection broke while a write was in flight, or the call only read and never reached
    it). ``retry_safe`` says whether calling again can neither open a second job nor pay a
    provider twice.
    """

    def __init__(
        self,
        message: str,
        *,
        stream_id: str | None = None,
        stream_written: bool | None,
        retry_safe: bool,
        url: str | None = None,
        advice: str | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.stream_written = stream_written
        self.retry_safe = retry_safe
        self.url = mask_url(url) if url is not None else None
        #: What went wrong without the URL: for an answer to someone who must not learn it (the gateway's callers).
        self.reason = message
        self.problem = message if self.url is None else f"{message} at {self.url}"
        self.advice = advice
        super().__init__(self.problem if not advice else f"{self.problem}; {advice}")


class TooShallow(ValidationError):
    """The over-fetch rule: too few candidates for the ``keep`` asked. ``message_for`` words the
    opt-out as the caller's interface spells it (``allow_shallow=True``, ``--allow-shallow``)."""

    def __init__(
        self,
        *,
        n_candidates: int,
        keep: int,
        needed: int,
        rule: str,
        dropped: int = 0,
        opt_out: str = "allow_shallow=True",
    ) -> None:
        self.n_candidates = n_candidates
        self.rule = rule
        self.keep = keep
        self.needed = needed
        self.dropped = dropped
        super().__init__("keep", self.message_for(opt_out))

    def message_for(self, opt_out: str) -> str:
        after_budget = f" ({self.dropped} removed by the candidate budget)" if self.dropped else ""
        return (
            f"reranking {self.n_candidates} candidates{after_budget} to keep {self.keep} is too shallow: "
            f"retrieve at least {self.rule} = {self.needed}. The reranker cannot promote what "
            "retrieval did not return, and a shallow set still improves precision, so the lost recall "
            f"would go unnoticed. Pass {opt_out} if you know the set is complete."
        )


class StoreFull(StoreError):
    """Redis refuses writes: it reached ``maxmemory`` (with ``noeviction``, nothing is evicted)."""


class StoreUnavailable(StoreError):
    """Redis could not be reached, timed out, or went away mid-call."""


class UnsupportedRedis(RerankqError):
    """The server is older than the oldest Redis rerankq runs on."""
