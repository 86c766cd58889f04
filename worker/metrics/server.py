"""The worker's HTTP endpoint: ``/metrics`` (every process's files merged, the fleet's
breaker states, this worker's readiness), ``/healthz`` and ``/readyz``, served by the main
process on ``RERANKQ_METRICS_PORT``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from kernel.keys import Keys
from kernel.metrics_http import MetricsServer, check_route, health_client, metrics_route
from kernel.settings import Settings
from worker.chain.breaker import breaker_id
from worker.metrics.health import WorkerHealth
from worker.metrics.multiprocess import reap_dead
from worker.providers import provider_class
from worker.providers.base import ProviderStartError

BREAKER_STATES = ("closed", "open", "half_open")


def breaker_members(settings: Settings) -> list[tuple[str, str]]:
    """(label, breaker id) of every member that goes through the shared breaker: those whose
    provider class declares itself remote (tei, cohere, http, or a custom one that says so)."""
    out = []
    for index, member in enumerate(settings.chain.effective_members()):
        try:
            remote = bool(getattr(provider_class(member.provider), "remote", False))
        except ProviderStartError:
            continue  # the member cannot start either; the chain says so in the log
        if remote:
            label = f"{index}:{member.provider}"
            out.append((label, breaker_id(label, member)))
    return out


class BreakerCollector(Collector):
    """``rerankq_breaker_state{member, state}``, one-hot, read from the breakers' Redis hashes:
    the state every worker process shares, so any worker reports the fleet's."""

    def __init__(self, settings: Settings) -> None:
        self.keys = Keys(settings.store.namespace)
        self.members = breaker_members(settings)
        self.client = health_client(settings.store.redis_url or settings.store.broker)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self.members:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for _, member_id in self.members:
                pipe.hget(self.keys.breaker(member_id), "state")
            states = [s.decode() if s else "closed" for s in pipe.execute()]
        except (redis.RedisError, OSError):
            return  # no figure rather than a wrong one; /healthz says Redis is down
        family = GaugeMetricFamily(
            "rerankq_breaker_state",
            "A remote member's circuit breaker, shared by every worker process (one-hot)",
            labels=["member", "state"],
        )
        for (label, _), state in zip(self.members, states):
            for candidate in BREAKER_STATES:
                family.add_metric([label, candidate], 1 if state == candidate else 0)
        yield family


class ReadinessCollector(Collector):
    def __init__(self, health: WorkerHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ready, _ = self.health.readyz()
        yield GaugeMetricFamily("rerankq_worker_ready", "1 when /readyz answers 200", value=1 if ready else 0)


def start_server(settings: Settings, port: int, directory: Path, health: WorkerHealth) -> MetricsServer:
    breakers = BreakerCollector(settings)
    readiness = ReadinessCollector(health)

    def registry() -> CollectorRegistry:
        reap_dead(directory)
        merged = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(merged, path=str(directory))
        merged.register(breakers)
        merged.register(readiness)
        return merged

    return MetricsServer(
        settings.metrics.host,
        port,
        {
            "/metrics": metrics_route(registry),
            "/healthz": check_route(health.healthz),
            "/readyz": check_route(health.readyz),
        },
    ).start()
