"""Input checks that run before anything is written. Each error names its field."""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
import math
import numbers
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, overload

import msgspec

from kernel.blank_text import is_blank
from kernel.errors import ValidationError
from kernel.field_errors import child, from_msgspec, show
from kernel.ids import check_stream_id
from kernel.limits import MAX_EMBEDDING_DIMS, MAX_PASSAGES, MIN_PASSAGE_TOKENS
from kernel.passage_budget import text_tokens, window_tokens
from kernel.settings import Settings, chain_profile_variable
from kernel.settings.types import MAX_TTL_S
from kernel.strategy_boosts import parse_strategy_boosts
from kernel.wire import Boosts, Candidate, StreamSpec, TimeRange, encode
from producer.options import OPTION_NAMES, StreamOptions
from producer.stages import with_stages_read

MAX_ID_CHARS = 256
# How deep any argument may nest (a candidate's metadata, counted from metadata itself).
# Deeper input would end in a RecursionError in msgspec or in the encoder, not in an error.
MAX_NESTING_DEPTH = 32
# Lone surrogates come out of json.loads of real payloads (an escaped \ud800) and cannot be encoded as
# UTF-8, so they would fail at the first write or log line instead of here.
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# An id is a name that commands print, runs and logs carry a line each: no control character
# (ESC would drive the terminal that prints it, a newline would split a TREC line).
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
# What metadata (free data, stored as msgpack and handed back as it decodes) may hold.
_PLAIN_SCALARS = (
    type(None),
    bool,
    int,
    float,
    str,
    bytes,
    bytearray,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
)


# Where a value sits: a field name, or (parent, key). Formatted only for an error, since
# every candidate's every value is walked and most input is fine.
_At = str | tuple[Any, Any]
_PASSED = (int, float, bool, type(None))


def _format(at: _At) -> str:
    keys = []
    while isinstance(at, tuple):
        at, key = at
        keys.append(key)
    path = at
    for key in reversed(keys):
        path = child(path, key)
    return path


def _check_text(at: _At, text: str) -> None:
    if text.isascii():  # a flag CPython keeps on every str: no scan
        return
    found = _SURROGATE_RE.search(text)
    if found:
        raise ValidationError(
            _format(at),
            f"contains a lone surrogate U+{ord(found.group()):04X} at position "
            f"{found.start()}; text must be valid Unicode",
        )


def _plain(value: Any, at: _At, root: _At, depth: int = 0, free: bool = False) -> Any:
    """A copy of ``value`` with structs turned into dicts, so msgspec checks what is inside them.

    msgspec does not type-check a struct built in Python, and ``structs.asdict`` is
    shallow. Refuses lone surrogates (naming the path) and nesting past
    MAX_NESTING_DEPTH (naming ``root``, the field). ``free`` marks metadata, which holds
    any plain data rather than a declared type.
    """
    if type(value) in _PASSED:
        return value
    if isinstance(value, str):
        _check_text(at, value)
        return value
    # dict and list first: the ABC check for Mapping is slow, and they are nearly all we meet.
    if type(value) not in (dict, list) and not isinstance(
        value, (msgspec.Struct, Mapping, list, tuple, set, frozenset)
    ):
        if free and not isinstance(value, _PLAIN_SCALARS):
            raise ValidationError(
                _format(at),
                "must be plain data (strings, numbers, booleans, None, bytes, dates, "
                f"lists and mappings), got {type(value).__name__}",
            )
        return value
    if depth >= MAX_NESTING_DEPTH:
        raise ValidationError(_format(root), f"is nested more than {MAX_NESTING_DEPTH} levels deep")
    if isinstance(value, (list, tuple, set, frozenset)):
        # As lists: msgspec reads any of these as a list, and msgpack stores them as one.
        return [
            item
            if type(item) in _PASSED or (type(item) is str and item.isascii())
            else _plain(item, (at, i), root, depth + 1, free)
            for i, item in enumerate(value)
        ]
    pairs = (
        ((name, getattr(value, name)) for name in value.__struct_fields__)
        if isinstance(value, msgspec.Struct)
        else value.items()
    )
    out = {}
    for key, item in pairs:
        if isinstance(key, str):
            _check_text((at, key), key)
        elif free and (isinstance(key, bool) or not isinstance(key, (int, float))):
            raise ValidationError(
                _format((at, key)), f"a mapping key must be a string or a number, got {type(key).__name__}"
            )
        # Inlined for the common leaf: this walk runs over every value of every candidate.
        out[key] = (
            item
            if type(item) in _PASSED or (type(item) is str and item.isascii())
            else _plain(item, (at, key), root, depth + 1, free)
        )
    return out


def _plain_candidate(item: Any, at: _At) -> Any:
    """One candidate as a dict, each field walked on its own (metadata as free data)."""
    if type(item) is dict:
        for key, value in item.items():
            if not (
                type(key) is str
                and key.isascii()
                and (type(value) in _PASSED or (type(value) is str and value.isascii()))
            ):
                break
        else:
            return item  # the usual candidate: ASCII text and scalars, nothing to walk or copy
    elif not isinstance(item, (Candidate, Mapping)):
        return _plain(item, at, at)
    pairs = (
        ((name, getattr(item, name)) for name in item.__struct_fields__)
        if isinstance(item, Candidate)
        else item.items()
    )
    out = {}
    for key, value in pairs:
        if isinstance(key, str):
            _check_text((at, key), key)
        out[key] = (
            value
            if type(value) in _PASSED or (type(value) is str and value.isascii())
            else _plain(value, (at, key), (at, key), 0, key == "metadata")
        )
    return out


def to_candidates(candidates: Iterable[Candidate | Mapping[str, Any]]) -> list[Candidate]:
    if isinstance(candidates, (str, bytes, Mapping)) or not isinstance(candidates, Iterable):
        raise ValidationError("candidates", f"must be a list of candidates, got {type(candidates).__name__}")
    # Candidate instances go through msgspec too, as dicts: a struct built in Python is not type-checked.
    items = [_plain_candidate(item, ("candidates", i)) for i, item in enumerate(candidates)]
    try:
        return msgspec.convert(items, list[Candidate])
    except msgspec.ValidationError as exc:
        raise from_msgspec(exc, "candidates") from None


def _finite(field: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ValidationError(field, f"must be a finite number, got {value!r}")


@overload
def _utc(value: dt.datetime) -> dt.datetime: ...
@overload
def _utc(value: None) -> None: ...
def _utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.timezone.utc)


def check_candidates(candidates: list[Candidate], settings: Settings) -> list[Candidate]:
    """Validate and normalise (naive datetimes are UTC): a candidate that needs it is replaced
    by a new struct, the others are returned as they came (msgspec structs from ``to_candidates``)."""
    if not candidates:
        raise ValidationError("candidates", "must not be empty")
    if len(candidates) > settings.streams.max_candidates:
        raise ValidationError(
            "candidates", f"{len(candidates)} exceeds the limit of {settings.streams.max_candidates} per stream"
        )
    limit = settings.streams.max_text_chars
    seen: set[str] = set()
    dims: int | None = None
    out: list[Candidate] = []
    for i, c in enumerate(candidates):
        at = f"candidates[{i}]"
        _check_id(at, c.id, seen)
        _check_texts(at, c, limit)
        _finite(f"{at}.fusion_score", c.fusion_score)
        if c.proof_count is not None and not 0 <= c.proof_count < 2**63:
            raise ValidationError(f"{at}.proof_count", "must be a non-negative 64-bit integer")
        if c.metadata:
            _check_metadata(at, c.metadata, limit)
        if c.embedding is not None:
            dims = _check_embedding(at, c.embedding, dims)
        out.append(_in_utc(c))
    _check_stream_bytes(out, settings)
    return out


def _check_id(at: str, id_: str, seen: set[str]) -> None:
    """An id is present, short, printable and unique in the stream; it joins ``seen``."""
    if not id_:
        raise ValidationError(f"{at}.id", "must not be empty")
    if len(id_) > MAX_ID_CHARS:
        raise ValidationError(f"{at}.id", f"longer than {MAX_ID_CHARS} characters")
    control = _CONTROL_RE.search(id_)
    if control:
        raise ValidationError(
            f"{at}.id",
            f"contains the control character U+{ord(control.group()):04X} at position {control.start()}; "
            "an id is a name: printable characters only",
        )
    if id_ in seen:
        raise ValidationError(f"{at}.id", f"duplicate candidate id {id_!r}")
    seen.add(id_)


def _check_texts(at: str, c: Candidate, limit: int) -> None:
    for name in ("text", "context"):
        value = getattr(c, name)
        if value is not None and len(value) > limit:
            raise ValidationError(f"{at}.{name}", f"{len(value)} characters exceeds the limit of {limit}")
    if sum(len(h) for h in c.heading_path) > limit:
        raise ValidationError(f"{at}.heading_path", f"exceeds the limit of {limit} characters")


def _check_metadata(at: str, metadata: dict[str, Any], limit: int) -> None:
    # Stored as msgpack: it must encode (integers within 64 bits) and stay small.
    try:
        size = len(encode(metadata))
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise ValidationError(f"{at}.metadata", f"cannot be stored: {exc}") from None
    if size > limit:
        raise ValidationError(f"{at}.metadata", f"{size} bytes encoded exceeds the limit of {limit}")


def _check_embedding(at: str, embedding: list[float], dims: int | None) -> int:
    """A usable embedding with as many dimensions as the stream's others (``dims``; None for the first)."""
    if not embedding:
        raise ValidationError(f"{at}.embedding", "must not be empty")
    if len(embedding) > MAX_EMBEDDING_DIMS:
        raise ValidationError(f"{at}.embedding", f"more than {MAX_EMBEDDING_DIMS} dimensions")
    if dims is not None and len(embedding) != dims:
        raise ValidationError(f"{at}.embedding", f"has {len(embedding)} dimensions, expected {dims}")
    if not all(math.isfinite(x) for x in embedding):
        raise ValidationError(f"{at}.embedding", "must hold finite numbers only")
    return len(embedding)


def _in_utc(c: Candidate) -> Candidate:
    """``c`` itself, or a copy whose naive datetimes are UTC."""
    if not any(t is not None and t.tzinfo is None for t in (c.occurred_start, c.occurred_end, c.mentioned_at)):
        return c
    return msgspec.structs.replace(
        c,
        occurred_start=_utc(c.occurred_start),
        occurred_end=_utc(c.occurred_end),
        mentioned_at=_utc(c.mentioned_at),
    )


def _check_stream_bytes(candidates: list[Candidate], settings: Settings) -> None:
    # The per-field limits bound each candidate; this bounds the stream (its memory in Redis).
    size = sum(len(encode(c)) for c in candidates)
    if size > settings.streams.max_stream_bytes:
        raise ValidationError(
            "candidates",
            f"{size} bytes encoded exceeds the limit of {settings.streams.max_stream_bytes} "
            "per stream (RERANKQ_MAX_STREAM_BYTES)",
        )


def check_spec(spec: StreamSpec, settings: Settings) -> StreamSpec:
    """``spec`` type-checked, its naive datetimes made UTC, every field within the deployment's limits."""
    spec = _typed_spec(spec)
    _check_query(spec, settings)
    _check_chain(spec, settings)
    _check_stream_fields(spec, settings)
    check_passages(spec, settings)
    _check_boosts(spec.boosts)
    if spec.query_range is not None and spec.query_range.start > spec.query_range.end:
        raise ValidationError("query_range", "start is after end")
    return spec


def _typed_spec(spec: StreamSpec) -> StreamSpec:
    # A struct built from a caller's keyword arguments is not type-checked: run it through
    # msgspec so a wrong type is a ValidationError naming the field, not a TypeError later.
    # Nested structs (boosts, query_range) are walked into dicts too, so their fields are checked.
    fields = {name: _plain(getattr(spec, name), name, name) for name in spec.__struct_fields__}
    try:
        spec = msgspec.convert(fields, StreamSpec)
    except msgspec.ValidationError as exc:
        error = from_msgspec(exc)
        raise ValidationError(error.field or "spec", error.message) from None
    # Naive datetimes are UTC, as for candidates; a range mixing both could not even be compared.
    query_range = spec.query_range
    if query_range is not None:
        query_range = TimeRange(start=_utc(query_range.start), end=_utc(query_range.end))
    return msgspec.structs.replace(spec, reference_time=_utc(spec.reference_time), query_range=query_range)


def _check_query(spec: StreamSpec, settings: Settings) -> None:
    if is_blank(spec.query):
        raise ValidationError("query", "must not be empty or blank (white space, control or format characters only)")
    if len(spec.query) > settings.streams.max_query_chars:
        raise ValidationError(
            "query", f"{len(spec.query)} characters exceeds the limit of {settings.streams.max_query_chars}"
        )


def _check_chain(spec: StreamSpec, settings: Settings) -> None:
    named = [("chain", spec.chain)]
    named += [(f"stages[{i}].chain", stage.chain) for i, stage in enumerate(spec.later_stages, start=1)]
    for field, chain in named:
        if chain is not None and chain.lower() not in settings.chain.profiles:
            # Refused here, not failed in the worker: a profile exists to keep a stream's data away
            # from some members, so an unknown one is never widened to the whole chain either.
            configured = ", ".join(sorted(settings.chain.profiles)) or "none"
            raise ValidationError(
                field,
                f"{chain!r} names no chain profile (configured: {configured}); "
                f"set {chain_profile_variable(chain)} where streams are opened and where workers run",
            )


def _check_stream_fields(spec: StreamSpec, settings: Settings) -> None:
    """The window, the score filters, the TTL and the document budget."""
    sizes = [("window_size", spec.window_size)]
    sizes += [(f"stages[{i}].window_size", s.window_size) for i, s in enumerate(spec.later_stages, start=1)]
    for field, size in sizes:
        if not 1 <= size <= settings.streams.max_window_size:
            raise ValidationError(field, f"must be between 1 and {settings.streams.max_window_size}, got {size}")
    for name in ("min_score", "min_final_score"):
        _finite(name, getattr(spec, name))
    if spec.min_score is not None and not 0.0 <= spec.min_score <= 1.0:
        raise ValidationError("min_score", "must be within [0, 1]: it applies to normalised scores")
    if not 1 <= spec.ttl_s <= MAX_TTL_S:
        raise ValidationError("ttl_s", f"must be between 1 and {MAX_TTL_S} seconds")
    if not 1 <= spec.document_budget <= settings.streams.max_text_chars:
        raise ValidationError("document_budget", f"must be between 1 and {settings.streams.max_text_chars}")


def _check_boosts(boosts: Boosts) -> None:
    # __struct_fields__, not structs.fields(): that evaluates the class's annotations on every
    # call (0.4 ms, a tenth of an open of 25 candidates).
    for name in boosts.__struct_fields__:
        value = getattr(boosts, name)
        if isinstance(value, float):
            _finite(f"boosts.{name}", value)
            if value < 0:
                raise ValidationError(f"boosts.{name}", "must not be negative")
    for name in ("recency_window_days", "recency_half_life_days", "temporal_decay_days"):
        if getattr(boosts, name) <= 0:
            raise ValidationError(f"boosts.{name}", "must be positive")
    # An alpha above 1 would let a secondary signal swing a score by more than +/-50%:
    # boosts are meant to reorder close neighbours, not to outvote relevance.
    for name in ("recency_alpha", "temporal_alpha", "proof_alpha", "recency_floor"):
        if getattr(boosts, name) > 1.0:
            raise ValidationError(f"boosts.{name}", f"must be within [0, 1], got {getattr(boosts, name)}")


def check_passages(spec: StreamSpec, settings: Settings) -> None:
    """A passages stream's cost is bounded at open: passages per document, and the tokens a
    window can send, each passage's header included (``kernel.passage_budget``), so no window
    can ask a worker or a member for more than the deployment allows."""
    if spec.passage_tokens is not None and spec.passage_tokens < MIN_PASSAGE_TOKENS:
        raise ValidationError("passage_tokens", f"must be at least {MIN_PASSAGE_TOKENS}, got {spec.passage_tokens}")
    if spec.passage_stride is not None:
        if spec.passage_stride < 1:
            raise ValidationError("passage_stride", f"must be at least 1, got {spec.passage_stride}")
        # A stride past the passage length would leave text between passages that no pair reads.
        if spec.passage_stride > text_tokens(spec):
            raise ValidationError(
                "passage_stride",
                f"{spec.passage_stride} is longer than passage_tokens "
                f"({text_tokens(spec)}): text "
                "between passages would never be read",
            )
    if not 1 <= spec.max_passages <= MAX_PASSAGES:
        raise ValidationError("max_passages", f"must be between 1 and {MAX_PASSAGES}, got {spec.max_passages}")
    if not 1 <= spec.passage_top_k <= MAX_PASSAGES:
        raise ValidationError("passage_top_k", f"must be between 1 and {MAX_PASSAGES}, got {spec.passage_top_k}")
    if spec.long_documents != "passages":
        return
    tokens = text_tokens(spec)
    window = window_tokens(spec)
    if window > settings.streams.max_window_passage_tokens:
        raise ValidationError(
            "max_passages",
            f"window_size {spec.window_size} x max_passages {spec.max_passages} "
            f"x (passage_tokens {tokens} + a header of up to {tokens}) is {window} tokens a window, over "
            "RERANKQ_MAX_WINDOW_PASSAGE_TOKENS "
            f"({settings.streams.max_window_passage_tokens})"
            "; lower one of them",
        )


def _is_integer(value: Any) -> bool:
    # bool is an int to Python, never to a caller: True would reach Redis as 1.
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(options: Mapping[str, Any]) -> StreamOptions:
    """``open()``'s keyword arguments as ``StreamOptions``: each value walked, then converted.

    The walk comes first, so nothing later can meet a lone surrogate or recurse past
    MAX_NESTING_DEPTH (even an error message's repr would), and structs built in Python
    (``Boosts``, ``TimeRange``) become dicts, so msgspec type-checks what is inside them.
    """
    unknown = [name for name in options if name not in OPTION_NAMES]
    if unknown:
        close = difflib.get_close_matches(unknown[0], OPTION_NAMES, n=1)
        raise ValidationError(
            unknown[0], "is not an option of open()" + (f"; did you mean {close[0]}?" if close else "")
        )
    plain = {name: _plain(value, name, name) for name, value in options.items()}
    try:
        chosen = msgspec.convert(plain, StreamOptions)
    except msgspec.ValidationError as exc:
        raise from_msgspec(exc) from None
    # What a type cannot state: a finite number, the text forms of strategy boosts and of stages,
    # and how a cascade's stages fit together.
    _finite("min_final_score", chosen.min_final_score)
    parse_strategy_boosts(chosen.strategy_boosts)
    return with_stages_read(chosen)


def check_query(query: Any) -> str:
    _plain(query, "query", "query")
    if not isinstance(query, str):
        raise ValidationError("query", f"must be a string, got {type(query).__name__}")
    return query


def check_pull_arguments(stream_id: Any, offset: Any, limit: Any, *, timeout: Any, raise_on_failed: Any) -> None:
    check_stream_id(stream_id)
    if not _is_integer(offset) or offset < 0:
        raise ValidationError("offset", "must be a non-negative integer")
    if not _is_integer(limit) or limit < 1:
        raise ValidationError("limit", "must be a positive integer")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or math.isnan(timeout) or timeout < 0:
        shown = show(timeout) if isinstance(timeout, numbers.Real) else type(timeout).__name__
        raise ValidationError("timeout", f"must be a number of seconds, 0 or more, got {shown}")
    if not isinstance(raise_on_failed, bool):
        raise ValidationError("raise_on_failed", f"must be True or False, got {type(raise_on_failed).__name__}")
