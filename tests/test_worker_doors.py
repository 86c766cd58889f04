"""A queue message that is not a rerankq task message is refused: dropped, logged at WARNING,
counted, and the worker serves the next window. One real worker per broker serves every
hostile message of ``ops.probe.queue_cases`` and every remote-control probe of
``ops.probe.control_commands`` in turn.

Each hostile message once made the worker exit ("Unrecoverable error", the message left
unacknowledged, so every restart died of it again), ran one of Celery's built-in tasks, was
held in memory for a far-future ETA, took the worker's memory to 2 GB (a bz2 bomb), or was
refused with a traceback and no count; each control command a client of the broker sent was
obeyed (``shutdown``, ``rate_limit``, ``conf``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_helpers import scrape

from devservers.rabbitmq_server import rabbitmq_server_binary
from ops.probe.control_commands import ControlClient, control_probe_names, control_probes
from ops.probe.queue_cases import TaskMessage, hostile_amqp_messages, hostile_envelopes, hostile_messages
from ops.probe.queue_messages import REFUSED_METRIC, QueueProbe
from worker.refusal import REASONS

_TEMPLATE = TaskMessage(
    headers={"task": "rerankq.score_window", "id": "x"}, body=json.dumps([["s_" + "0" * 32, 0], {}, None]).encode()
)
MESSAGES = [name for name, _ in hostile_messages(_TEMPLATE)]
ENVELOPES = [name for name, _ in hostile_envelopes({"properties": {}})]
AMQP_MESSAGES = MESSAGES + [name for name, _ in hostile_amqp_messages(_TEMPLATE)]
#: What once ended in a traceback (ERROR or CRITICAL) instead of one refusal.
ONCE_A_TRACEBACK = [
    "headers-expires-garbage",
    "compression-unknown",
    "arguments-window-true",
    "arguments-window-string",
    "arguments-window-negative",
    "arguments-window-out-of-range",
    "arguments-bad-stream-id",
]


def _start(probe: QueueProbe) -> dict[str, object]:
    entries = dict(probe.entries())
    probe.start_worker()
    assert probe.good_window_scored(), probe.worker.log()[-3000:] if probe.worker else ""
    entries.update(control_probes(probe))
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
    entry = entries[name]
    why = entry() if callable(entry) else probe.run(entry, name)
    assert why is None, f"{name}: {why}\n{probe.worker.log()[-3000:] if probe.worker else ''}"


@pytest.mark.parametrize("name", MESSAGES + ENVELOPES)
def test_a_hostile_message_on_redis_is_dropped_and_counted_and_the_worker_serves_on(redis_probe, name):
    _refused(*redis_probe, name)


@pytest.mark.deployment
@pytest.mark.parametrize("name", AMQP_MESSAGES)
def test_a_hostile_message_on_rabbitmq_is_dead_lettered_and_counted_and_the_worker_serves_on(amqp_probe, name):
    _refused(*amqp_probe, name)


@pytest.mark.parametrize("name", control_probe_names("redis"))
def test_remote_control_on_redis_answers_rerankqs_commands_and_refuses_the_rest(redis_probe, name):
    _refused(*redis_probe, name)


@pytest.mark.deployment
@pytest.mark.parametrize("name", control_probe_names("amqp"))
def test_remote_control_on_rabbitmq_answers_rerankqs_commands_and_refuses_the_rest(amqp_probe, name):
    _refused(*amqp_probe, name)


def test_a_refused_control_command_is_told_so_and_the_configuration_stays_unsaid(redis_probe):
    probe, _ = redis_probe
    client = ControlClient(probe)
    try:
        replies = client.app.control.inspect(destination=[client.hostname()], timeout=3).conf(with_defaults=True)
        shutdown = client.broadcast("shutdown")
    finally:
        client.close()
    assert replies == {client.hostname(): {"error": "refused: 'conf' is not enabled on this worker"}}
    assert shutdown == [{client.hostname(): {"error": "refused: 'shutdown' is not enabled on this worker"}}]
    assert probe.worker_alive() and probe.good_window_scored()


def _one_warning_line_each(probe: QueueProbe, entries: dict[str, object]) -> None:
    assert probe.worker is not None
    arguments_before = _counts(probe).get("arguments", 0)
    for name in ONCE_A_TRACEBACK:
        start = len(probe.worker.log())
        _refused(probe, entries, name)
        lines = probe.worker.log()[start:].splitlines()
        refusals = [line for line in lines if "task_message_refused" in line]
        assert len(refusals) == 1 and "[warning" in refusals[0], (name, refusals)
        loud = [line for line in lines if "Traceback" in line or "[error" in line or "[critical" in line]
        assert not loud, (name, loud)
    assert _counts(probe).get("arguments", 0) - arguments_before == 5


def test_refusals_that_once_raised_are_one_warning_line_each_on_redis(redis_probe):
    """``expires: "garbage"`` (Celery's ERROR traceback), a bogus ``compression`` (CRITICAL),
    arguments naming no window (a Reject traceback each, uncounted): now one WARNING line
    and one count each, ``arguments`` ones under their own reason."""
    _one_warning_line_each(*redis_probe)


@pytest.mark.deployment
def test_refusals_that_once_raised_are_one_warning_line_each_on_rabbitmq(amqp_probe):
    _one_warning_line_each(*amqp_probe)


def _counts(probe: QueueProbe) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for s in scrape(probe.metrics_port)
        if s.name == REFUSED_METRIC and s.labels.get("device") == "cpu"
    }


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

    from kernel.metrics_http import REQUEST_TIMEOUT_S

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


# -- what an operator enables ------------------------------------------------------------------


def test_an_operator_enables_more_remote_control_commands_with_one_setting(start_worker, base_env):
    import socket

    from celery import Celery
    from delivery_helpers import provider_env

    from kernel.celery_config import celery_config
    from kernel.settings import load_settings

    worker = start_worker(env=provider_env("FastProvider", remote_control_commands="stats, active"))
    app = Celery("operator", set_as_current=False)
    app.conf.update(celery_config(load_settings(base_env)))
    hostname = f"rerankq-cpu-{worker.proc.pid}@{socket.gethostname()}"
    try:
        inspect = app.control.inspect(destination=[hostname], timeout=5)
        stats, active, conf = inspect.stats(), inspect.active(), inspect.conf()
    finally:
        app.close()
    assert "pool" in stats[hostname] and active == {hostname: []}
    assert conf == {hostname: {"error": "refused: 'conf' is not enabled on this worker"}}


def test_a_command_celery_does_not_have_stops_the_worker_at_start(start_worker):
    from delivery_helpers import provider_env

    with pytest.raises(RuntimeError) as exited:
        start_worker(env=provider_env("FastProvider", remote_control_commands="stats,shutdwn"))
    assert "RERANKQ_REMOTE_CONTROL_COMMANDS" in str(exited.value) and "shutdwn" in str(exited.value)
