"""The one small Protocol every reranker provider implements, and its errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

# How a provider's numbers are to be read. Declared per provider, never guessed
# from a batch: "probability" is used as it is, "logit" goes through a sigmoid.
Scale = Literal["logit", "probability"]


class ProviderError(Exception):
    """A member could not serve a window; ``reason`` is a short label for logs and decisions."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ProviderUnavailable(ProviderError):
    """Timeout, connection error, HTTP error: the member did not answer usefully."""


class UnusableResponse(ProviderError):
    """The member answered, but with something that cannot be trusted as a ranking."""


class ProviderStartError(ProviderError):
    """The member could not initialise (missing model, bad URL); retried on a later window."""


@dataclass(frozen=True)
class ScoreRequest:
    query: str
    documents: Sequence[str]
    stream_id: str = ""
    window: int = -1
    tenant: str | None = None
    #: The chain profile the stream asked for (StreamSpec.chain); None for the whole chain.
    chain: str | None = None


@runtime_checkable
class Provider(Protocol):
    kind: str
    #: None for an explicit passthrough (rrf): it keeps fusion order and scores nothing.
    scale: Scale | None

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        """One score per document in input order; None marks a document a valid subset omitted.

        ``deadline`` is a ``time.monotonic()`` instant the call must not outlive.
        """
        ...

    def close(self) -> None: ...
