"""What the worker tells its metrics, as one small interface.

The window task, the chain, the cache, the engine and the sweep report through a
``Recorder``; with metrics off (no ``RERANKQ_METRICS_PORT``) it is ``NO_METRICS``, whose
methods do nothing, so no code path changes with the setting. ``worker.metrics.definitions``
holds the Prometheus implementation.
"""

from __future__ import annotations


class Recorder:
    """Every report the worker makes; each does nothing here."""

    def window_begun(self, *, attempt: int, admitted_at_ms: int) -> None:
        """A delivery began on a window (its attempt was counted)."""

    def window_scored(self, seconds: float) -> None:
        """A window's documents were assembled, scored through the chain and decided."""

    def window_committed(
        self, *, member: str | None, outcome: str, commit_s: float, admitted_at_ms: int, written: bool
    ) -> None:
        """A commit call returned; ``written`` when this call committed the window."""

    def provider_called(self, member: str, pairs: int) -> None:
        """A provider call was made (counted as ``provider_calls:<member>``)."""

    def provider_answered(self, member: str, seconds: float, error: str | None) -> None:
        """A provider call ended, with the error's reason when it raised one."""

    def provider_retried(self, member: str, reason: str, wait_s: float, from_retry_after: bool) -> None:
        """A provider will retry its request after ``wait_s``."""

    def provider_repaired(self, member: str, repair: str) -> None:
        """A provider repaired an answer it could still use (``worker.providers.base.announce_repair``)."""

    def failover(self, member: str, reason: str) -> None:
        """The chain skipped a member (counted as ``failovers:<member>``)."""

    def member_not_started(self, member: str) -> None:
        """The chain passed over a member that never started (counted as ``members_not_started:<member>``)."""

    def cache_counted(self, member: str, hits: int, misses: int) -> None:
        """The pair cache counted hits and misses in the store."""

    def embedding_cache_counted(self, member: str, hits: int, misses: int) -> None:
        """An embedding member's cache of vectors counted hits and misses in the store."""

    def windows_redelivered(self, count: int) -> None:
        """The sweep re-sent windows (counted as ``windows_redelivered``)."""

    def batch_padding(self, real_tokens: int, padded_tokens: int) -> None:
        """The engine ran one forward batch."""

    def member_started(self, member: str, started: bool) -> None:
        """A chain member started (or failed to) in this process."""

    def process_ready(self, ready: bool) -> None:
        """This process can score: a scoring member started on the device asked for."""

    def message_refused(self, reason: str) -> None:
        """The worker refused a queue message that is not a rerankq task message (dropped)."""

    def worker_info(self, *, model: str, precision: str, torch_threads: int | None) -> None:
        """What this process runs."""


NO_METRICS = Recorder()
