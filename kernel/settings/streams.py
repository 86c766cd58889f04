"""What one stream may hold and how long it lives: window sizes, filters, input limits, TTL."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel import stream_defaults
from kernel.settings.types import PositiveInt, Probability, StreamTtl, doc


class StreamSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    window_size: Annotated[PositiveInt, doc("default window size (a stream may ask for its own)")] = 25
    max_window_size: Annotated[PositiveInt, doc("the largest window a stream may ask for")] = 256
    min_score: Annotated[Probability | None, doc("default filter on the base score (a stream may override)")] = None
    min_final_score: Annotated[float | None, doc("default filter on the boosted score (a stream may override)")] = None
    stream_ttl_s: Annotated[StreamTtl, doc("every key of a stream expires this long after open")] = (
        stream_defaults.STREAM_TTL_S
    )
    max_candidates: Annotated[PositiveInt, doc("candidates per stream")] = 1000
    max_query_chars: Annotated[PositiveInt, doc("query length limit (code points)")] = 2048
    max_text_chars: Annotated[PositiveInt, doc("candidate text length limit (code points)")] = 65536
    document_budget: Annotated[PositiveInt, doc("code points of assembled text sent to a provider")] = (
        stream_defaults.DOCUMENT_BUDGET
    )
    max_window_passage_tokens: Annotated[
        PositiveInt,
        doc(
            "a passages stream whose window could send more tokens (window_size x max_passages x "
            "passage_tokens) is refused at open"
        ),
    ] = 1_048_576
    # The guarantees' memory bound per stream is derived from this one.
    max_stream_bytes: Annotated[
        PositiveInt, doc("bound on one stream's candidate payload in Redis (msgpack bytes)")
    ] = 32 * 1024 * 1024
    event_log_maxlen: Annotated[PositiveInt, doc("entries kept in a stream's event log")] = 1000
