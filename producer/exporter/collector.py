"""The exporter's metrics: the backlog as Prometheus gauges, read from Redis on each scrape."""

from __future__ import annotations

import time
from collections.abc import Iterator

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kernel.logs import get_logger
from producer.exporter.backlog import BacklogReader

log = get_logger("rerankq.exporter")


class BacklogCollector(Collector):
    """Every scrape reads Redis once (``BacklogReader``); when Redis cannot be read, only
    ``rerankq_exporter_redis_up 0`` is reported, so stale figures are never served as fresh."""

    def __init__(self, reader: BacklogReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        start = time.perf_counter()
        up = GaugeMetricFamily("rerankq_exporter_redis_up", "1 when the last scrape could read Redis, else 0")
        try:
            backlog = self.reader.read()
        except (redis.RedisError, OSError) as exc:
            log.warning("exporter_redis_unreadable", error=type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up

        labels = ["queue", "device"]
        messages = GaugeMetricFamily("rerankq_queue_messages", "Messages waiting in a device queue", labels=labels)
        unacked = GaugeMetricFamily(
            "rerankq_queue_unacked_messages",
            "Messages of a device queue fetched by a worker and not yet acknowledged",
            labels=labels,
        )
        oldest = GaugeMetricFamily(
            "rerankq_queue_oldest_message_age_seconds",
            "Seconds since the oldest message waiting in a device queue was sent (0 when none)",
            labels=labels,
        )
        for queue in backlog.queues:
            key = [queue.queue, queue.device]
            messages.add_metric(key, queue.messages)
            unacked.add_metric(key, queue.unacked)
            oldest.add_metric(key, queue.oldest_age_s)
        yield messages
        yield unacked
        yield oldest

        uncommitted = GaugeMetricFamily(
            "rerankq_windows_uncommitted",
            "Admitted windows of live streams not yet committed, by the device streams asked for",
            labels=["device"],
        )
        for device, count in backlog.uncommitted.items():
            uncommitted.add_metric([device], count)
        yield uncommitted
        yield GaugeMetricFamily("rerankq_streams_active", "Live (unexpired) streams", value=backlog.active_streams)
        yield GaugeMetricFamily(
            "rerankq_exporter_scrape_duration_seconds",
            "Time the last scrape spent reading Redis",
            value=time.perf_counter() - start,
        )
