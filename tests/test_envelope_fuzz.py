"""A few cases of the envelope fuzzer (``ops.probe.envelope_fuzz``) against a real worker, on each
broker: every mutated real message is served as the original or refused and counted, and the
worker stays the same process. ``python -m ops.probe`` runs many more."""

from __future__ import annotations

import pytest

from devservers.rabbitmq_server import rabbitmq_server_binary
from ops.probe.envelope_fuzz import fuzz
from ops.probe.queue_messages import QueueProbe

CASES = 24
#: Seeds that draw, among their 24 cases, envelopes kombu and Celery once crashed on (Redis) and
#: headers Celery and text py-amqp once crashed on (RabbitMQ).
SEEDS = {"redis": 7, "amqp": 43}


@pytest.mark.parametrize("broker", ["redis", pytest.param("amqp", marks=pytest.mark.deployment)])
def test_mutated_real_messages_are_served_or_refused_and_counted(broker, redis_server, tmp_path, request):
    broker_url = None
    if broker == "amqp":
        if rabbitmq_server_binary() is None:
            pytest.skip("rabbitmq-server is not installed")
        broker_url = request.getfixturevalue("rabbitmq_server").url
    with QueueProbe(tmp_path, 30, broker, redis_url=redis_server.url, broker_url=broker_url) as probe:
        result = fuzz(probe, cases=CASES, seed=SEEDS[broker], batch_size=12)
        log = probe.worker.log()[-3000:] if probe.worker else ""
    assert result.failures == [], "\n".join(result.failures) + "\n" + log
    assert result.cases == CASES and result.served + result.refused + result.skipped == CASES
    assert result.refused > 0
