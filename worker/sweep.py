"""The workers' sweep: re-send windows admitted but not committed past their deadline.

Runs in each worker's main process on a background thread. A Redis lock that is
never released but expires after one interval (``SET NX PX``) makes one worker in
the whole fleet sweep per interval, whichever gets there first; a worker that dies
costs at most one missed interval. What is re-sent and why a duplicate is harmless:
``producer.redelivery``.
"""

from __future__ import annotations

import threading

import redis
import structlog
from kombu.exceptions import OperationalError

from producer.dispatch import Dispatcher
from producer.redelivery import resend_due
from producer.settings import Settings
from producer.store import Store, connect

log = structlog.get_logger("rerankq.sweep")


# Streams checked per round trip: one pipeline of `due` calls, each still atomic.
SWEEP_BATCH = 500


def sweep_once(store: Store, dispatcher: Dispatcher, settings: Settings) -> int:
    """Re-send every overdue window of every live stream. Returns how many were sent."""
    streams = store.active_streams()
    return sum(
        resend_due(store, dispatcher, streams[i:i + SWEEP_BATCH], retry_in_s=settings.redeliver_after_s)
        for i in range(0, len(streams), SWEEP_BATCH)
    )


class SweepTimer:
    """A daemon thread that sweeps every ``sweep_interval_s`` while it holds the fleet's lock."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SweepTimer:
        self._thread = threading.Thread(target=self._run, name="rerankq-sweep", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # Own connections: nothing here is shared with the Celery consumer or the pool.
        store = Store(connect(self.settings.redis_url or self.settings.broker), self.settings.namespace)
        dispatcher = Dispatcher(self.settings)
        interval = self.settings.sweep_interval_s
        try:
            while not self._stop.wait(interval):
                try:
                    if store.try_sweep_lock(interval):
                        sent = sweep_once(store, dispatcher, self.settings)
                        if sent:
                            log.warning("sweep_resent", windows=sent)
                except (redis.RedisError, OperationalError, OSError) as exc:
                    # Redis down or restarting: the next interval tries again.
                    log.warning("sweep_failed", error=type(exc).__name__)
                except Exception:  # noqa: BLE001 - the sweep must outlive any one bad stream
                    log.exception("sweep_crashed")
        finally:
            dispatcher.close()
            store.client.close()
