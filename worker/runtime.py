"""What one worker process holds: settings, the store, the chain (with its model).

Built once per process — in the child after a prefork, or in the main process for
the solo and threads pools — so a model is loaded once, at process start.
"""

from __future__ import annotations

import threading

from producer.settings import MemberSettings, Settings
from producer.store import Store, connect
from worker.chain import Chain
from worker.providers.base import Provider
from worker.windows import WindowScorer

_lock = threading.Lock()
_runtime: Runtime | None = None


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(connect(settings.broker if settings.redis_url is None else settings.redis_url),
                           settings.namespace, event_log_maxlen=settings.event_log_maxlen)
        self.chain = Chain.from_settings(settings, wrap=self._wrap_member, on_failover=self._count_failover,
                                         redis_client=self.store.client)
        self.scorer = WindowScorer(settings, self.store, self.chain)

    def _wrap_member(self, index: int, member: MemberSettings, provider: Provider) -> Provider:
        """Meter real provider calls; in front of that, the pair-score cache (never for rrf,
        whose seeded scores come from fusion rank, not from the pair)."""
        from worker.chain.cache import CachedProvider
        from worker.chain.metering import MeteredProvider

        label = f"{index}:{member.provider}"
        metered = MeteredProvider(provider, label=label, count=self.store.incr_counter)
        if not self.settings.pair_cache or provider.scale is None:
            return metered
        return CachedProvider(metered, member=member, client=self.store.client, keys=self.store.keys,
                              ttl_s=self.settings.cache_ttl_s, count=self.store.incr_counter)

    def _count_failover(self, member: str, reason: str) -> None:
        self.store.incr_counter("failovers")
        self.store.incr_counter(f"failovers:{member}")
        if reason == "timeout":
            # A member's TIMEOUT_S too short for its documents shows here before anywhere else.
            self.store.incr_counter(f"provider_timeouts:{member}")

    def close(self) -> None:
        self.chain.close()
        self.store.client.close()


def get_runtime(settings: Settings) -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime(settings)
            _runtime.chain.warm_up()
        return _runtime


def reset_runtime() -> None:
    """Drop this process's runtime (after a fork, the parent's is not ours)."""
    global _runtime
    with _lock:
        _runtime = None
