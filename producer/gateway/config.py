"""The gateway's own settings: ``RERANKQ_GATEWAY_*`` variables, then command-line overrides.

The queue's settings (Redis, namespace, device queues, limits) stay in
``producer.settings.Settings``; these are only what the HTTP side adds: where it listens,
where the API keys are, how long a synchronous call waits, and the request and backlog bounds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from producer.errors import ConfigError
from producer.field_errors import from_msgspec
from producer.settings import Settings

PREFIX = "RERANKQ_GATEWAY_"
Device = Literal["cpu", "gpu", "any"]


class GatewaySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8080
    #: uvicorn processes; each holds its own connections and thread pool.
    workers: int = 1
    #: API keys, hashed (``producer.gateway.auth``): a JSON file, or the same JSON inline.
    keys_file: str | None = None
    keys: str | None = None
    #: Serve without keys: every caller is one tenant-less principal. Must be asked for.
    insecure_no_auth: bool = False
    #: The device queue a request goes to when neither its key, route nor header chooses.
    device: Device = "cpu"
    #: How long a synchronous rerank waits for its windows before answering 504; a caller may
    #: ask for less or more (``X-Rerankq-Timeout``), up to ``max_timeout_s``.
    timeout_s: float = 30.0
    max_timeout_s: float = 300.0
    #: The longest long-poll of ``GET /v1/streams/{id}/page?wait=``.
    max_wait_s: float = 60.0
    #: Request bounds: documents per rerank call, code points per document (default: the
    #: queue's RERANKQ_MAX_TEXT_CHARS), bytes per request body.
    max_documents: int = 1000
    max_document_chars: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    #: Backpressure: windows waiting in the target device queue above which new work is
    #: refused with 429; the depth is sampled every drain_sample_s, and Retry-After comes
    #: from the drain rate those samples show, capped here.
    max_backlog: int = 5000
    max_retry_after_s: int = 60
    drain_sample_s: float = 0.5
    #: How long the streams a synchronous call opens are kept (so a repeat is answered from
    #: them); default: the queue's RERANKQ_STREAM_TTL_S.
    stream_ttl_s: int | None = None
    #: Threads for the blocking parts of a request (opening a stream, reading a status).
    threads: int = 32
    #: Redis connections this process's asyncio pool may open (every wait holds one while it
    #: blocks); a request that finds them all taken waits up to redis_pool_timeout_s for one
    #: instead of failing at once.
    redis_max_connections: int = 256
    redis_pool_timeout_s: float = 10.0
    #: Per tenant and process: open event streams (``GET /v1/streams/{id}/events``) and other
    #: requests in flight. Past its share a tenant gets 429 with Retry-After, so one tenant
    #: cannot hold the connections another needs (their sum stays under the Redis pool).
    tenant_max_streams: int = 32
    tenant_max_requests: int = 160
    #: An event stream with nothing to say sends a comment this often, so proxies keep it open.
    sse_heartbeat_s: float = 10.0
    #: A connection's request line and headers: at most this many bytes (431 past it), all of
    #: them within header_timeout_s of the connection opening or of its previous response (408).
    max_header_bytes: int = 32 * 1024
    header_timeout_s: float = 10.0
    #: An idle keep-alive connection is closed after this long.
    keep_alive_s: int = 5
    access_log: bool = False
    log_level: str = "INFO"

    def document_chars(self, settings: Settings) -> int:
        return min(self.max_document_chars or settings.max_text_chars, settings.max_text_chars)

    def documents(self, settings: Settings) -> int:
        return min(self.max_documents, settings.max_candidates)


def variable(field: str) -> str:
    return PREFIX + field.upper()


_POSITIVE = ("port", "workers", "timeout_s", "max_timeout_s", "max_wait_s", "max_documents", "max_body_bytes",
             "max_backlog", "max_retry_after_s", "drain_sample_s", "threads", "redis_max_connections",
             "redis_pool_timeout_s", "tenant_max_streams", "tenant_max_requests", "sse_heartbeat_s",
             "max_header_bytes", "header_timeout_s", "keep_alive_s")


def load_gateway_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> GatewaySettings:
    """Read ``RERANKQ_GATEWAY_*``; keyword overrides (the command line) win. A bad value names its variable."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    for field in GatewaySettings.__struct_fields__:
        value = environ.get(variable(field))
        if value is not None and value != "":
            raw[field] = value
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        gateway = msgspec.convert(raw, GatewaySettings, strict=False)
    except msgspec.ValidationError as exc:
        error = from_msgspec(exc)
        field = error.field.split(".", 1)[0].split("[", 1)[0]
        raise ConfigError(variable(field) if field else PREFIX + "*", error.message) from None
    for field in _POSITIVE:
        if getattr(gateway, field) <= 0:
            raise ConfigError(variable(field), f"must be positive, got {getattr(gateway, field)}")
    for field in ("max_document_chars", "stream_ttl_s"):
        value = getattr(gateway, field)
        if value is not None and value <= 0:
            raise ConfigError(variable(field), f"must be positive, got {value}")
    if gateway.timeout_s > gateway.max_timeout_s:
        raise ConfigError(variable("timeout_s"), f"exceeds RERANKQ_GATEWAY_MAX_TIMEOUT_S={gateway.max_timeout_s}")
    if gateway.tenant_max_streams + gateway.tenant_max_requests >= gateway.redis_max_connections:
        raise ConfigError(variable("redis_max_connections"),
                          f"must exceed RERANKQ_GATEWAY_TENANT_MAX_STREAMS + _TENANT_MAX_REQUESTS "
                          f"({gateway.tenant_max_streams + gateway.tenant_max_requests}), so one tenant "
                          "cannot take every connection")
    if gateway.keys_file and gateway.keys:
        raise ConfigError(variable("keys"), "give the keys in a file or in the variable, not both")
    return gateway
