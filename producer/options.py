"""Every option of a stream, said once: ``StreamOptions``.

``RerankClient.open(query, candidates, **options)`` validates its keyword arguments through
this struct; the gateway's ``POST /v1/streams`` body is this struct plus the query and the
candidates (and its OpenAPI schema is generated from it); a ``rerankq submit`` job line embeds
its fields, and submit's flags are generated from it. Each field's type and ``Meta`` are its
limits and its one documentation, so a new option is added here and nowhere else.

Every option defaults to ``None``, meaning "not given": the deployment's setting or the stated
default applies. That is what lets the surfaces layer (a submit flag under a job line's own
value, a gateway route's default device under the body's) without telling a default from a
choice. Limits that depend on the settings (``window_size`` up to ``RERANKQ_MAX_WINDOW_SIZE``,
``document_budget`` up to ``RERANKQ_MAX_TEXT_CHARS``) are checked after conversion, by
``producer.validation.check_spec``, naming the field.
"""

# No ``from __future__ import annotations`` here: the routes reuse these aliases as real types.
import datetime as dt
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from kernel import stream_defaults
from kernel.field_errors import NOT_BLANK_PATTERN, TOKEN_PATTERN
from kernel.limits import MAX_PASSAGES, MAX_STAGES, MIN_PASSAGE_TOKENS
from kernel.settings.types import Probability, StreamTtl
from kernel.wire import Boosts, BudgetLevel, Device, Lane, LongDocuments, PassageAggregate, PassageCut, TimeRange

F = TypeVar("F", bound=Callable[..., Any])

#: An instruction rides in every pair sent to a model: a few sentences, not a document.
MAX_INSTRUCTION_CHARS = 2000

Token = Annotated[str, Meta(pattern=TOKEN_PATTERN)]

#: The ``instruction`` option's type, reused as is by the Cohere and TEI routes' own field.
InstructionOption = Annotated[
    Annotated[str, Meta(min_length=1, max_length=MAX_INSTRUCTION_CHARS, pattern=NOT_BLANK_PATTERN)] | None,
    Meta(
        description="what the model is asked to do, sent with every pair of the stream to a member that takes "
        "one (its prompt); a window served by a member that cannot names it in "
        f"instruction_ignored_by; up to {MAX_INSTRUCTION_CHARS} characters  [default: none]"
    ),
]


class StageOption(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One stage of a cascade, as a caller gives it (``stages``)."""

    chain: Annotated[
        Token | None, Meta(description="the chain profile that scores the stage  [default: the whole chain]")
    ] = None
    keep: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="how many of the previous stage's best it reads (the first stage: of the fused list, as "
            "max_rerank_candidates caps it); required after the first"
        ),
    ] = None
    window_size: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(description="a later stage's window, at most RERANKQ_MAX_WINDOW_SIZE  [default: keep, up to that]"),
    ] = None
    max_pairs: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(description="a later stage sends at most this many pairs (a passage each, in a passages stream)"),
    ] = None
    max_tokens: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(description="a later stage sends at most about this many tokens (as a window's cost counts them)"),
    ] = None
    max_seconds: Annotated[
        Annotated[float, Meta(gt=0, le=86400)] | None,
        Meta(
            description="a later stage's window that begins this long after the stage was handed its rows is not scored"
        ),
    ] = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The options of one stream (``RerankClient.open``'s keyword arguments)."""

    window_size: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="candidates per window, the batch a worker scores at once; at most RERANKQ_MAX_WINDOW_SIZE  "
            "[default: RERANKQ_WINDOW_SIZE]"
        ),
    ] = None
    first_windows: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="windows admitted and sent when the stream opens; deeper ones are admitted when a pull needs "
            "them  [default: 1]"
        ),
    ] = None
    device: Annotated[
        Device | None,
        Meta(
            description="the device queue that scores the stream: cpu, gpu, or any (whichever worker is free)  "
            "[default: cpu]"
        ),
    ] = None
    min_score: Annotated[
        Probability | None,
        Meta(
            description="a row whose normalised score is below this is filtered: kept, but not paged  "
            "[default: RERANKQ_MIN_SCORE]"
        ),
    ] = None
    min_final_score: Annotated[
        float | None,
        Meta(
            description="a row whose final (boosted) score is below this is filtered; a finite number  "
            "[default: RERANKQ_MIN_FINAL_SCORE]"
        ),
    ] = None
    chain: Annotated[
        Token | None,
        Meta(
            description="a chain profile (RERANKQ_CHAIN_<NAME>, configured where the stream is opened) that "
            "scores the stream instead of the whole chain  [default: the whole chain]"
        ),
    ] = None
    tenant: Annotated[
        Token | None,
        Meta(description="the tenant the stream belongs to; pair-score caches are per tenant  [default: none]"),
    ] = None
    boosts: Annotated[
        Boosts | None,
        Meta(
            description="recency, temporal and proof boosts that multiply the score: recency_alpha, temporal_alpha, "
            "proof_alpha, recency_curve (linear, exponential, none), recency_window_days, recency_floor, "
            "recency_half_life_days, temporal_decay_days  [default: 0.2, 0.2, 0.1, linear, 365, 0.1, "
            "90, 30]"
        ),
    ] = None
    reference_time: Annotated[
        dt.datetime | None,
        Meta(description="the time ages are measured from, RFC 3339 (without an offset it is UTC)  [default: now]"),
    ] = None
    query_range: Annotated[
        TimeRange | None,
        Meta(description="the period the query is about (start, end), for the temporal boost  [default: none]"),
    ] = None
    ttl_s: Annotated[
        StreamTtl | None,
        Meta(description="seconds the stream and its decisions are kept in Redis  [default: RERANKQ_STREAM_TTL_S]"),
    ] = None
    idempotency_key: Annotated[
        Token | None,
        Meta(
            description="the job's own key: opening the same job with it again returns the same stream and sends "
            "nothing; another job with it is refused  [default: a new stream each time]"
        ),
    ] = None
    budget: Annotated[
        BudgetLevel | None,
        Meta(
            description="the candidate budget's level: low, mid or high picks "
            "RERANKQ_MAX_RERANK_CANDIDATES_LOW/_MID/_HIGH  [default: RERANKQ_MAX_RERANK_CANDIDATES]"
        ),
    ] = None
    keep: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="rows the reader keeps: a set smaller than max(25, 4 x keep) after the budget is refused "
            "unless allow_shallow  [default: no over-fetch check]"
        ),
    ] = None
    allow_shallow: Annotated[
        bool | None, Meta(description="accept a set smaller than the over-fetch rule asks for keep  [default: false]")
    ] = None
    max_rerank_candidates: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="the candidate budget's cap: at most this many candidates are reranked  "
            "[default: RERANKQ_MAX_RERANK_CANDIDATES, or the budget level's]"
        ),
    ] = None
    max_candidates_per_source: Annotated[
        Annotated[int, Meta(ge=0)] | None,
        Meta(
            description="at most this many candidates of each source, applied before the cap; 0 for no limit  "
            "[default: RERANKQ_MAX_CANDIDATES_PER_SOURCE]"
        ),
    ] = None
    strategy_boosts: Annotated[
        str | dict[str, str] | None,
        Meta(
            description="source:level pairs (graph:high,bm25:low, or a mapping) that decide who survives the cap and "
            "nudge the order after scoring  [default: RERANKQ_STRATEGY_BOOSTS]"
        ),
    ] = None
    document_budget: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="code points of each assembled document that are scored and returned; at most "
            "RERANKQ_MAX_TEXT_CHARS  [default: RERANKQ_DOCUMENT_BUDGET]"
        ),
    ] = None
    lane: Annotated[
        Lane | None,
        Meta(
            description="interactive or batch: a batch stream's windows wait behind every interactive window of "
            "their device queue; a retried open keeps the lane it was first opened with  "
            "[default: interactive]"
        ),
    ] = None
    instruction: InstructionOption = None
    long_documents: Annotated[
        LongDocuments | None,
        Meta(
            description="a document longer than the member reads: excerpt (the part around the first query-term "
            "match, cut to document_budget) or passages (split into passages on the model's token "
            "boundaries, each scored with the document's header; the best passage's span is kept)  "
            "[default: excerpt]"
        ),
    ] = None
    passage_tokens: Annotated[
        Annotated[int, Meta(ge=MIN_PASSAGE_TOKENS)] | None,
        Meta(
            description="tokens of a document's text per passage, in the tokenizer of the chain's first in-process "
            "member  [default: that member's max_length less the query, the header and special tokens; "
            "512 for a chain of remote members]"
        ),
    ] = None
    passage_stride: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(
            description="tokens from one passage's start to the next's; at most passage_tokens  "
            "[default: half of passage_tokens]"
        ),
    ] = None
    passage_cut: Annotated[
        PassageCut | None,
        Meta(
            description="where passages are cut: structure (at the document's blank lines and headings, a long "
            "paragraph at its sentences, short neighbours merged; token windows only for text without a break) "
            "or tokens (fixed windows of passage_tokens, passage_stride apart)  [default: structure]"
        ),
    ] = None
    passage_aggregate: Annotated[
        PassageAggregate | None,
        Meta(
            description="a document's score from its passages' scores: max (the best passage), first (the first "
            "passage), sum_top_k (the sum of the best passage_top_k, divided by k), max_mean (a quarter the best "
            "passage, three quarters the mean of all)  [default: max]"
        ),
    ] = None
    passage_top_k: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_PASSAGES)] | None,
        Meta(description=f"k of passage_aggregate=sum_top_k  [default: {stream_defaults.PASSAGE_TOP_K}]"),
    ] = None
    max_passages: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_PASSAGES)] | None,
        Meta(
            description=f"passages per document at most (passage_cut=structure fills them until they cover the "
            f"document, else the first ones are kept); at most {MAX_PASSAGES}, and "
            "window_size x max_passages x passage_tokens at most RERANKQ_MAX_WINDOW_PASSAGE_TOKENS  "
            f"[default: {stream_defaults.MAX_PASSAGES}]"
        ),
    ] = None
    first_stage_weight: Annotated[
        Annotated[float, Meta(ge=0.0, le=1.0)] | None,
        Meta(
            description="the first stage's part in the order: final_score is ((1 - w) x score + w x the score of "
            "the candidate's place in the fused list, 1.0 first to 0.1 last) times the boosts; min_score still "
            "reads the member's score  [default: the weight rerankq calibrate fitted for the serving member in "
            "RERANKQ_CALIBRATION, else 0]"
        ),
    ] = None

    stages: Annotated[
        Annotated[list[StageOption], Meta(min_length=1, max_length=MAX_STAGES)] | str | None,
        Meta(
            description="a cascade, first stage to last, each {chain, keep, window_size, max_pairs, max_tokens, "
            "max_seconds}: the first scores the stream's windows with its chain; each later one re-reads the "
            "previous stage's best keep rows once they are known, in its own windows, and its budgets cap what it "
            "spends (past one, the rest keeps the previous stage's order and the stream says so); text form "
            f"chain:keep,chain:keep; at most {MAX_STAGES} stages, not with chain  [default: one stage]"
        ),
    ] = None


#: Option names, in declaration order.
OPTION_NAMES: tuple[str, ...] = StreamOptions.__struct_fields__


def option_types(options: type[StreamOptions] = StreamOptions) -> dict[str, Any]:
    """Each option's type with its ``Meta`` (``Annotated``), for the surfaces generated from it."""
    return typing.get_type_hints(options, include_extras=True)


def description(annotation: Any) -> str:
    """The ``Meta`` description of an option's type."""
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, Meta) and meta.description:
            return meta.description
    return ""


def given(options: StreamOptions) -> dict[str, Any]:
    """The options that were given (not None), as keyword arguments."""
    return {name: value for name in options.__struct_fields__ if (value := getattr(options, name)) is not None}


def takes_stream_options(function: F) -> F:
    """Marks ``function(..., **options)`` as taking ``StreamOptions``: ``help()`` and
    ``inspect.signature`` show every option as a keyword-only parameter, typed as the struct
    types it (``None`` meaning "not given"), and its docstring lists each with its description."""
    hints = typing.get_type_hints(StreamOptions)
    head = inspect.signature(function)
    parameters = [p for p in head.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hints[name])
        for name in StreamOptions.__struct_fields__
    ]
    vars(function)["__signature__"] = head.replace(parameters=parameters)
    indent = " " * 8
    function.__doc__ = (function.__doc__ or "").rstrip(" ") + options_help(indent + "    ") + indent
    return function


def options_help(indent: str, options: type[StreamOptions] = StreamOptions) -> str:
    """Every option with its description, a line each: the ``Options`` section of ``open``'s docstring."""
    return "".join(f"{indent}{name}: {description(annotation)}\n" for name, annotation in option_types(options).items())
