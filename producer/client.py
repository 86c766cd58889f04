"""What a pipeline uses: open a stream, pull pages, read window status."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec
import redis
from kombu.exceptions import OperationalError

from kernel.consumers import ConsumerCheck, no_worker_warning
from kernel.cost import candidate_cost, candidate_pairs, check_window_costs, window_costs
from kernel.dispatch import Dispatcher
from kernel.errors import StoreError, StoreFull, StoreUnavailable, ValidationError
from kernel.fair_share import LEDGER_ERRORS, FairShare, bucket_for
from kernel.ids import check_stream_id
from kernel.logs import get_logger
from kernel.redis_clients import UNAVAILABLE_ERRORS, NoReplicasError, is_no_replicas
from kernel.settings import Settings, load_settings
from kernel.store import Admitted, Snapshot, Store, connect
from kernel.windows import window_count
from kernel.wire import (
    Candidate,
    Lane,
    Page,
    StreamProgress,
    StreamSpec,
    StreamStatus,
    encode,
)
from producer.budget import apply_budget, check_over_fetch, limits_for, required_depth
from producer.cancel import CancelOutcome, cancel_stream
from producer.options import takes_stream_options
from producer.pages import build_page, stage_statuses, window_statuses
from producer.postprocess import PostProcess, Selection, check_postprocess, postprocess
from producer.stages import check_stage_costs
from producer.stream_spec import resolve_spec
from producer.validation import (
    check_candidates,
    check_options,
    check_pull_arguments,
    check_query,
    check_spec,
    to_candidates,
)

log = get_logger("rerankq.producer")

#: How long, and for how many streams, a client remembers a stream it has just opened, so
#: that the first pull of it starts waiting at once instead of reading what it knows.
FRESH_STREAM_S = 2.0
FRESH_STREAMS_KEPT = 1024

#: What a broker raises when it cannot take a message (kombu wraps connection errors; a full
#: Redis broker answers with a plain redis error).
SEND_ERRORS = (OperationalError, redis.RedisError, OSError)


# Redis unreachable, or refusing the write (NOREPLICAS comes as a plain ResponseError).
_UNAVAILABLE_OR_REFUSED: tuple[type[Exception], ...] = (*UNAVAILABLE_ERRORS, redis.ResponseError)


def job_fingerprint(
    spec: StreamSpec, candidates: list[Candidate], *, explicit_reference_time: dt.datetime | None
) -> str:
    """What makes two opens "the same job": a defaulted reference time (now) does not count."""
    digest = hashlib.blake2b(
        encode(msgspec.structs.replace(spec, reference_time=explicit_reference_time)), digest_size=16
    )
    for candidate in candidates:
        digest.update(encode(candidate))
    return digest.hexdigest()


@contextlib.contextmanager
def store_errors(
    stream_id: str, *, written: bool | None, retry_safe: bool, url: str | None = None, reading: bool = False
) -> Iterator[None]:
    """Redis failures as the project's own errors, naming the URL tried (password masked) and
    saying what is known of the stream and whether a retry is safe.

    ``written`` is what is known of the stream if the call fails: False before an atomic
    write (a refused script writes nothing), True once it exists. A connection that broke
    mid-write leaves it unknown (None). A read (``reading``: a pull, a status) says nothing
    about the stream it could not read: only that reading again is safe.
    """
    try:
        yield
    except redis.exceptions.OutOfMemoryError:
        raise StoreFull(
            "Redis is full (maxmemory reached, nothing is evicted)",
            url=url,
            advice="free memory or raise maxmemory; "
            + (
                "nothing was written, a retry is safe"
                if written is False
                else "a retry is safe"
                if reading
                else "the stream exists; retry later"
            ),
            stream_id=stream_id,
            stream_written=None if reading else written,
            retry_safe=True,
        ) from None
    except _UNAVAILABLE_OR_REFUSED as exc:
        if isinstance(exc, redis.ResponseError) and not is_no_replicas(exc):
            raise
        refused = isinstance(exc, (NoReplicasError, redis.ResponseError))
        problem = (
            "Redis refused the write: too few replicas in sync (NOREPLICAS: a failover under way, or a replica down)"
            if refused
            else f"Redis unreachable ({type(exc).__name__})"
        )
        if reading:
            raise StoreUnavailable(
                problem,
                url=url,
                advice="the stream was not read; a retry is safe",
                stream_id=stream_id,
                stream_written=None,
                retry_safe=True,
            ) from None
        # A NOREPLICAS refusal itself writes nothing, but the client's own retries may have met a
        # broken connection mid-write first: what is known stays what the caller knew.
        known = True if written else None
        safe = retry_safe or known is True
        raise StoreUnavailable(
            problem,
            url=url,
            advice=(
                "the stream exists, a retry is safe"
                if known
                else "the stream may or may not have been written; "
                + (
                    "a retry with the same idempotency_key is safe"
                    if safe
                    else "retry only with an idempotency_key, or a retry may open a second job"
                )
            ),
            stream_id=stream_id,
            stream_written=known,
            retry_safe=safe,
        ) from None
    except StoreError:
        raise


class Opened(msgspec.Struct, frozen=True):
    stream_id: str
    #: This call wrote the stream; False for a retried open of the same job.
    created: bool


class RerankClient:
    """A producer: light (no torch), safe to share across threads of one process."""

    def __init__(self, settings: Settings, *, dispatcher: Dispatcher | None = None) -> None:
        if not settings.store.redis_url:
            raise ValidationError("redis_url", "RERANKQ_REDIS_URL is not set")
        self.settings = settings
        self.store = Store(
            connect(settings.store.redis_url),
            settings.store.namespace,
            event_log_maxlen=settings.streams.event_log_maxlen,
        )
        self.dispatcher = dispatcher or Dispatcher(settings)
        self.fair_share = FairShare(self.store, settings)
        self._consumers = ConsumerCheck(self.store.client, self.store.keys)
        # Streams this client just created, as their open left them (nothing committed, the
        # event log empty): the usual open-then-pull skips a read that could only find that.
        self._fresh: OrderedDict[str, tuple[float, Snapshot]] = OrderedDict()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RerankClient:
        return cls(load_settings(environ, **overrides))

    def close(self) -> None:
        self.dispatcher.close()
        self.store.client.close()

    def __enter__(self) -> RerankClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- open ----------------------------------------------------------------

    @takes_stream_options
    def open(self, query: str, candidates: Iterable[Candidate | Mapping[str, Any]], **options: Any) -> str:
        """Validate, write the stream, and enqueue its first window(s). Returns the stream id.

        Every keyword argument is an option of ``producer.options.StreamOptions`` (listed
        below), validated through it: a wrong name or value raises ``ValidationError`` naming
        the field, and nothing is written.

        The candidate budget (``producer.budget``) runs first: per-source cap, strategy
        boosts, global cap (``budget`` picks a low/mid/high override). With ``keep``, the
        over-fetch rule refuses a set smaller than ``max(25, 4 * keep)`` unless
        ``allow_shallow=True``.

        With ``idempotency_key``, a retried open of the same job returns the same id and
        enqueues nothing more; reusing the key for a different job raises.

        ``lane="batch"`` queues every window of the stream (these, a deeper pull's, the
        sweep's re-sends) behind the interactive windows of its device queue: a worker takes
        any waiting interactive window first. The lane is no part of the job: a retried open
        keeps the lane it was first opened with.

        Options:
        """
        return self.open_stream(query, candidates, options).stream_id

    def open_stream(
        self, query: str, candidates: Iterable[Candidate | Mapping[str, Any]], options: Mapping[str, Any]
    ) -> Opened:
        """``open``, saying also whether this call wrote the stream (a retried open of the same job
        writes nothing): what the gateway needs to tell a fresh answer from a retained one."""
        chosen = check_options(options)
        check_query(query)
        first_windows = chosen.first_windows or 1
        lane: Lane = chosen.lane or "interactive"
        key = chosen.idempotency_key
        stream_id = "k_" + key if key is not None else "s_" + uuid.uuid4().hex
        items = check_candidates(to_candidates(candidates), self.settings)
        limits = limits_for(
            self.settings,
            budget=chosen.budget,
            max_rerank_candidates=chosen.max_rerank_candidates,
            max_candidates_per_source=chosen.max_candidates_per_source,
            strategy_boosts=chosen.strategy_boosts,
        )
        budgeted = apply_budget(items, limits)
        check_over_fetch(
            len(budgeted.kept),
            chosen.keep,
            allow_shallow=bool(chosen.allow_shallow),
            dropped=budgeted.dropped_per_source + budgeted.dropped_global,
        )
        items = budgeted.kept
        settings = self.settings
        spec = check_spec(resolve_spec(query, chosen, settings, n_candidates=len(items), limits=limits), settings)
        costs = window_costs(spec, items)
        check_window_costs(spec, costs, settings)
        candidate_tokens = [candidate_cost(spec, c) for c in items] if spec.later_stages else []
        check_stage_costs(spec.later_stages, candidate_tokens, settings)
        if spec.later_stages:
            # The second stage starts once the first shows its best keep rows: admit the windows
            # that hold them at once (store.lua admits one more if filters leave them short).
            first_windows = max(first_windows, window_count(spec.later_stages[0].keep, spec.window_size))
        fingerprint = job_fingerprint(spec, items, explicit_reference_time=chosen.reference_time)
        bucket = bucket_for(spec.tenant, lane, stream_id)
        with store_errors(stream_id, written=False, retry_safe=key is not None, url=self.settings.store.redis_url):
            opened_at_ms = int(time.time() * 1000)
            created, admitted = self.store.open(
                stream_id,
                spec,
                items,
                first_windows=first_windows,
                enqueue_grace_s=self.settings.queues.redeliver_after_s,
                fingerprint=fingerprint,
                lane=lane,
                bucket=bucket,
                costs=costs,
                candidate_tokens=candidate_tokens,
                candidate_pairs=[candidate_pairs(spec, c) for c in items] if spec.later_stages else [],
            )
        if created:
            self._remember_fresh(
                stream_id,
                Snapshot(
                    n_candidates=len(items),
                    window_size=spec.window_size,
                    admitted=len(admitted),
                    results={},
                    last_event_id=b"0-0",
                    device=spec.device,
                    lane=lane,
                    later_stages=[(s.keep, s.window_size) for s in spec.later_stages],
                    stage_chains=[spec.chain, *(s.chain for s in spec.later_stages)] if spec.later_stages else [],
                ),
            )
        # From here the stream exists: a message that cannot be sent is the sweep's to send,
        # not the caller's to retry (a retry without an idempotency key would pay twice).
        admission = Admitted(
            windows=admitted,
            costs=[costs[w] for w in admitted],
            bucket=bucket,
            expire_at_ms=opened_at_ms + spec.ttl_s * 1000,
        )
        self._send(stream_id, self._within_share(stream_id, admission, spec.device, lane), spec.device, lane)
        unserved = self.unserved_warning(spec.device) if admitted else None
        if unserved is not None:
            log.warning(
                "no_live_worker",
                stream=stream_id,
                device=spec.device,
                queue=self.settings.queues.queue_for(spec.device),
                problem=unserved,
            )
        log.info(
            "stream_opened",
            stream=stream_id,
            candidates=len(items),
            windows=admitted,
            created=created,
            lane=lane,
            budget_dropped_per_source=budgeted.dropped_per_source,
            budget_dropped_global=budgeted.dropped_global,
        )
        return Opened(stream_id=stream_id, created=created)

    def unserved_warning(self, device: str) -> str | None:
        """What to tell a caller when no live worker consumes ``device``'s queue (the windows would
        wait in silence); None when one does, or when that cannot be told. Cached briefly."""
        queue = self.settings.queues.queue_for(device)
        return no_worker_warning(queue, device) if self._consumers.count(queue) == 0 else None

    def _remember_fresh(self, stream_id: str, snapshot: Snapshot) -> None:
        self._fresh[stream_id] = (time.monotonic(), snapshot)
        while len(self._fresh) > FRESH_STREAMS_KEPT:
            try:
                self._fresh.popitem(last=False)
            except KeyError:  # another thread emptied it first
                break

    def _fresh_snapshot(self, stream_id: str) -> Snapshot | None:
        """What this client's open of ``stream_id`` left, once, if that was a moment ago.

        A commit since then is no loss: the wait reads the event log from its start and wakes at
        once. The age limit keeps a stream that expired (or a Redis that was flushed) from costing
        a pull a wait before it says the stream is gone.
        """
        found = self._fresh.pop(stream_id, None)
        if found is None or time.monotonic() - found[0] > FRESH_STREAM_S:
            return None
        return found[1]

    def _within_share(self, stream_id: str, admission: Admitted, device: str, lane: Lane) -> list[int]:
        """The admitted windows that fit their bucket's share, to send now; the ledger holds the
        others and releases them as the bucket's earlier windows commit (``kernel.fair_share``).
        A ledger that cannot be reached lets every window go: late is worse than unshared."""
        if not admission.windows:
            return []
        try:
            now = self.fair_share.enter_admitted(stream_id, device, msgspec.structs.replace(admission, lane=lane))
        except LEDGER_ERRORS as exc:
            log.warning("fair_share_unavailable", stream=stream_id, error=type(exc).__name__, sent=admission.windows)
            return admission.windows
        if len(now) < len(admission.windows):
            log.info("windows_waiting_for_share", stream=stream_id, waiting=len(admission.windows) - len(now))
        return now

    def _send(self, stream_id: str, windows: list[int], device: str, lane: Lane) -> None:
        if not windows:
            return
        try:
            self.dispatcher.send(stream_id, windows, device, lane)
        except SEND_ERRORS as exc:
            log.warning(
                "windows_not_sent",
                stream=stream_id,
                windows=windows,
                error=type(exc).__name__,
                recovery="the workers' sweep sends them",
            )
            try:
                self.store.hurry(stream_id, windows)  # due now, rather than after the enqueue grace
            except redis.RedisError:
                pass  # then they are due after the grace: later, not lost

    # -- read ----------------------------------------------------------------

    def pull(
        self,
        stream_id: str,
        offset: int = 0,
        limit: int = 10,
        *,
        timeout: float = 30.0,
        raise_on_failed: bool = False,
    ) -> Page:
        """A page of ranked rows, admitting and waiting for deeper windows as needed.

        Returns when the page is full, the stream is exhausted, or ``timeout`` passes
        (then the page holds what is committed; ``pending_windows`` says more is coming).
        A committed window is read, never sent to a provider again.
        """
        check_pull_arguments(stream_id, offset, limit, timeout=timeout, raise_on_failed=raise_on_failed)
        deadline = time.monotonic() + timeout
        # Reads are safe to repeat; an admit is too (it admits each window once, whoever asks).
        with store_errors(stream_id, written=True, retry_safe=True, url=self.settings.store.redis_url, reading=True):
            fresh = self._fresh_snapshot(stream_id)
            snapshot = fresh or self.store.snapshot(stream_id)
            while True:
                page, target = build_page(stream_id, snapshot, offset, limit, raise_on_failed=raise_on_failed)
                if target < 0:
                    return page
                if target > snapshot.admitted:
                    admission = self.store.admit(
                        stream_id, target, enqueue_grace_s=self.settings.queues.redeliver_after_s
                    )
                    if admission.windows:
                        now = self._within_share(stream_id, admission, snapshot.device, snapshot.lane)
                        self._send(stream_id, now, snapshot.device, snapshot.lane)
                        log.info("windows_admitted", stream=stream_id, windows=admission.windows, sent=now)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if snapshot is fresh:
                        # Out of time before any read (a poll): what the open left is no answer.
                        fresh, snapshot = None, self.store.snapshot(stream_id)
                        continue
                    # A lost message is the workers' sweep's to recover: a reader only reads.
                    return page
                # The wait and the next read in one round trip.
                snapshot = self.store.wait_and_snapshot(stream_id, snapshot.last_event_id, remaining)

    def select(
        self,
        stream_id: str,
        keep: int,
        *,
        depth: int | None = None,
        per_doc: int | None = None,
        gap_ratio: float | None = None,
        mmr_lambda: float | None = None,
        timeout: float = 30.0,
        raise_on_failed: bool = False,
    ) -> Selection:
        """The top ``depth`` rows (default ``max(25, 4 * keep)``), post-processed down to ``keep``.

        Optional per-document cap, score-gap truncation and MMR (``producer.postprocess``);
        embeddings and doc ids come from the stream's stored candidates, or, when no candidate
        carries an embedding, from those an ``embedding`` member kept with the windows it
        served. Nothing is written.
        """
        options = PostProcess(per_doc=per_doc, gap_ratio=gap_ratio, mmr_lambda=mmr_lambda)
        check_postprocess(options, keep)
        depth = depth if depth is not None else required_depth(keep)
        if not isinstance(depth, int) or depth < keep:
            raise ValidationError("depth", f"must be an integer of at least keep={keep}, got {depth!r}")
        page = self.pull(stream_id, 0, depth, timeout=timeout, raise_on_failed=raise_on_failed)
        candidates: dict[int, Candidate] = {}
        kept: dict[int, list[float]] = {}
        if options.needs_candidates and page.rows:
            end = max(row.decision.index for row in page.rows) + 1
            with store_errors(
                stream_id, written=True, retry_safe=True, url=self.settings.store.redis_url, reading=True
            ):
                candidates = dict(enumerate(self.store.load_candidates(stream_id, 0, end)))
                if options.mmr_lambda is not None and not any(c.embedding for c in candidates.values()):
                    kept = self.store.load_embeddings(stream_id, sorted({row.window for row in page.rows}))
        rows = postprocess(page.rows, candidates, keep, options, kept_embeddings=kept)
        return Selection(stream_id=stream_id, keep=keep, considered=len(page.rows), rows=rows, complete=page.complete)

    def status(self, stream_id: str) -> StreamStatus:
        """Where every window of a stream stands: not admitted, admitted, or committed with counts."""
        check_stream_id(stream_id)
        with store_errors(stream_id, written=True, retry_safe=True, url=self.settings.store.redis_url, reading=True):
            snapshot = self.store.snapshot(stream_id)
            attempts = self.store.attempts(stream_id)
        return StreamStatus(
            stream_id=stream_id,
            n_candidates=snapshot.n_candidates,
            window_size=snapshot.window_size,
            windows=window_statuses(snapshot, attempts),
            device=snapshot.device,
            stages=stage_statuses(snapshot),
        )

    def cancel(self, stream_id: str) -> CancelOutcome:
        """Cancel a stream: every window not yet committed is committed as ``cancelled`` (its
        rows' kind), at once, and never scored after; the stream then reads complete. Safe to
        repeat: a second cancel, or one of a complete stream, commits nothing
        (``producer.cancel``). Raises StreamNotFound for a stream that does not exist."""
        check_stream_id(stream_id)
        # One atomic write, then a give-back the sweep repeats if it is lost: safe to retry.
        with store_errors(stream_id, written=True, retry_safe=True, url=self.settings.store.redis_url):
            return cancel_stream(self.store, self.fair_share, self.dispatcher, stream_id)

    def progress(self, stream_ids: list[str]) -> dict[str, StreamProgress | None]:
        """How far each stream has come (windows admitted, committed, failed; failovers), read
        from the streams' meta in one round trip: cheap enough to poll many streams. A stream
        that does not exist (never opened, or expired) maps to None."""
        if isinstance(stream_ids, (str, bytes)) or not isinstance(stream_ids, list):
            raise ValidationError("stream_ids", "must be a list of stream ids")
        for i, stream_id in enumerate(stream_ids):
            try:
                check_stream_id(stream_id)
            except ValidationError:
                raise ValidationError(f"stream_ids[{i}]", "is not a rerankq stream id") from None
        with store_errors("", written=True, retry_safe=True, url=self.settings.store.redis_url, reading=True):
            found = self.store.progress(stream_ids)
        return dict(zip(stream_ids, found))
