"""What one worker process holds: settings, the store, the chain (with its model).

Built once per process — in the child after a prefork, or in the main process for
the solo and threads pools — so a model is loaded once, at process start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from kernel.settings import MemberSettings, Settings
from kernel.store import Store, connect
from worker.chain import Chain
from worker.fair_release import ShareReturn
from worker.metrics.recorder import NO_METRICS, Recorder
from worker.providers.base import Provider
from worker.scoring.calibration import Calibrations
from worker.side_writes import SideWrite, write
from worker.windows import WindowScorer

log = structlog.get_logger("rerankq.worker")

_lock = threading.Lock()
_runtime: Runtime | None = None


def device_type(device: str) -> str:
    """``cuda`` for ``cuda``, ``cuda:N`` and ``gpu``; the device itself otherwise."""
    return "cuda" if device == "gpu" or device.startswith("cuda") else device.split(":")[0]


class Runtime:
    def __init__(self, settings: Settings, recorder: Recorder = NO_METRICS) -> None:
        self.settings = settings
        self.recorder = recorder
        self._warmed_up = False
        store_url = settings.store.broker if settings.store.redis_url is None else settings.store.redis_url
        self.store = Store(
            connect(store_url), settings.store.namespace, event_log_maxlen=settings.streams.event_log_maxlen
        )
        self.chain = Chain.from_settings(
            settings,
            wrap=self._wrap_member,
            on_failover=self._count_failover,
            on_not_started=self._count_not_started,
            redis_client=self.store.client,
        )
        self.share_return = ShareReturn(settings, self.store)
        self.scorer = WindowScorer(
            settings,
            self.store,
            self.chain,
            recorder,
            calibrations=Calibrations.from_settings(settings),
            share_return=self.share_return,
        )

    def _wrap_member(self, index: int, member: MemberSettings, provider: Provider) -> Provider:
        """Meter real provider calls; in front of that, the pair-score cache (never for rrf,
        whose seeded scores come from fusion rank, not from the pair)."""
        from worker.chain.cache import CachedProvider
        from worker.chain.metering import MeteredProvider

        label = f"{index}:{member.provider}"
        engine = getattr(provider, "engine", None)
        if engine is not None:
            engine.on_batch = self.recorder.batch_padding
        metered = MeteredProvider(provider, label=label, count=self.count, recorder=self.recorder)
        if self._warmed_up:
            # A member that failed at start and starts now, on a later window.
            self.report_started(starting=label)
        if not self.settings.chain.pair_cache or provider.scale is None:
            return metered
        raw = getattr(provider, "inner", provider)
        identity = getattr(raw, "cache_identity", None)
        if hasattr(raw, "vector_cache") and isinstance(identity, str):
            from worker.chain.embedding_cache import EmbeddingCache

            raw.vector_cache = EmbeddingCache(
                self.store.client,
                self.store.keys,
                identity=identity,
                ttl_s=self.settings.chain.cache_ttl_s,
                per_tenant=member.send_tenant or not self.settings.chain.pair_cache_shared_across_tenants,
                dims=getattr(getattr(raw, "engine", None), "dimensions", None),
                on_counted=lambda hits, misses: self.recorder.embedding_cache_counted(label, hits, misses),
            )
        return CachedProvider(
            metered,
            member=member,
            client=self.store.client,
            keys=self.store.keys,
            ttl_s=self.settings.chain.cache_ttl_s,
            count=self.count,
            shared_across_tenants=self.settings.chain.pair_cache_shared_across_tenants,
            on_counted=lambda hits, misses: self.recorder.cache_counted(label, hits, misses),
        )

    def count(self, name: str, amount: int = 1, *, then: Callable[[], None] | None = None) -> None:
        """Add to a store counter, with the commit of the window being scored (or now, outside
        one); ``then()`` runs once it is counted."""
        key = self.store.keys.counters_for(None)
        client = self.store.client
        write(
            SideWrite(
                queue=lambda pipe: pipe.hincrby(key, name, amount),
                run=lambda: client.hincrby(key, name, amount),
                done=(lambda _reply: then()) if then is not None else None,
            )
        )

    def _count_failover(self, member: str, reason: str) -> None:
        self.count("failovers")
        self.count(f"failovers:{member}")
        if reason == "timeout":
            # A member's TIMEOUT_S too short for its documents shows here before anywhere else.
            self.count(f"provider_timeouts:{member}")
        self.recorder.failover(member, reason)

    def _count_not_started(self, member: str) -> None:
        self.count("members_not_started")
        self.count(f"members_not_started:{member}")
        self.recorder.member_not_started(member)

    def warm_up(self) -> None:
        self.chain.warm_up()
        self._warmed_up = True
        self.report_started()
        from worker.readiness import passthrough_on_purpose

        # The line to wait for before the first window: Celery's "ready" comes before a
        # prefork child has loaded its models (and, at a first start, measured their backends).
        # Never said by a worker that cannot score (unless fusion order is what it was asked for).
        passthrough = passthrough_on_purpose(self.settings)
        if self.chain.scoring_started() or passthrough:
            started = [m.label for m in self.chain.members if m.started]
            log.info("chain_warmed_up", started=started, **({"passthrough_on_purpose": True} if passthrough else {}))

    def scoring_started(self) -> bool:
        return self.chain.scoring_started()

    def start_causes(self) -> list[str]:
        """Each scoring member's failed start, in words (``worker.readiness.cause``)."""
        from worker.readiness import cause

        errors = self.chain.start_errors
        return [
            cause(m.label, errors[m.label])
            for m in self.chain.members
            if m.settings.provider != "rrf" and m.label in errors
        ]

    def report_started(self, starting: str | None = None) -> None:
        """Tell the metrics which members started and whether this process can score: a
        scoring member (anything but rrf) started, a local model on the device asked for.
        ``starting``: a member being started right now (not yet marked started)."""
        scoring_ok = False
        has_scoring = False
        model, precision = "", ""
        for member in self.chain.members:
            started = member.started or member.label == starting
            self.recorder.member_started(member.label, started)
            engine = getattr(member.checked, "engine", None) if started else None
            if engine is not None and not model:
                model, precision = str(getattr(member.checked, "model_name", "")), str(engine.precision)
            if member.settings.provider == "rrf":
                continue
            has_scoring = True
            wanted = device_type(member.settings.device or self.settings.worker.device)
            on_device = engine is None or engine.device.type == wanted
            scoring_ok = scoring_ok or (started and on_device)
        if not model:
            first = self.chain.members[0].settings if self.chain.members else None
            model = (first.model or first.provider) if first is not None else ""
        self.recorder.process_ready(scoring_ok or not has_scoring)
        self.recorder.worker_info(model=model, precision=precision, torch_threads=self.settings.worker.torch_threads)

    def close(self) -> None:
        self.chain.close()
        self.share_return.close()
        self.store.client.close()


def get_runtime(settings: Settings, recorder: Recorder = NO_METRICS) -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime(settings, recorder)
            _runtime.warm_up()
        return _runtime


def reset_runtime() -> None:
    """Drop this process's runtime (after a fork, the parent's is not ours)."""
    global _runtime
    with _lock:
        _runtime = None
