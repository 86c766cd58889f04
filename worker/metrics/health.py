"""``/healthz`` and ``/readyz`` of a worker, answered by its main process.

- healthz: the process answers, Redis (the store) answers a PING, and the broker is
  connected: Celery's consumer holds an open connection and the broker answers a PING
  (a Redis broker; another broker is judged by the consumer's connection alone).
- readyz: healthz's consumer is running, and every pool process the worker runs has reported
  ready: a scoring chain member (anything but ``rrf``) started, a local model on the device
  the worker was started for. Pool processes report through the shared metrics directory
  (``rerankq_worker_process_ready``); a process that died no longer counts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from kernel.metrics_http import health_client, reachable
from kernel.redis_clients import is_redis_broker
from kernel.settings import Settings
from worker.metrics.multiprocess import reap_dead


class WorkerHealth:
    def __init__(self, settings: Settings, directory: Path, *, processes: int) -> None:
        self.directory = directory
        self.processes = processes
        self._store = health_client(settings.store.redis_url or settings.store.broker)
        self._broker = health_client(settings.store.broker) if is_redis_broker(settings.store.broker) else None
        self._lock = threading.Lock()
        self._consumer: Any = None

    def consumer_started(self, consumer: Any) -> None:
        with self._lock:
            self._consumer = consumer

    def consumer_stopped(self) -> None:
        with self._lock:
            self._consumer = None

    def _consumer_connected(self) -> bool:
        with self._lock:
            consumer = self._consumer
        connection = getattr(consumer, "connection", None)
        return bool(connection is not None and connection.connected)

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        checks = {
            "redis": reachable(self._store),
            "broker": self._consumer_connected() and (self._broker is None or reachable(self._broker)),
        }
        return all(checks.values()), checks

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        reap_dead(self.directory)
        ready, members = read_readiness(self.directory)
        consumer = self._consumer_connected()
        ok = consumer and len(ready) >= self.processes and all(ready.values())
        return ok, {
            "consumer": consumer,
            "processes_expected": self.processes,
            "processes_ready": {str(pid): value for pid, value in sorted(ready.items())},
            "members_started": members,
        }


def read_readiness(directory: Path) -> tuple[dict[int, bool], dict[str, bool]]:
    """Each live process's readiness, and whether each member started in every live process."""
    from prometheus_client import multiprocess

    files = [str(p) for p in directory.glob("gauge_live*.db")]
    ready: dict[int, bool] = {}
    members: dict[str, bool] = {}
    for metric in multiprocess.MultiProcessCollector.merge(files, accumulate=False):
        for sample in metric.samples:
            if sample.name == "rerankq_worker_process_ready":
                ready[int(sample.labels["pid"])] = sample.value == 1
            elif sample.name == "rerankq_chain_member_started":
                members[sample.labels["member"]] = sample.value == 1
    return ready, members
