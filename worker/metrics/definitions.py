"""The worker's metrics: names, labels, buckets, and when each moves.

Counted at the same points the store counts, so a scrape can be checked against
``Store.counters()`` exactly: a window is counted when its commit script wrote it (the
script counts ``windows_committed`` in the same call), a provider call where
``provider_calls:<member>`` is counted, a failover where ``failovers:<member>`` is, cache hits
and misses once the store has counted them, re-sends where the sweep counts
``windows_redelivered``.

Labels stay bounded: the worker's device kind, a chain member (``0:local``), an outcome, a
reason of our own (``timeout``, ``http_503``). Never a stream, query, tenant or document.
Created only after ``worker.metrics.multiprocess.prepare`` (the values live in its files).
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from worker.metrics.recorder import Recorder

# From a few milliseconds (a cached window) to the lease (RERANKQ_REDELIVER_AFTER_S, 300 s).
WINDOW_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
PADDING_BUCKETS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
NO_MEMBER = "none"


def rerankq_version() -> str:
    try:
        return metadata.version("rerankq")
    except metadata.PackageNotFoundError:
        return "unknown"


def device_kind(device: str) -> str:
    """The label for a worker's device: ``gpu`` for any CUDA device, else the device (``cpu``)."""
    return "gpu" if device.startswith("cuda") or device == "gpu" else device


class WorkerMetrics(Recorder):
    def __init__(self, *, device: str, pool: str) -> None:
        self.device = device_kind(device)
        self.pool = pool
        d = ["device"]
        self.committed = Counter(
            "rerankq_windows_committed",
            "Windows committed, by the member that served them "
            "(none for a failed window) and outcome (ranked, failed, poisoned)",
            ["device", "member", "outcome"],
            registry=None,
        )
        self.queue_wait = Histogram(
            "rerankq_window_queue_wait_seconds",
            "Admitted to first begun: how long a window waited for a worker",
            d,
            buckets=QUEUE_BUCKETS,
            registry=None,
        )
        self.scoring = Histogram(
            "rerankq_window_scoring_seconds",
            "Begun to ready to commit: documents, cache, provider chain, decisions",
            d,
            buckets=WINDOW_BUCKETS,
            registry=None,
        )
        self.commit = Histogram(
            "rerankq_window_commit_seconds", "The commit script's round trip", d, buckets=COMMIT_BUCKETS, registry=None
        )
        self.latency = Histogram(
            "rerankq_window_latency_seconds", "Admitted to committed", d, buckets=QUEUE_BUCKETS, registry=None
        )
        self.attempts_again = Counter(
            "rerankq_window_attempts_again",
            "Deliveries that began a window already attempted (attempts beyond the first)",
            d,
            registry=None,
        )
        self.pairs = Counter(
            "rerankq_pairs_scored",
            "(query, document) pairs sent to a member's provider",
            ["device", "member"],
            registry=None,
        )
        self.padding = Histogram(
            "rerankq_batch_padding_ratio",
            "Share of a forward batch's tokens that are padding",
            d,
            buckets=PADDING_BUCKETS,
            registry=None,
        )
        self.requests = Counter(
            "rerankq_provider_requests",
            "Provider calls (windows or cache misses sent to a member)",
            ["member"],
            registry=None,
        )
        self.errors = Counter(
            "rerankq_provider_errors", "Provider calls that failed, by reason", ["member", "reason"], registry=None
        )
        self.request_seconds = Histogram(
            "rerankq_provider_request_seconds",
            "A provider call, retries and Retry-After waits included",
            ["member"],
            buckets=WINDOW_BUCKETS,
            registry=None,
        )
        self.retries = Counter(
            "rerankq_provider_retries",
            "Requests a remote member retried (429, 5xx)",
            ["member", "reason"],
            registry=None,
        )
        self.repairs = Counter(
            "rerankq_provider_answers_repaired",
            "Answers a member repaired and used (a listwise permutation: out_of_range, repeated,"
            " missing ids; no_identifiers: the prompt's order kept)",
            ["member", "repair"],
            registry=None,
        )
        self.retry_wait = Histogram(
            "rerankq_provider_retry_wait_seconds",
            "Waits before a retry; source retry_after when the server's Retry-After set it",
            ["member", "source"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=None,
        )
        self.failovers = Counter(
            "rerankq_failovers", "Members skipped by the chain, by reason", ["member", "reason"], registry=None
        )
        self.not_started = Counter(
            "rerankq_members_not_started",
            "Windows the chain passed over a member for because it never started (not failovers)",
            ["member"],
            registry=None,
        )
        self.cache_hits = Counter(
            "rerankq_pair_cache_hits", "Pair scores served from the cache", ["member"], registry=None
        )
        self.cache_misses = Counter(
            "rerankq_pair_cache_misses", "Pair scores the cache did not hold", ["member"], registry=None
        )
        self.embedding_cache_hits = Counter(
            "rerankq_embedding_cache_hits",
            "Texts whose embedding an embedding member read from the cache",
            ["member"],
            registry=None,
        )
        self.embedding_cache_misses = Counter(
            "rerankq_embedding_cache_misses",
            "Texts an embedding member embedded because the cache did not hold them",
            ["member"],
            registry=None,
        )
        self.refused = Counter(
            "rerankq_task_messages_refused",
            "Broker messages the worker refused and dropped: not what rerankq sends "
            "(reason: envelope, headers, task, eta, content, body, arguments, control)",
            ["device", "reason"],
            registry=None,
        )
        self.redelivered = Counter(
            "rerankq_windows_redelivered", "Windows the sweep re-sent (no message was queued)", registry=None
        )
        self.info = Gauge(
            "rerankq_worker_info",
            "What a worker process runs (value 1)",
            ["version", "device", "model", "precision", "torch_threads", "pool"],
            multiprocess_mode="livemax",
            registry=None,
        )
        # Labelled, so the main process of a prefork worker, which never scores, writes no value.
        self.ready = Gauge(
            "rerankq_worker_process_ready",
            "1 when this pool process can score (a scoring member started on its device)",
            d,
            multiprocess_mode="liveall",
            registry=None,
        )
        self.started = Gauge(
            "rerankq_chain_member_started",
            "1 when a chain member started in every live pool process, 0 when one has not",
            ["member"],
            multiprocess_mode="livemin",
            registry=None,
        )

        # Children bound once: a window's reports are on the hot path (benchmarked in
        # ops/bench/metrics.py), and a label lookup costs as much as the write it precedes.
        self._queue_wait = self.queue_wait.labels(self.device)
        self._scoring = self.scoring.labels(self.device)
        self._commit = self.commit.labels(self.device)
        self._latency = self.latency.labels(self.device)
        self._committed: dict[tuple[str, str], Any] = {}
        self._member: dict[str, tuple[Any, Any, Any]] = {}
        self._cache: dict[str, tuple[Any, Any]] = {}
        self._embedding_cache: dict[str, tuple[Any, Any]] = {}

    def _member_children(self, member: str) -> tuple[Any, Any, Any]:
        children = self._member.get(member)
        if children is None:
            children = self._member[member] = (
                self.requests.labels(member),
                self.pairs.labels(self.device, member),
                self.request_seconds.labels(member),
            )
        return children

    def window_begun(self, *, attempt: int, admitted_at_ms: int) -> None:
        if attempt > 1:
            self.attempts_again.labels(self.device).inc()
        elif admitted_at_ms:
            # Clocks of different hosts may disagree a little; a wait is never negative.
            self._queue_wait.observe(max(0.0, time.time() - admitted_at_ms / 1000))

    def window_scored(self, seconds: float) -> None:
        self._scoring.observe(seconds)

    def window_committed(
        self, *, member: str | None, outcome: str, commit_s: float, admitted_at_ms: int, written: bool
    ) -> None:
        self._commit.observe(commit_s)
        if not written:
            return
        key = (member or NO_MEMBER, outcome)
        counter = self._committed.get(key)
        if counter is None:
            counter = self._committed[key] = self.committed.labels(self.device, *key)
        counter.inc()
        if admitted_at_ms:
            self._latency.observe(max(0.0, time.time() - admitted_at_ms / 1000))

    def provider_called(self, member: str, pairs: int) -> None:
        requests, pairs_scored, _ = self._member_children(member)
        requests.inc()
        pairs_scored.inc(pairs)

    def provider_answered(self, member: str, seconds: float, error: str | None) -> None:
        self._member_children(member)[2].observe(seconds)
        if error is not None:
            self.errors.labels(member, error).inc()

    def provider_retried(self, member: str, reason: str, wait_s: float, from_retry_after: bool) -> None:
        self.retries.labels(member, reason).inc()
        self.retry_wait.labels(member, "retry_after" if from_retry_after else "backoff").observe(wait_s)

    def provider_repaired(self, member: str, repair: str) -> None:
        self.repairs.labels(member, repair).inc()

    def failover(self, member: str, reason: str) -> None:
        self.failovers.labels(member, reason).inc()

    def member_not_started(self, member: str) -> None:
        self.not_started.labels(member).inc()

    def cache_counted(self, member: str, hits: int, misses: int) -> None:
        counters = self._cache.get(member)
        if counters is None:
            counters = self._cache[member] = (self.cache_hits.labels(member), self.cache_misses.labels(member))
        if hits:
            counters[0].inc(hits)
        if misses:
            counters[1].inc(misses)

    def embedding_cache_counted(self, member: str, hits: int, misses: int) -> None:
        counters = self._embedding_cache.get(member)
        if counters is None:
            counters = self._embedding_cache[member] = (
                self.embedding_cache_hits.labels(member),
                self.embedding_cache_misses.labels(member),
            )
        if hits:
            counters[0].inc(hits)
        if misses:
            counters[1].inc(misses)

    def windows_redelivered(self, count: int) -> None:
        self.redelivered.inc(count)

    def batch_padding(self, real_tokens: int, padded_tokens: int) -> None:
        if padded_tokens > 0:
            self.padding.labels(self.device).observe(1.0 - real_tokens / padded_tokens)

    def member_started(self, member: str, started: bool) -> None:
        self.started.labels(member).set(1 if started else 0)

    def process_ready(self, ready: bool) -> None:
        self.ready.labels(self.device).set(1 if ready else 0)

    def message_refused(self, reason: str) -> None:
        self.refused.labels(self.device, reason).inc()

    def worker_info(self, *, model: str, precision: str, torch_threads: int | None) -> None:
        self.info.labels(rerankq_version(), self.device, model, precision, str(torch_threads or ""), self.pool).set(1)
