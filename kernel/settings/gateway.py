"""The HTTP gateway's own settings (``rerankq serve``): where it listens, its keys, its bounds.

The queue's settings (store, queues, stream limits) are the other sections; these are only
what the HTTP side adds. ``rerankq serve``'s options override them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

import msgspec

from kernel.settings.types import Port, PositiveInt, Seconds, StreamTtl, WholeSeconds, doc

if TYPE_CHECKING:
    from kernel.settings.streams import StreamSettings

Device = Literal["cpu", "gpu", "any"]


class GatewaySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = "GATEWAY_"

    host: Annotated[str, doc("address the gateway listens on")] = "127.0.0.1"
    port: Annotated[Port, doc("port the gateway listens on")] = 8080
    workers: Annotated[PositiveInt, doc("uvicorn processes; each holds its own connections and thread pool")] = 1
    keys_file: Annotated[str | None, doc("the API keys, hashed: a JSON file (rerankq serve keygen writes one)")] = None
    keys: Annotated[str | None, doc("the same JSON as the keys file, inline")] = None
    insecure_no_auth: Annotated[
        bool, doc("serve without keys: every caller is one tenant-less principal; must be asked for")
    ] = False
    device: Annotated[
        Device, doc("the device queue a request goes to when neither its key, route nor header chooses")
    ] = "cpu"
    timeout_s: Annotated[
        Seconds,
        doc(
            "how long a synchronous rerank waits for its windows before "
            "answering 504 (X-Rerankq-Timeout asks for another)"
        ),
    ] = 30.0
    max_timeout_s: Annotated[Seconds, doc("the longest wait a caller may ask for")] = 300.0
    max_wait_s: Annotated[Seconds, doc("the longest long-poll of GET /v1/streams/{id}/page?wait=")] = 60.0
    max_documents: Annotated[PositiveInt, doc("documents per rerank call")] = 1000
    max_document_chars: Annotated[
        PositiveInt | None, doc("code points per document (default: RERANKQ_MAX_TEXT_CHARS)")
    ] = None
    max_body_bytes: Annotated[PositiveInt, doc("bytes per request body")] = 8 * 1024 * 1024
    # The depth is sampled every drain_sample_s; Retry-After comes from the drain rate those
    # samples show, capped at max_retry_after_s.
    max_backlog: Annotated[
        PositiveInt, doc("windows waiting in the target device queue above which new work is refused with 429")
    ] = 5000
    max_retry_after_s: Annotated[WholeSeconds, doc("the cap on a 429's Retry-After")] = 60
    drain_sample_s: Annotated[Seconds, doc("how often the queue depth is sampled")] = 0.5
    stream_ttl_s: Annotated[
        StreamTtl | None,
        doc("how long the streams a synchronous call opens are kept (default: RERANKQ_STREAM_TTL_S)"),
    ] = None
    threads: Annotated[
        PositiveInt, doc("threads for the blocking parts of a request (opening a stream, reading a status)")
    ] = 32
    # Every wait holds a connection while it blocks.
    redis_max_connections: Annotated[PositiveInt, doc("Redis connections this process's asyncio pool may open")] = 256
    redis_pool_timeout_s: Annotated[
        Seconds,
        doc("how long a request that finds every connection taken waits for one, instead of failing at once"),
    ] = 10.0
    # Past its share a tenant gets 429 with Retry-After, so one tenant cannot hold the
    # connections another needs (their sum stays under the Redis pool).
    tenant_max_streams: Annotated[
        PositiveInt, doc("per tenant and process: open event streams (GET /v1/streams/{id}/events)")
    ] = 32
    tenant_max_requests: Annotated[PositiveInt, doc("per tenant and process: other requests in flight")] = 160
    sse_heartbeat_s: Annotated[
        Seconds, doc("an event stream with nothing to say sends a comment this often, so proxies keep it open")
    ] = 10.0
    max_header_bytes: Annotated[PositiveInt, doc("a connection's request line and headers, at most (431 past it)")] = (
        32 * 1024
    )
    header_timeout_s: Annotated[
        Seconds,
        doc("the headers must arrive within this long of the connection opening or of its previous response (408)"),
    ] = 10.0
    keep_alive_s: Annotated[WholeSeconds, doc("an idle keep-alive connection is closed after this long")] = 5
    access_log: Annotated[bool, doc("log every request (uvicorn's access log)")] = False
    log_level: Annotated[str, doc("the gateway's log level")] = "INFO"

    # The stream section, not the whole Settings: Settings holds this section, so taking it
    # here would tie the two modules in a circle.
    def document_chars(self, streams: StreamSettings) -> int:
        limit = streams.max_text_chars
        return min(self.max_document_chars or limit, limit)

    def documents(self, streams: StreamSettings) -> int:
        return min(self.max_documents, streams.max_candidates)
