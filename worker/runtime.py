"""What one worker process holds: settings, the store, the chain (with its model).

Built once per process — in the child after a prefork, or in the main process for
the solo and threads pools — so a model is loaded once, at process start.
"""

from __future__ import annotations

import threading

from producer.settings import Settings
from producer.store import Store, connect
from worker.chain import Chain
from worker.windows import WindowScorer

_lock = threading.Lock()
_runtime: Runtime | None = None


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = Store(connect(settings.broker if settings.redis_url is None else settings.redis_url),
                           settings.namespace, event_log_maxlen=settings.event_log_maxlen)
        self.chain = Chain.from_settings(settings, on_call=self._count_call, on_failover=self._count_failover)
        self.scorer = WindowScorer(settings, self.store, self.chain)

    def _count_call(self, member: str) -> None:
        self.store.incr_counter(f"provider_calls:{member}")

    def _count_failover(self, member: str, reason: str) -> None:
        self.store.incr_counter("failovers")
        self.store.incr_counter(f"failovers:{member}")

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
