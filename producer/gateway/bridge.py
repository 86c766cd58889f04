"""The gateway's way into the queue: ``RerankClient`` for writes, ``redis.asyncio`` for waits.

``RerankClient`` is blocking (redis-py, and kombu to send a window's message), so what it
does here runs in a bounded thread pool: opening a stream, admitting deeper windows, a
stream's status. Everything that waits — a synchronous call waiting for its windows, a
long-poll, an event stream — waits on the event loop instead, with ``XREAD BLOCK`` on the
stream's event log through ``redis.asyncio``, so a thousand callers waiting hold a thousand
sockets, not a thousand threads. Reads use the store's own key layout and snapshot parsing
(``Store.queue_snapshot`` / ``parse_snapshot``), so a page is built exactly as ``pull``
builds it (``producer.pages.build_page``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
import redis
import redis.asyncio

from kernel.consumers import CACHE_S
from kernel.errors import IdempotencyConflict, StoreError, StreamNotFound, ValidationError
from kernel.ids import check_stream_id
from kernel.logs import get_logger
from kernel.store import BLOCK_CHUNK_S, PROGRESS_FIELDS, Snapshot, Store, parse_progress
from kernel.wire import (
    Page,
    StreamStatus,
    committed_window_status,
    spec_decoder,
    window_result_decoder,
)
from producer.client import RerankClient
from producer.gateway.auth import Principal
from producer.gateway.config import GatewaySettings
from producer.gateway.jobs import RerankJob, Scored, failure, scored
from producer.gateway.limits import Backlog, CountingDispatcher
from producer.gateway.problems import Problem
from producer.pages import build_page

log = get_logger("rerankq.gateway")
T = TypeVar("T")

#: How many retained streams a synchronous call may step past (each failed, or conflicting).
MAX_GENERATIONS = 4
#: Up to this many windows a synchronous call counts commits on the event log, far below
#: the log's length cap (RERANKQ_EVENT_LOG_MAXLEN), so no commit can have been trimmed away.
FRESH_WAIT_MAX_WINDOWS = 64
#: A client told no worker serves the queue waits this long: the producer's view of the
#: consumers registry is that old at most (``kernel.consumers.CACHE_S``), so a worker started
#: meanwhile is seen by the retry.
UNSERVED_RETRY_AFTER_S = int(CACHE_S)
#: How many answered jobs a gateway process remembers for the repeat fast path.
ANSWERED_MEMORY = 10_000
#: A blocking read that ends this close to a heartbeat's time counts as reaching it (its
#: timeout is whole milliseconds, rounded down).
HEARTBEAT_SLACK_S = 0.005
# The store's client is made without decode_responses, so replies are bytes; redis-py's types say
# bytes | str, and a RESP3 map for XREAD (cannot know either), hence the casts on decoded replies.
#: XREAD of one stream: [(stream, [(entry id, fields), ...])].
_XReadReply = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]


def async_redis(url: str, config: GatewaySettings) -> redis.asyncio.Redis:
    """An asyncio client with the store's socket bounds (above the longest blocking read), for
    every deployment shape (``kernel.redis_clients``), its pool bounded as ``config`` says."""
    from kernel.redis_clients import async_store_client

    client: redis.asyncio.Redis = async_store_client(
        url, max_connections=config.redis_max_connections, pool_timeout_s=config.redis_pool_timeout_s
    )
    return client


class QueueBridge:
    def __init__(
        self,
        client: RerankClient,
        store_redis: redis.asyncio.Redis,
        backlog: Backlog,
        *,
        threads: int,
        heartbeat_s: float,
    ) -> None:
        self.client = client
        assert isinstance(client.dispatcher, CountingDispatcher)
        self.dispatcher = client.dispatcher
        self.store: Store = client.store
        self.redis = store_redis
        self.backlog = backlog
        #: An event stream sends a comment this often while nothing commits.
        self.heartbeat_s = heartbeat_s
        # A plain executor: its hand-off costs less than anyio's worker threads (25 against
        # 39 µs per call, measured here under uvloop), and its size bounds the threads.
        #: Jobs this process answered lately (first key -> stream), so a repeat reads its stream at once.
        self._answered: OrderedDict[str, str] = OrderedDict()
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rerankq-gateway")

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, partial(fn, *args, **kwargs))

    def close(self) -> None:
        self.executor.shutdown(wait=True)

    # -- reads, on the event loop ---------------------------------------------

    async def snapshot(self, stream_id: str) -> Snapshot:
        pipe = self.redis.pipeline(transaction=False)
        self.store.queue_snapshot(pipe, stream_id)
        return Store.parse_snapshot(stream_id, await pipe.execute())

    async def wait_for_event(self, stream_id: str, after: bytes, timeout_s: float) -> bool:
        """Until a commit after ``after`` or ``timeout_s`` (in chunks, as ``Store.wait_for_commit``)."""
        block_ms = max(1, int(min(timeout_s, BLOCK_CHUNK_S) * 1000))
        reply = await self.redis.xread({self.store.keys.stream(stream_id).events: after}, count=1, block=block_ms)
        return bool(reply)

    async def wait_complete(self, stream_id: str, deadline: float) -> Snapshot:
        while True:
            snapshot = await self.snapshot(stream_id)
            if len(snapshot.results) >= snapshot.n_windows:
                return snapshot
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                committed = len(snapshot.results)
                unserved = await self.blocking(self.client.unserved_warning, snapshot.device)
                if unserved is not None:
                    raise Problem(
                        "timeout",
                        f"the reranking did not finish in time ({committed} of "
                        f"{snapshot.n_windows} windows committed): {unserved}. Once one "
                        f"runs, read GET /v1/streams/{stream_id}/page",
                        stream_id=stream_id,
                    )
                raise Problem(
                    "timeout",
                    f"the reranking did not finish in time ({committed} of {snapshot.n_windows} "
                    f"windows committed); it goes on: repeat the request, or read "
                    f"GET /v1/streams/{stream_id}/page",
                    stream_id=stream_id,
                )
            await self.wait_for_event(stream_id, snapshot.last_event_id, remaining)

    async def wait_commits(self, stream_id: str, n_windows: int, deadline: float) -> Snapshot | None:
        """The stream's snapshot once its event log holds ``n_windows`` commits (one per window:
        commits are exactly-once), counted from the log's start, so a stream just opened needs
        no read before its wait; None at the deadline (``wait_complete`` then decides).

        The snapshot's reads ride in the same pipeline as the blocking ``XREAD``: Redis runs
        a connection's commands in order, so they run the moment the last commit wakes it,
        and the answer costs one round trip after the commit instead of two."""
        events = self.store.keys.stream(stream_id).events
        last, seen = b"0-0", 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            pipe = self.redis.pipeline(transaction=False)
            pipe.xread({events: last}, count=n_windows, block=max(1, int(min(remaining, BLOCK_CHUNK_S) * 1000)))
            self.store.queue_snapshot(pipe, stream_id)
            reply, *reads = await pipe.execute()
            if reply:
                entries = reply[0][1]
                seen += len(entries)
                last = entries[-1][0]
            if seen >= n_windows:
                snapshot = Store.parse_snapshot(stream_id, reads)
                if len(snapshot.results) >= snapshot.n_windows:
                    return snapshot

    # -- a synchronous rerank -------------------------------------------------

    async def rerank(self, job: RerankJob, timeout_s: float) -> tuple[str, list[Scored]]:
        """Open (or find) the job's stream, wait for every window, and return its scores, best first."""
        deadline = time.monotonic() + timeout_s
        repeat = await self._repeat(job)
        if repeat is not None:
            return repeat
        for generation in range(MAX_GENERATIONS):
            key = job.idempotency_key(generation)
            stream_id = "k_" + key
            created = False
            if await self._held(job, stream_id) is None:
                try:
                    created = await self.blocking(self._open, job, key)
                except IdempotencyConflict:
                    continue  # a key left by a gateway configured otherwise: step past it
            snapshot = await self._wait(job, stream_id, deadline)
            if not created and failure(snapshot) is not None:
                continue  # a retained failure is not an answer: score again under the next key
            self._remember(job, stream_id)
            return stream_id, scored(snapshot, stream_id)
        last = "k_" + job.idempotency_key(MAX_GENERATIONS - 1)
        raise Problem(
            "failed",
            f"reranking failed on {MAX_GENERATIONS} streams in a row; see GET /v1/streams/{last}",
            stream_id=last,
        )

    async def _repeat(self, job: RerankJob) -> tuple[str, list[Scored]] | None:
        """A job this process answered before, read from its retained decisions (open's
        validation skipped); None when it was not, or its stream is gone or failed."""
        known = self._answered.get(job.idempotency_key(0))
        if known is None:
            return None
        try:
            retained = await self.snapshot(known)
            if len(retained.results) >= retained.n_windows and failure(retained) is None:
                return known, scored(retained, known)
        except StreamNotFound:
            pass
        self._answered.pop(job.idempotency_key(0), None)
        return None

    async def _held(self, job: RerankJob, stream_id: str) -> Snapshot | None:
        """The job's stream when nothing may be sent for it and it is there to answer from; None
        when the job may be sent. Refuses (429) under backpressure, or at once (``unserved``)
        when no live worker consumes the device queue, rather than after the whole timeout."""
        tenant = job.options.tenant
        crowded = self.backlog.over_bound(job.device, tenant)
        unserved = None if crowded else await self.blocking(self.client.unserved_warning, job.device)
        if not crowded and unserved is None:
            return None
        found = await self._existing(stream_id)
        if unserved is not None:
            if found is not None and len(found.results) >= found.n_windows:
                return found  # answered already: no worker needed
            raise Problem(
                "unserved",
                f"not now: {unserved}. Nothing was queued; retry after {UNSERVED_RETRY_AFTER_S} s",
                retry_after_s=UNSERVED_RETRY_AFTER_S,
            )
        if found is None:
            self.backlog.check(job.device, tenant)  # 429, unless the backlog fell under the bound meanwhile
        return found

    async def _existing(self, stream_id: str) -> Snapshot | None:
        """The stream, unless it is not there or ended in a failure (which is no answer)."""
        try:
            found = await self.snapshot(stream_id)
        except StreamNotFound:
            return None
        if len(found.results) >= found.n_windows and failure(found) is not None:
            return None
        return found

    async def _wait(self, job: RerankJob, stream_id: str, deadline: float) -> Snapshot:
        snapshot = None
        if job.n_windows <= FRESH_WAIT_MAX_WINDOWS:
            snapshot = await self.wait_commits(stream_id, job.n_windows, deadline)
        if snapshot is None:
            snapshot = await self.wait_complete(stream_id, deadline)
        return snapshot

    def _remember(self, job: RerankJob, stream_id: str) -> None:
        self._answered[job.idempotency_key(0)] = stream_id
        while len(self._answered) > ANSWERED_MEMORY:
            self._answered.popitem(last=False)

    def _open(self, job: RerankJob, key: str) -> bool:
        """Open the job's stream (in a pool thread); True when this call created it."""
        return self.client.open_stream(job.query, job.candidates(), job.open_options(key)).created

    # -- the stream API -------------------------------------------------------

    async def open_stream(
        self, principal: Principal, query: str, candidates: list[dict[str, Any]], options: dict[str, Any]
    ) -> str:
        device = options["device"]
        self.backlog.check(device, options.get("tenant"), options.get("lane") or "interactive")
        stream_id = await self.blocking(self.client.open, query, candidates, **options)
        log.info("gateway_stream_opened", stream=stream_id, tenant=principal.tenant, device=device)
        return stream_id

    async def check_owner(self, principal: Principal, stream_id: str) -> None:
        """The stream exists and belongs to the caller's tenant; else ``not_found`` (never "someone else's")."""
        try:
            check_stream_id(stream_id)
        except ValidationError:
            raise Problem("not_found", "no such stream", field="stream_id") from None
        blob = cast("bytes | None", await self.redis.get(self.store.keys.stream(stream_id).spec))
        if blob is None:
            raise Problem("not_found", f"stream {stream_id} does not exist or has expired", stream_id=stream_id)
        if principal.tenant is not None and spec_decoder.decode(blob).tenant != principal.tenant:
            raise Problem("not_found", f"stream {stream_id} does not exist or has expired", stream_id=stream_id)

    async def page(self, stream_id: str, offset: int, limit: int, wait_s: float) -> Page:
        """``pull``'s page: admits deeper windows when committed ones cannot fill it, then waits
        on the event log (not in a thread) until it fills, the stream ends, or ``wait_s`` passes."""
        deadline = time.monotonic() + wait_s
        while True:
            snapshot = await self.snapshot(stream_id)
            page, target = build_page(stream_id, snapshot, offset, limit)
            if target < 0:
                return page
            if target > snapshot.admitted:
                # pull with no wait admits and sends exactly what pull would; waiting stays here.
                page = await self.blocking(self.client.pull, stream_id, offset, limit, timeout=0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return page
            await self.wait_for_event(stream_id, snapshot.last_event_id, remaining)

    async def status(self, stream_id: str) -> StreamStatus:
        return await self.blocking(self.client.status, stream_id)

    async def commits(self, stream_id: str, after: bytes) -> AsyncIterator[tuple[str, str | None, bytes]]:
        """Server-sent events of a stream: ``commit`` per window committed after ``after``
        (the event-log id, which is the SSE id, so ``Last-Event-ID`` resumes), ``complete``
        once every window has committed, ``gone`` if the stream expires; heartbeats between."""
        keys = self.store.keys.stream(stream_id)
        last = after
        block: int | None = None  # the first read, and the one after the last commit, do not wait
        # Reads block in chunks no longer than the store's longest blocking read (well inside
        # the socket timeout), so a quiet stream is never taken for a Redis that stopped answering.
        heartbeat_due = time.monotonic() + self.heartbeat_s
        while True:
            reply = cast(_XReadReply, await self.redis.xread({keys.events: last}, count=100, block=block))
            entries = reply[0][1] if reply else []
            if entries:
                pipe = self.redis.pipeline(transaction=False)
                for _, fields in entries:
                    pipe.hget(keys.results, fields[b"window"])
                for (entry_id, _), raw in zip(entries, await pipe.execute(), strict=True):
                    last = entry_id
                    if raw is not None:
                        summary = committed_window_status(window_result_decoder.decode(raw))
                        yield "commit", entry_id.decode(), msgspec.json.encode(summary)
                heartbeat_due = time.monotonic() + self.heartbeat_s
            elif block is not None and time.monotonic() >= heartbeat_due - HEARTBEAT_SLACK_S:
                yield "heartbeat", None, b""
                heartbeat_due = time.monotonic() + self.heartbeat_s
            meta = cast("list[bytes | None]", await self.redis.hmget(keys.meta, *PROGRESS_FIELDS))
            progress = parse_progress(stream_id, meta)
            if progress is None:
                yield "gone", None, msgspec.json.encode({"stream_id": stream_id, "message": "the stream expired"})
                return
            if progress.complete:
                if entries or block is not None:
                    block = None  # every window has committed: one more read flushes events not yet sent
                    continue
                yield "complete", None, msgspec.json.encode({"stream_id": stream_id, "windows": progress.n_windows})
                return
            wait_s = min(max(heartbeat_due - time.monotonic(), 0.0), BLOCK_CHUNK_S)
            block = max(1, int(wait_s * 1000))


def store_problem(exc: Exception) -> Problem:
    """Redis trouble as the ``unavailable`` problem; what the store error says is safe to show."""
    if isinstance(exc, StoreError):
        # Not str(exc): that names the store's URL, which is the operator's to know, not the caller's.
        said = f"{exc.reason}; {exc.advice}" if exc.advice else exc.reason
        return Problem("unavailable", said, stream_id=exc.stream_id, retry_after_s=1 if exc.retry_safe else None)
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return Problem("unavailable", "Redis is full (maxmemory); retry later", retry_after_s=1)
    return Problem("unavailable", f"Redis unreachable ({type(exc).__name__}); retry later", retry_after_s=1)
