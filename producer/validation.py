"""Input checks that run before anything is written. Each error names its field."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from producer.errors import ValidationError
from producer.settings import Settings
from producer.wire import Candidate, StreamSpec, encode

# Generated stream ids are "s_" + 32 hex; caller keys become "k_" + key. Both are
# plain tokens, so neither can reach into another stream's key space.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_STREAM_ID_RE = re.compile(r"^(s_[0-9a-f]{32}|k_[A-Za-z0-9_.\-]{1,64})$")
MAX_ID_CHARS = 256
MAX_TTL_S = 7 * 24 * 3600
MAX_EMBEDDING_DIMS = 8192


def check_idempotency_key(key: str) -> str:
    if not isinstance(key, str) or not _TOKEN_RE.match(key):
        raise ValidationError("idempotency_key", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return key


def check_stream_id(stream_id: str) -> str:
    if not isinstance(stream_id, str) or not _STREAM_ID_RE.match(stream_id):
        raise ValidationError("stream_id", "is not a rerankq stream id")
    return stream_id


def _field_path(prefix: str, exc: msgspec.ValidationError) -> ValidationError:
    text = str(exc)
    match = re.search(r" - at `\$(.*)`$", text)
    path = match.group(1) if match else ""
    return ValidationError(prefix + path, text.split(" - at ")[0])


def to_candidates(candidates: Iterable[Candidate | Mapping[str, Any]]) -> list[Candidate]:
    if isinstance(candidates, (str, bytes, Mapping)) or not isinstance(candidates, Iterable):
        raise ValidationError("candidates", f"must be a list of candidates, got {type(candidates).__name__}")
    items = list(candidates)
    # Candidate instances go through msgspec too: a struct built in Python is not type-checked.
    try:
        return msgspec.convert(
            [msgspec.structs.asdict(c) if isinstance(c, Candidate) else c for c in items],
            list[Candidate],
        )
    except msgspec.ValidationError as exc:
        raise _field_path("candidates", exc) from None


def _finite(field: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ValidationError(field, f"must be a finite number, got {value!r}")


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.timezone.utc)


def check_candidates(candidates: list[Candidate], settings: Settings) -> list[Candidate]:
    """Validate and normalise (naive datetimes are UTC). Returns new structs."""
    if not candidates:
        raise ValidationError("candidates", "must not be empty")
    if len(candidates) > settings.max_candidates:
        raise ValidationError(
            "candidates", f"{len(candidates)} exceeds the limit of {settings.max_candidates} per stream"
        )
    seen: set[str] = set()
    dims: int | None = None
    out: list[Candidate] = []
    for i, c in enumerate(candidates):
        at = f"candidates[{i}]"
        if not c.id:
            raise ValidationError(f"{at}.id", "must not be empty")
        if len(c.id) > MAX_ID_CHARS:
            raise ValidationError(f"{at}.id", f"longer than {MAX_ID_CHARS} characters")
        if c.id in seen:
            raise ValidationError(f"{at}.id", f"duplicate candidate id {c.id!r}")
        seen.add(c.id)
        for name in ("text", "context"):
            value = getattr(c, name)
            if value is not None and len(value) > settings.max_text_chars:
                raise ValidationError(
                    f"{at}.{name}", f"{len(value)} characters exceeds the limit of {settings.max_text_chars}"
                )
        if sum(len(h) for h in c.heading_path) > settings.max_text_chars:
            raise ValidationError(f"{at}.heading_path", f"exceeds the limit of {settings.max_text_chars} characters")
        _finite(f"{at}.fusion_score", c.fusion_score)
        if c.proof_count is not None and not 0 <= c.proof_count < 2**63:
            raise ValidationError(f"{at}.proof_count", "must be a non-negative 64-bit integer")
        if c.metadata:
            # Stored as msgpack: it must encode (integers within 64 bits) and stay small.
            try:
                size = len(encode(c.metadata))
            except (OverflowError, TypeError, msgspec.EncodeError) as exc:
                raise ValidationError(f"{at}.metadata", f"cannot be stored: {exc}") from None
            if size > settings.max_text_chars:
                raise ValidationError(f"{at}.metadata", f"{size} bytes encoded exceeds the limit of {settings.max_text_chars}")
        if c.embedding is not None:
            if not c.embedding:
                raise ValidationError(f"{at}.embedding", "must not be empty")
            if len(c.embedding) > MAX_EMBEDDING_DIMS:
                raise ValidationError(f"{at}.embedding", f"more than {MAX_EMBEDDING_DIMS} dimensions")
            if dims is None:
                dims = len(c.embedding)
            elif len(c.embedding) != dims:
                raise ValidationError(f"{at}.embedding", f"has {len(c.embedding)} dimensions, expected {dims}")
            if not all(math.isfinite(x) for x in c.embedding):
                raise ValidationError(f"{at}.embedding", "must hold finite numbers only")
        out.append(
            msgspec.structs.replace(
                c,
                occurred_start=_utc(c.occurred_start),
                occurred_end=_utc(c.occurred_end),
                mentioned_at=_utc(c.mentioned_at),
            )
        )
    # The per-field limits bound each candidate; this bounds the stream (its memory in Redis).
    size = sum(len(encode(c)) for c in out)
    if size > settings.max_stream_bytes:
        raise ValidationError("candidates", f"{size} bytes encoded exceeds the limit of {settings.max_stream_bytes} "
                                            "per stream (RERANKQ_MAX_STREAM_BYTES)")
    return out


def check_spec(spec: StreamSpec, settings: Settings) -> StreamSpec:
    # A struct built from a caller's keyword arguments is not type-checked: run it through
    # msgspec so a wrong type is a ValidationError naming the field, not a TypeError later.
    try:
        spec = msgspec.convert(msgspec.structs.asdict(spec), StreamSpec)
    except msgspec.ValidationError as exc:
        error = _field_path("", exc)
        raise ValidationError(error.field.lstrip(".") or "spec", error.message) from None
    if not spec.query or not spec.query.strip():
        raise ValidationError("query", "must not be empty")
    if len(spec.query) > settings.max_query_chars:
        raise ValidationError("query", f"{len(spec.query)} characters exceeds the limit of {settings.max_query_chars}")
    if not 1 <= spec.window_size <= settings.max_window_size:
        raise ValidationError("window_size", f"must be between 1 and {settings.max_window_size}, got {spec.window_size}")
    for name in ("min_score", "min_final_score"):
        _finite(name, getattr(spec, name))
    if spec.min_score is not None and not 0.0 <= spec.min_score <= 1.0:
        raise ValidationError("min_score", "must be within [0, 1]: it applies to normalised scores")
    if not 1 <= spec.ttl_s <= MAX_TTL_S:
        raise ValidationError("ttl_s", f"must be between 1 and {MAX_TTL_S} seconds")
    if not 1 <= spec.document_budget <= settings.max_text_chars:
        raise ValidationError("document_budget", f"must be between 1 and {settings.max_text_chars}")
    for name in msgspec.structs.fields(spec.boosts):
        value = getattr(spec.boosts, name.name)
        if isinstance(value, float):
            _finite(f"boosts.{name.name}", value)
            if value < 0:
                raise ValidationError(f"boosts.{name.name}", "must not be negative")
    for name in ("recency_window_days", "recency_half_life_days", "temporal_decay_days"):
        if getattr(spec.boosts, name) <= 0:
            raise ValidationError(f"boosts.{name}", "must be positive")
    # An alpha above 1 would let a secondary signal swing a score by more than +/-50%:
    # boosts are meant to reorder close neighbours, not to outvote relevance.
    for name in ("recency_alpha", "temporal_alpha", "proof_alpha", "recency_floor"):
        if getattr(spec.boosts, name) > 1.0:
            raise ValidationError(f"boosts.{name}", f"must be within [0, 1], got {getattr(spec.boosts, name)}")
    if spec.query_range is not None and spec.query_range.start > spec.query_range.end:
        raise ValidationError("query_range", "start is after end")
    if spec.tenant is not None and not _TOKEN_RE.match(spec.tenant):
        raise ValidationError("tenant", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    if spec.chain is not None and not _TOKEN_RE.match(spec.chain):
        raise ValidationError("chain", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return spec
