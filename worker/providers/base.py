"""The one small Protocol every reranker provider implements, and its errors."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kernel.settings import MemberSettings

# How a provider's numbers are to be read. Declared per provider, never guessed
# from a batch: "probability" is used as it is, "logit" goes through a sigmoid, and
# "cosine" (a similarity in [-1, 1], neither of the two) is clipped at 0
# (worker.scoring.decide.normalise says why). "rank" is no relevance at all: each number is
# the document's place in an order the member chose (0 first, a listwise member's), seeded
# onto [0.1, 1.0] as a passthrough window's fusion ranks are, and never filtered by a minimum
# score or read through a calibration map (worker.scoring.decide.rank_scores).
Scale = Literal["logit", "probability", "cosine", "rank"]


@dataclass(frozen=True)
class Remedy:
    """The member setting that would fix an error, for the operator reading the log.

    A provider does not know its place in the chain, so ``advice`` says ``{variable}`` where
    the chain puts the variable's name (``RERANKQ_RERANKER_1_URL``).
    """

    field: str
    advice: str

    def render(self, variable: str) -> str:
        # Not str.format: the advice may quote a URL, which may hold braces.
        return self.advice.replace("{variable}", variable)


class ProviderError(Exception):
    """A member could not serve a window; ``reason`` is a short label for logs and decisions.

    ``detail`` goes to the WARNING log line only, never into a committed window, and is
    built from our own words: it never quotes what a server sent back (that may echo the
    query, the documents or a key).
    """

    def __init__(self, reason: str, detail: str = "", *, remedy: Remedy | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.remedy = remedy
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ProviderUnavailable(ProviderError):
    """Timeout, connection error, HTTP error: the member did not answer usefully."""


class UnusableResponse(ProviderError):
    """The member answered, but with something that cannot be trusted as a ranking."""


class ProviderStartError(ProviderError):
    """The member could not initialise (missing model, bad URL); retried on a later window."""


class MemberConfigError(ProviderStartError):
    """A member setting is missing or wrong; ``field`` is the MemberSettings field.

    The chain turns the field into the member's variable name (``RERANKQ_RERANKER_1_URL``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__("config", f"{field}: {message}")


def check_device(member: MemberSettings) -> None:
    """A member's own device, checked without torch: what a worker can be asked to run on."""
    device = member.device
    if device is None:
        return
    if device == "mps" and not member.allow_mps:
        raise MemberConfigError("device", "mps is opt-in: set the member's ALLOW_MPS=true as well")
    if device not in ("cpu", "gpu", "cuda", "mps") and not re.fullmatch(r"cuda:[0-9]+", device):
        raise MemberConfigError("device", f"must be cpu, cuda, cuda:N or mps, got {device!r}")


@dataclass(frozen=True)
class ScoreRequest:
    query: str
    documents: Sequence[str]
    stream_id: str = ""
    window: int = -1
    tenant: str | None = None
    #: The chain profile the stream asked for (StreamSpec.chain); None for the whole chain.
    chain: str | None = None
    #: The stream's instruction (StreamSpec.instruction): the model's prompt, where it takes one.
    instruction: str | None = None


@runtime_checkable
class Provider(Protocol):
    """A reranker. Optionally it also declares, for the pair-score cache:

    - ``cache_identity: str``: everything besides the pair that changes its answer or how
      the answer is read (model, URL, scale, request options); two members with equal
      identities may share cached scores. Undeclared, the cache keys on all member settings
      that could matter.
    - ``answers_subsets: bool``: True when an answer depends on the whole window, not on each
      pair alone: it may leave documents out (``top_n``), or it ranks them against each other
      (``listwise``). The cache then keeps it per window.

    And, for instructions:

    - ``accepts_instruction: bool``: True when the model gets ``ScoreRequest.instruction``
      (its prompt, or the API's instruction field). Undeclared, False: the member says so once
      at start, and a window it serves for a stream with an instruction records that the
      instruction was not used (``WindowResult.instruction_ignored_by``).

    A provider that embeds documents (``embedding``) also has ``embed(documents, *, tenant)
    -> list[list[float]]``: the normalised embedding of each document (``tenant``: the
    window's), kept beside the decisions of a window it served so a reader can run MMR
    without sending embeddings.
    """

    kind: str

    # Read-only here: the wrappers (checked, metered, cached) answer with their inner provider's.
    @property
    def scale(self) -> Scale | None:
        """None for an explicit passthrough (rrf): it keeps fusion order and scores nothing."""
        ...

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        """One score per document in input order; None marks a document a valid subset omitted.

        ``deadline`` is a ``time.monotonic()`` instant the call must not outlive.
        """
        ...

    def close(self) -> None: ...


def accepts_instruction(provider: object) -> bool:
    """Whether a provider uses the stream's instruction; undeclared, it does not."""
    return getattr(provider, "accepts_instruction", False) is True


def cache_identity(kind: str, **parts: object) -> str:
    """A provider's ``cache_identity``: its kind and every setting that changes its answer."""
    return json.dumps({"provider": kind, **parts}, sort_keys=True, separators=(",", ":"))


#: Told of each retry a provider makes within one call: (reason, seconds it will wait, whether
#: the wait came from the server's ``Retry-After``). The metering layer sets it around a call,
#: so a provider reports retries without knowing its place in the chain or whether metrics are on.
retry_listener: ContextVar[Callable[[str, float, bool], None] | None] = ContextVar(
    "rerankq_retry_listener", default=None
)


def announce_retry(reason: str, wait_s: float, *, from_retry_after: bool) -> None:
    listener = retry_listener.get()
    if listener is not None:
        listener(reason, wait_s, from_retry_after)


#: Told of each repair a provider made to one answer it could still use (a listwise permutation
#: with ids out of range, repeated or missing, or none at all): the repair's name. Set by the
#: metering layer around a call, as ``retry_listener`` is.
repair_listener: ContextVar[Callable[[str], None] | None] = ContextVar("rerankq_repair_listener", default=None)


def announce_repair(repair: str) -> None:
    listener = repair_listener.get()
    if listener is not None:
        listener(repair)
