"""The wire contract: every struct that crosses Redis or reaches a reader.

Structs forbid unknown fields so a typo in a producer's payload is an error, not
a silently ignored setting. Decisions are a tagged union on ``kind``.
"""

from __future__ import annotations

import array
import datetime as dt
import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from kernel import stream_defaults
from kernel.windows import StageWindows, stage_of, stage_windows, window_count

Device = Literal["cpu", "gpu", "any"]
#: Which lane of its device queue a stream's windows wait in: a worker takes every waiting
#: interactive window before any batch one (``kernel.broker_queues``).
Lane = Literal["interactive", "batch"]
LANES: tuple[Lane, ...] = ("interactive", "batch")
BudgetLevel = Literal["low", "mid", "high"]
RecencyCurve = Literal["linear", "exponential", "none"]
#: How a document longer than the member reads is scored: cut around the first query-term
#: match (``excerpt``), or split into passages that are each scored (``passages``).
LongDocuments = Literal["excerpt", "passages"]
#: How a document's passage scores become its score: the best (MaxP), the first (FirstP), or
#: the sum of the best ``passage_top_k`` divided by k (so it stays a score in [0, 1]).
PassageAggregate = Literal["max", "first", "sum_top_k", "max_mean"]
#: Where passages are cut: at the document's blocks and sentences, or at fixed token windows.
PassageCut = Literal["structure", "tokens"]


# msgspec passes frozen down to subclasses; type checkers read it per class (dataclass_transform),
# so every subclass restates frozen=True.
class Base(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True, frozen=True):
    pass


class Candidate(Base, frozen=True):
    """One fused retrieval result. Input order is fusion order. Each field's description is
    the candidate table of docs/concepts.md (``python -m producer.reference``)."""

    id: Annotated[str, Meta(description="the candidate's id, unique in the stream; rows carry it back")]
    text: Annotated[
        str,
        Meta(description="what is scored; a blank one is never sent to a provider and sinks to its window's end"),
    ] = ""
    context: Annotated[
        str | None,
        Meta(description="a title or label scored with the text, as `{context}: {text}` (where a `title` goes)"),
    ] = None
    heading_path: Annotated[
        list[str],
        Meta(description="the section headings above the text, outermost first; scored joined by ` > `"),
    ] = []
    occurred_start: Annotated[
        dt.datetime | None,
        Meta(description="when what the text tells began (RFC 3339): the recency and temporal boosts' date"),
    ] = None
    occurred_end: Annotated[
        dt.datetime | None, Meta(description="when it ended; recency's date when neither other date is given")
    ] = None
    mentioned_at: Annotated[
        dt.datetime | None, Meta(description="when the text was written; recency's date without occurred_start")
    ] = None
    proof_count: Annotated[int | None, Meta(description="how many sources back it: the proof boost (1 is neutral)")] = (
        None
    )
    source: Annotated[
        str | None,
        Meta(description="the retrieval arm that found it (`bm25`, `graph`): the per-source cap and strategy boosts"),
    ] = None
    fusion_score: Annotated[
        float | None,
        Meta(description="the first stage's fused score (higher first): a first-stage blend reads it, else kept"),
    ] = None
    doc_id: Annotated[
        str | None, Meta(description="the document it is a part of: select(per_doc=...) caps rows per doc_id")
    ] = None
    embedding: Annotated[list[float] | None, Meta(description="its vector, for select(mmr_lambda=...) diversity")] = (
        None
    )
    metadata: Annotated[dict[str, Any], Meta(description="anything else, kept with the stream and never scored")] = {}


class Boosts(Base, frozen=True):
    """Multiplicative boost settings; each alpha scales a signal centred on 0.5."""

    recency_alpha: float = 0.2
    temporal_alpha: float = 0.2
    proof_alpha: float = 0.1
    recency_curve: RecencyCurve = "linear"
    recency_window_days: float = 365.0
    recency_floor: float = 0.1
    recency_half_life_days: float = 90.0
    temporal_decay_days: float = 30.0


class TimeRange(Base, frozen=True):
    start: dt.datetime
    end: dt.datetime


class Stage(Base, frozen=True):
    """A cascade's stage after the first: a chain profile that re-reads the previous stage's best
    ``keep`` rows, in windows of ``window_size``, once they are known. Its budgets cap what it
    spends; past one, the rest stays in the previous stage's order and the stream says so."""

    keep: int
    window_size: int
    chain: str | None = None
    #: Pairs it may send (a document, or each passage of a passages stream, is a pair).
    max_pairs: int | None = None
    #: Tokens it may send, counted as the fair share counts a window's (``kernel.cost``).
    max_tokens: int | None = None
    #: Seconds from the moment its windows are admitted: a window begun later is not scored.
    max_seconds: float | None = None


class StreamSpec(Base, frozen=True):
    """Everything a worker needs to score any window of one stream, fixed at open."""

    query: str
    window_size: int
    device: Device = "cpu"
    min_score: float | None = None
    min_final_score: float | None = None
    chain: str | None = None
    tenant: str | None = None
    boosts: Boosts = Boosts()
    reference_time: dt.datetime | None = None
    query_range: TimeRange | None = None
    strategy_boosts: dict[str, BudgetLevel] = {}
    document_budget: int = stream_defaults.DOCUMENT_BUDGET
    ttl_s: int = stream_defaults.STREAM_TTL_S
    n_candidates: int = 0
    # The stream's instruction: sentence-transformers' ``prompt`` for an instruction-aware
    # reranker, passed on to a remote member whose API takes one.
    instruction: str | None = None
    long_documents: LongDocuments = "excerpt"
    #: Tokens of the document's text per passage and between passage starts; None: derived
    #: by the worker from the member's max_length and the query's length.
    passage_tokens: int | None = None
    passage_stride: int | None = None
    passage_cut: PassageCut = "structure"
    passage_aggregate: PassageAggregate = "max"
    passage_top_k: int = stream_defaults.PASSAGE_TOP_K
    max_passages: int = stream_defaults.MAX_PASSAGES
    #: The first stage's part in the order (``worker.scoring.blend``); None: the calibration
    #: file's weight for the serving member, else none.
    first_stage_weight: float | None = None
    #: A cascade's stages after the first (the stream's own windows, scored by ``chain``).
    later_stages: list[Stage] = []

    def stage_windows(self) -> list[StageWindows]:
        """Where each stage's windows are (``kernel.windows``)."""
        return stage_windows(self.n_candidates, self.window_size, [(s.keep, s.window_size) for s in self.later_stages])

    def stage_of(self, window: int) -> tuple[StageWindows, Stage | None]:
        """The stage holding ``window``, and its ``Stage`` (None for the first stage). A window
        past every stage's slots is the caller's error: the store refuses it first."""
        found = stage_of(self.stage_windows(), window)
        if found is None:
            raise ValueError(f"window {window} is in no stage of the stream")
        return found, self.later_stages[found.number - 2] if found.number > 1 else None


# -- decisions ---------------------------------------------------------------


class PassageSpan(Base, frozen=True):
    """Where in a candidate's ``text`` the passage that decided its score is: ``text[start:end]``
    (code points), and that passage's normalised score."""

    start: int
    end: int
    score: float
    #: Where reading stopped, when ``max_passages`` passages, each as long as the member reads,
    #: did not reach the end of the text: ``text[unread_from:]`` was not scored. None: all of it was.
    unread_from: int | None = None


class Ranked(Base, tag="ranked", tag_field="kind", frozen=True):
    """``score`` is the serving member's normalised score, or, when ``calibrated``, the
    probability that the document is relevant that the member's map gives it; ``raw_score``
    then keeps the member's own (normalised) score."""

    id: str
    index: int
    document: str
    score: float
    final_score: float
    served_by: str
    raw_score: float | None = None
    calibrated: bool = False
    #: A passages stream's best passage; None for an excerpt stream.
    passage: PassageSpan | None = None
    #: Where the first stage was blended in: its score of the candidate's place, and its weight;
    #: ``final_score`` is then ``((1 - w) * score + w * first_stage)`` times the boosts.
    first_stage: float | None = None
    first_stage_weight: float | None = None


class Filtered(Base, tag="filtered", tag_field="kind", frozen=True):
    """Below a min score; the scores are kept so a caller can see how close it was."""

    id: str
    index: int
    document: str
    score: float
    final_score: float
    served_by: str
    reason: str
    raw_score: float | None = None
    calibrated: bool = False
    passage: PassageSpan | None = None
    first_stage: float | None = None
    first_stage_weight: float | None = None


class Omitted(Base, tag="omitted", tag_field="kind", frozen=True):
    """The provider returned a valid subset that left this candidate out."""

    id: str
    index: int
    document: str
    served_by: str


class Failed(Base, tag="failed", tag_field="kind", frozen=True):
    """Every chain member failed and none fails open; kept in fusion order."""

    id: str
    index: int
    document: str
    reason: str


class Cancelled(Base, tag="cancelled", tag_field="kind", frozen=True):
    """The stream was cancelled (``RerankClient.cancel``) before this candidate's window was
    scored; kept in fusion order, with its text as ``document``, and never scored after."""

    id: str
    index: int
    document: str
    reason: str = "cancelled"


Decision = Ranked | Filtered | Omitted | Failed | Cancelled


class WindowResult(Base, frozen=True):
    """A committed window: its decisions in final order. Never rewritten."""

    window: int
    start: int
    end: int
    served_by: str | None
    passthrough: bool
    attempts: int
    committed_at: float
    decisions: list[Decision]
    failovers: list[str] = []
    reason: str | None = None
    #: When the attempt that committed began (``time.time()`` on the worker): the time from
    #: it to ``committed_at`` is the window's scoring, the time before it the queue's.
    began_at: float | None = None
    #: The member that served the window without the stream's instruction, because it cannot
    #: use one (its API has no such field, or it is configured without one); None otherwise.
    instruction_ignored_by: str | None = None
    #: The cascade stage the window belongs to. A later stage's ``start`` and ``end`` are
    #: places in what that stage reads, not candidate indexes (its decisions carry those).
    stage: int = 1
    #: The serving member answered places, not relevance (a listwise member): its scores are
    #: those places seeded onto [0.1, 1.0], comparable within the window only.
    scored_by_place: bool = False


class WindowEmbeddings(Base, frozen=True):
    """The embeddings a window's scored documents got from the member that served it (an
    ``embedding`` member), kept beside the window's decisions so ``select(mmr_lambda=...)``
    works for callers who sent none. Written in the same commit as the decisions."""

    window: int
    served_by: str
    dims: int
    #: Stream-wide candidate indexes, in the order of ``vectors``.
    indexes: list[int]
    #: float32, little-endian: ``len(indexes) * dims`` values, 4 bytes each.
    vectors: bytes

    def unpack(self) -> dict[int, list[float]]:
        """Each candidate index's embedding; a blob of the wrong size is an error, not a guess."""
        if self.dims <= 0 or len(self.vectors) != 4 * self.dims * len(self.indexes):
            raise ValueError(
                f"window {self.window}: {len(self.vectors)} bytes for {len(self.indexes)} "
                f"embeddings of {self.dims} dimensions"
            )
        values = array.array("f")
        values.frombytes(self.vectors)
        if sys.byteorder == "big":
            values.byteswap()
        return {index: values[k * self.dims : (k + 1) * self.dims].tolist() for k, index in enumerate(self.indexes)}


def pack_embeddings(window: int, served_by: str, indexes: list[int], vectors: list[list[float]]) -> WindowEmbeddings:
    """Embeddings as ``WindowEmbeddings``: float32, so MiniLM's 384 dimensions take 1.5 KiB each."""
    dims = len(vectors[0]) if vectors else 0
    if len(indexes) != len(vectors) or any(len(v) != dims for v in vectors):
        raise ValueError("one embedding per index, all of one dimension")
    values = array.array("f", (x for v in vectors for x in v))
    if sys.byteorder == "big":
        values.byteswap()
    return WindowEmbeddings(
        window=window, served_by=served_by, dims=dims, indexes=list(indexes), vectors=values.tobytes()
    )


# -- what readers get --------------------------------------------------------


class Row(Base, frozen=True):
    rank: int
    window: int
    decision: Decision
    #: The cascade stage whose decision this is: the last stage that read the candidate and
    #: scored it (a later stage's window that failed, or was past its budget, leaves the
    #: earlier stage's decision).
    stage: int = 1

    @property
    def id(self) -> str:
        return self.decision.id

    @property
    def kind(self) -> str:
        return type(self.decision).__struct_config__.tag  # type: ignore[return-value]

    @property
    def score(self) -> float | None:
        return getattr(self.decision, "score", None)

    @property
    def final_score(self) -> float | None:
        return getattr(self.decision, "final_score", None)

    @property
    def served_by(self) -> str | None:
        return getattr(self.decision, "served_by", None)

    @property
    def raw_score(self) -> float | None:
        """The member's own score, when ``score`` is a calibrated one."""
        return getattr(self.decision, "raw_score", None)

    @property
    def calibrated(self) -> bool:
        return bool(getattr(self.decision, "calibrated", False))

    @property
    def reason(self) -> str | None:
        """Why the row is failed, cancelled (or filtered); None for a ranked row."""
        return getattr(self.decision, "reason", None)

    @property
    def passage(self) -> PassageSpan | None:
        """The best passage of a passages stream's row (its span in the text, its score)."""
        return getattr(self.decision, "passage", None)


class StageStatus(Base, frozen=True):
    """How far one stage of a cascade has come, and where it stopped short."""

    stage: int
    chain: str | None = None
    #: How many of the previous stage's best it reads; None for the first stage (all).
    keep: int | None = None
    #: How many it was handed (None until the stage before it showed its best ``keep``): fewer
    #: than ``keep`` when that stage showed fewer rows, or a budget stopped it (``stopped``).
    read: int | None = None
    windows: int = 0
    committed: int = 0
    #: The budget that stopped it short of ``keep``: ``max_pairs`` or ``max_tokens``.
    stopped: str | None = None
    #: Rows it read but left in the previous stage's order (its window failed, or began past
    #: ``max_seconds``), and why.
    fell_back: int = 0
    reasons: list[str] = []


class Page(Base, frozen=True):
    stream_id: str
    offset: int
    limit: int
    rows: list[Row]
    total: int
    complete: bool
    pending_windows: int = 0
    #: A cascade's stages, first to last (empty for a stream of one stage).
    stages: list[StageStatus] = []


WindowState = Literal["not_admitted", "admitted", "committed"]


class WindowStatus(Base, frozen=True):
    window: int
    start: int
    end: int
    state: WindowState
    attempts: int = 0
    served_by: str | None = None
    ranked: int = 0
    filtered: int = 0
    omitted: int = 0
    failed: int = 0
    cancelled: int = 0
    reason: str | None = None
    #: Members skipped on the way to the one that served, as ``"1:cohere: timeout"``.
    failovers: list[str] = []
    #: The serving member, when it could not use the stream's instruction (WindowResult's).
    instruction_ignored_by: str | None = None
    stage: int = 1


def committed_window_status(result: WindowResult) -> WindowStatus:
    """A committed window's status, counted from its decisions (the client's and the gateway's)."""
    kinds = [type(d) for d in result.decisions]
    return WindowStatus(
        window=result.window,
        start=result.start,
        end=result.end,
        state="committed",
        attempts=result.attempts,
        served_by=result.served_by,
        ranked=kinds.count(Ranked),
        filtered=kinds.count(Filtered),
        omitted=kinds.count(Omitted),
        failed=kinds.count(Failed),
        cancelled=kinds.count(Cancelled),
        reason=result.reason,
        failovers=list(result.failovers),
        instruction_ignored_by=result.instruction_ignored_by,
        stage=result.stage,
    )


class StreamStatus(Base, frozen=True):
    stream_id: str
    n_candidates: int
    window_size: int
    windows: list[WindowStatus]
    #: The device queue the stream's windows go to.
    device: Device | None = None
    #: A cascade's stages, first to last (empty for a stream of one stage).
    stages: list[StageStatus] = []


class StreamProgress(Base, frozen=True):
    """How far a stream has come, read from its meta alone (no results decoded)."""

    stream_id: str
    n_candidates: int
    window_size: int
    admitted: int
    committed: int
    #: Committed windows whose outcome was failed or poisoned.
    failed: int = 0
    #: Members skipped on the way, summed over the committed windows.
    failovers: int = 0
    lane: Lane = "interactive"
    #: A cascade's later-stage windows handed so far, and its later stages not yet handed.
    later_windows: int = 0
    unhanded_stages: int = 0

    @property
    def first_stage_windows(self) -> int:
        """The stream's own windows, over its candidates (a deeper pull admits them)."""
        return window_count(self.n_candidates, self.window_size)

    @property
    def n_windows(self) -> int:
        """The windows the stream commits, as far as its stages are known yet."""
        return self.first_stage_windows + self.later_windows

    @property
    def complete(self) -> bool:
        """Every window of the stream is committed, every stage of a cascade included."""
        return self.unhanded_stages == 0 and self.committed >= self.n_windows


# Encoders and decoders are built once; msgpack is what Redis holds.
_msgpack_encoder = msgspec.msgpack.Encoder()
candidate_decoder = msgspec.msgpack.Decoder(Candidate)
spec_decoder = msgspec.msgpack.Decoder(StreamSpec)
window_result_decoder = msgspec.msgpack.Decoder(WindowResult)
window_embeddings_decoder = msgspec.msgpack.Decoder(WindowEmbeddings)


def encode(value: Any) -> bytes:
    return _msgpack_encoder.encode(value)
