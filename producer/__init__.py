"""rerankq producer: the light client a pipeline imports to enqueue and read rerank jobs."""

from producer.client import RerankClient
from producer.errors import (
    ConfigError,
    IdempotencyConflict,
    RerankqError,
    StoreError,
    StoreFull,
    StoreUnavailable,
    StreamCorrupted,
    StreamNotFound,
    UnsupportedRedis,
    ValidationError,
    WindowFailed,
)
from producer.options import StreamOptions
from producer.settings import Settings, load_settings
from producer.wire import (
    Boosts,
    Candidate,
    Decision,
    Failed,
    Filtered,
    Omitted,
    Page,
    Ranked,
    Row,
    StreamProgress,
    StreamSpec,
    StreamStatus,
    TimeRange,
    WindowResult,
    WindowStatus,
)

__all__ = [
    "Boosts", "Candidate", "ConfigError", "Decision", "Failed", "Filtered", "IdempotencyConflict",
    "Omitted", "Page", "Ranked", "RerankClient", "RerankqError", "Row", "Settings", "StreamNotFound",
    "StoreError", "StoreFull", "StoreUnavailable", "StreamCorrupted", "StreamOptions", "StreamProgress",
    "StreamSpec", "StreamStatus",
    "UnsupportedRedis", "TimeRange", "ValidationError", "WindowFailed", "WindowResult",
    "WindowStatus", "load_settings",
]
