"""An attempt counts against a window only when the window's own work failed.

A client of the broker can replay any real message it sees. Replayed three times with a time
limit rerankq never sends (``[0.1, 0.05]``), alice's message once had the pool kill each
process that ran her window, counted three attempts and failed it for good ("poison"); three
copies of a message still running each took over its lease and counted one. Here the copies
with a hostile time limit are refused at the door, and plain copies are turned away by the
running delivery's lease, uncounted; a window whose process really dies is still counted
(``tests/test_poison.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from delivery_helpers import wait_for

from devservers.rabbitmq_server import rabbitmq_server_binary
from ops.probe.queue_messages import QueueProbe

BROKERS = ["redis", pytest.param("amqp", marks=pytest.mark.deployment)]


@pytest.fixture
def slow_probe(request, redis_server, tmp_path) -> Iterator[QueueProbe]:
    """A worker of three processes whose provider takes ``TEST_PROVIDER_SLEEP_S`` a window."""
    broker = request.param
    broker_url = None
    if broker == "amqp":
        if rabbitmq_server_binary() is None:
            pytest.skip("rabbitmq-server is not installed")
        broker_url = request.getfixturevalue("rabbitmq_server").url
    extra = {
        "RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:SlowProvider",
        "TEST_PROVIDER_SLEEP_S": "1.5",
        "RERANKQ_MAX_ATTEMPTS": "2",
    }
    with QueueProbe(
        tmp_path,
        timeout_s=30,
        broker=broker,
        redis_url=redis_server.url,
        broker_url=broker_url,
        worker_env_extra=extra,
        worker_args=("--device", "cpu", "--processes", "3"),
    ) as probe:
        yield probe


def _committed(probe: QueueProbe, stream: str):  # type: ignore[no-untyped-def]
    return wait_for(
        lambda: next((w for w in probe.client.status(stream).windows if w.state == "committed"), None),
        60,
        "the window to commit",
    )


@pytest.mark.parametrize("slow_probe", BROKERS, indirect=True)
def test_copies_of_a_running_message_are_turned_away_uncounted(slow_probe):
    probe = slow_probe
    [(stream, real)] = probe.take_real_messages(1)
    probe.start_worker()
    for _ in range(3):  # three processes free: each copy begins while the first still scores
        probe.queue.inject(probe.queue.entry(real))

    window = _committed(probe, stream)

    assert window.failed == 0 and window.reason is None, window
    assert window.attempts == 1
    assert "window_poisoned" not in probe.worker.log()  # type: ignore[union-attr]


@pytest.mark.parametrize("slow_probe", BROKERS, indirect=True)
def test_a_message_replayed_with_a_hostile_time_limit_never_fails_the_window(slow_probe):
    probe = slow_probe
    probe.entries()  # holds back one real message
    probe.start_worker()
    assert probe.good_window_scored()

    assert probe.replay_with_hostile_time_limit(copies=3) is None
