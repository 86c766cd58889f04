"""A queue message that is not a rerankq task message is refused: dropped, logged at WARNING,
counted, and the worker serves the next window. One real worker per broker serves every
hostile message of ``ops.probe.queue_messages`` in turn.

Each hostile message once made the worker exit ("Unrecoverable error", the message left
unacknowledged, so every restart died of it again), ran one of Celery's built-in tasks, or
was held in memory for a far-future ETA.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_helpers import scrape

from devservers.rabbitmq_server import rabbitmq_server_binary
from ops.probe.queue_messages import (
    REFUSED_METRIC,
    QueueProbe,
    TaskMessage,
    hostile_envelopes,
    hostile_messages,
)
from worker.message_door import REASONS

_TEMPLATE = TaskMessage(
    headers={"task": "rerankq.score_window", "id": "x"}, body=json.dumps([["s_" + "0" * 32, 0], {}, None]).encode()
)
MESSAGES = [name for name, _ in hostile_messages(_TEMPLATE)]
ENVELOPES = [name for name, _ in hostile_envelopes({"properties": {}})]
#: What the RabbitMQ worker is shown: one of each kind (the Redis worker sees them all).
AMQP_MESSAGES = [
    "body-object",
    "body-args-kwargs",
    "body-null",
    "body-invalid-json",
    "headers-timelimit",
    "task-celery.accumulate",
    "task-celery.map",
    "eta-far-future",
]


def _start(probe: QueueProbe) -> dict[str, object]:
    entries = dict(probe.entries())
    probe.start_worker()
    assert probe.good_window_scored(), probe.worker.log()[-3000:] if probe.worker else ""
    return entries


@pytest.fixture(scope="module")
def redis_probe(redis_server, tmp_path_factory) -> Iterator[tuple[QueueProbe, dict[str, object]]]:
    directory: Path = tmp_path_factory.mktemp("poison-redis")
    with QueueProbe(directory, timeout_s=20, redis_url=redis_server.url) as probe:
        yield probe, _start(probe)


@pytest.fixture(scope="module")
def amqp_probe(redis_server, tmp_path_factory, request) -> Iterator[tuple[QueueProbe, dict[str, object]]]:
    if rabbitmq_server_binary() is None:
        pytest.skip("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server; .ci/run does)")
    rabbitmq = request.getfixturevalue("rabbitmq_server")
    directory: Path = tmp_path_factory.mktemp("poison-amqp")
    with QueueProbe(
        directory, timeout_s=30, broker="amqp", redis_url=redis_server.url, broker_url=rabbitmq.url
    ) as probe:
        yield probe, _start(probe)


def _refused(probe: QueueProbe, entries: dict[str, object], name: str) -> None:
    if not probe.worker_alive():
        probe.restart_worker()  # an earlier message killed it: judge each on its own
    why = probe.run(entries[name])
    assert why is None, f"{name}: {why}\n{probe.worker.log()[-3000:] if probe.worker else ''}"


@pytest.mark.parametrize("name", MESSAGES + ENVELOPES)
def test_a_hostile_message_on_redis_is_dropped_and_counted_and_the_worker_serves_on(redis_probe, name):
    _refused(*redis_probe, name)


@pytest.mark.deployment
@pytest.mark.parametrize("name", AMQP_MESSAGES)
def test_a_hostile_message_on_rabbitmq_is_dead_lettered_and_counted_and_the_worker_serves_on(amqp_probe, name):
    _refused(*amqp_probe, name)


def test_refusals_are_warnings_and_their_labels_name_no_message(redis_probe):
    probe, entries = redis_probe
    for name in ("task-celery.backend_cleanup", "eta-far-future", "raw-not-json"):
        assert probe.run(entries[name]) is None, name
    samples = [s for s in scrape(probe.metrics_port) if s.name == REFUSED_METRIC]
    assert samples and all(set(s.labels) == {"device", "reason"} and s.labels["reason"] in REASONS for s in samples)
    reasons = {s.labels["reason"] for s in samples if s.value > 0}
    assert {"task", "eta", "envelope"} <= reasons
    assert probe.worker is not None
    lines = [line for line in probe.worker.log().splitlines() if "task_message_refused" in line]
    assert lines and all("[warning" in line for line in lines)
    assert any(re.search(r"reason=task\b.*celery\.backend_cleanup", line) for line in lines)
    # Celery ran none of its built-in tasks, and held no message for later.
    assert "celery.backend_cleanup[" not in probe.worker.log() and "celery.accumulate[" not in probe.worker.log()


def test_the_worker_stops_with_nothing_to_hand_back(redis_probe):
    """Nothing refused stays unacknowledged: a shutdown restores no message (an ETA message
    once came back at every shutdown)."""
    probe, entries = redis_probe
    assert probe.run(entries["eta-far-future"]) is None
    assert probe.worker is not None
    probe.worker.stop()
    assert "Restoring" not in probe.worker.log()
    assert probe.queue.held() == [] and probe.raw.llen(probe.queue_name) == 0  # type: ignore[union-attr]
    probe.start_worker()


# -- the metrics port ------------------------------------------------------------------------


def test_the_metrics_port_listens_on_loopback_unless_told_otherwise(redis_probe):
    import psutil

    probe, _ = redis_probe
    assert probe.worker is not None and probe.worker.proc is not None
    listening = [
        c.laddr
        for c in psutil.Process(probe.worker.proc.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == probe.metrics_port
    ]
    assert [address.ip for address in listening] == ["127.0.0.1"]


def test_idle_connections_to_the_metrics_port_cost_no_threads_and_are_closed(redis_probe):
    """300 connections that never send a request once made 300 threads that never ended."""
    import socket
    import time

    import psutil

    from producer.exporter.http import REQUEST_TIMEOUT_S

    probe, _ = redis_probe
    assert probe.worker is not None and probe.worker.proc is not None
    worker = psutil.Process(probe.worker.proc.pid)
    threads_before = worker.num_threads()
    idle = [
        socket.create_connection(("127.0.0.1", probe.metrics_port), timeout=REQUEST_TIMEOUT_S + 5) for _ in range(300)
    ]
    try:
        time.sleep(0.5)
        assert worker.num_threads() <= threads_before + 4
        started = time.monotonic()
        assert scrape(probe.metrics_port)  # a scraper still gets its answer, at once
        assert time.monotonic() - started < 2.0
        # The server closes what never sends a request (EOF, or reset for the displaced).
        time.sleep(REQUEST_TIMEOUT_S + 0.5)
        for sock in idle:
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in idle:
            sock.close()
