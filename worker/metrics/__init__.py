"""A worker's metrics and health: prometheus-client in multiprocess mode, one directory per
worker, served with ``/healthz`` and ``/readyz`` by the main process on
``RERANKQ_METRICS_PORT``.

- ``multiprocess``: the per-worker directory, and marking dead pool processes;
- ``recorder``: the interface the worker reports through (``NO_METRICS`` when off);
- ``definitions``: the Prometheus metrics behind it;
- ``health``, ``server``: the checks and the HTTP endpoint;
- ``probe``: ``python -m worker.metrics.probe /readyz``, the container health check.

Nothing here imports prometheus-client until metrics are started: it must see the
directory first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernel.settings import Settings
from worker.metrics.recorder import NO_METRICS, Recorder

if TYPE_CHECKING:
    from kernel.metrics_http import MetricsServer
    from worker.metrics.health import WorkerHealth


@dataclass
class Monitoring:
    """What one worker runs for its metrics: the recorder its code reports to, its health
    checks and its HTTP server (both None when metrics are off)."""

    recorder: Recorder
    health: WorkerHealth | None = None
    server: MetricsServer | None = None


MONITORING_OFF = Monitoring(NO_METRICS)


def start_monitoring(settings: Settings, *, device: str, pool: str, processes: int) -> Monitoring:
    """Metrics for a worker about to start: its directory, its metrics, its server.

    Call in the worker's main process before the pool starts, so pool processes inherit
    the directory. ``processes``: the pool processes that must report ready (1 for threads).
    """
    if settings.metrics.port is None:
        return MONITORING_OFF
    from worker.metrics.multiprocess import base_directory, prepare

    directory = prepare(base_directory(settings.metrics.dir))
    from worker.metrics.definitions import WorkerMetrics
    from worker.metrics.health import WorkerHealth
    from worker.metrics.server import start_server

    health = WorkerHealth(settings, directory, processes=processes)
    recorder = WorkerMetrics(device=device, pool=pool)
    server = start_server(settings, settings.metrics.port, directory, health)
    return Monitoring(recorder, health, server)


__all__ = ["MONITORING_OFF", "NO_METRICS", "Monitoring", "Recorder", "start_monitoring"]
