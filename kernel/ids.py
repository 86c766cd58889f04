"""The two ids a caller names a stream by, checked the same way at every door and in the worker.

Generated stream ids are ``s_`` + 32 hex; caller keys become ``k_`` + key. Both are plain tokens,
so neither can reach into another stream's key space. Always ``fullmatch``: ``$`` also matches
before a trailing newline.
"""

from __future__ import annotations

import re

from kernel.errors import ValidationError
from kernel.field_errors import TOKEN_PATTERN

_TOKEN_RE = re.compile(TOKEN_PATTERN)
_STREAM_ID_RE = re.compile(r"s_[0-9a-f]{32}|k_[A-Za-z0-9_.\-]{1,64}")


def check_idempotency_key(key: str) -> str:
    if not isinstance(key, str) or not _TOKEN_RE.fullmatch(key):
        raise ValidationError("idempotency_key", "must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return key


def check_stream_id(stream_id: str) -> str:
    if not isinstance(stream_id, str) or not _STREAM_ID_RE.fullmatch(stream_id):
        raise ValidationError("stream_id", "is not a rerankq stream id")
    return stream_id
