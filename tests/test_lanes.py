"""Batch never starves interactive: a stream's lane decides where its windows wait in their
device queue, a free worker takes waiting interactive windows first, and every later send of
a window (the sweep's included) goes to the lane the stream was opened in."""

from __future__ import annotations

import pytest
from conftest import BROKERS
from delivery_helpers import provider_env, pull_until_complete, wait_for

from kernel.broker_queues import QueueProbe, lane_list
from kernel.errors import ValidationError
from kernel.store import connect
from worker.sweep import sweep_once


def committed_at(client, stream: str) -> list[float]:
    return sorted(r.committed_at for r in client.store.snapshot(stream).results.values())


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_free_worker_takes_interactive_windows_before_waiting_batch_windows(start_worker, make_client, broker):
    start_worker(provider_env("SlowProvider", sleep_s=0.4))
    client = make_client()
    batch = client.open(
        "nightly batch query",
        [{"id": f"b{i}", "text": f"batch doc {i}"} for i in range(40)],
        window_size=5,
        first_windows=8,
        lane="batch",
    )
    wait_for(lambda: client.store.attempts(batch), 20, "the worker to start on a batch window")

    interactive = client.open(
        "a person is waiting", [{"id": f"i{i}", "text": f"doc {i}"} for i in range(5)], window_size=5
    )
    page = pull_until_complete(client, interactive, 5, timeout_s=30)
    assert page.complete
    done_at = committed_at(client, interactive)[0]
    pull_until_complete(client, batch, 40, timeout_s=60)
    before = [t for t in committed_at(client, batch) if t < done_at]
    # Only the batch window already running when the interactive one arrived (and, at a race,
    # one fetched in the same instant) went first; behind the queue it would wait for all 7.
    assert len(before) <= 2, (len(before), committed_at(client, batch), done_at)


def test_the_sweep_resends_a_window_to_the_lane_its_stream_was_opened_in(make_client, settings, raw_redis):
    client = make_client()
    queue = settings.queues.cpu_queue
    streams = {
        lane: client.open(f"{lane} query", [{"id": "a", "text": "x"}], lane=lane) for lane in ("batch", "interactive")
    }
    assert raw_redis.llen(lane_list(queue, "batch")) == 1 and raw_redis.llen(lane_list(queue, "interactive")) == 1
    raw_redis.delete(lane_list(queue, "batch"), lane_list(queue, "interactive"))  # both messages lost
    for stream in streams.values():
        client.store.hurry(stream, [0])  # past their deadline now

    probe = QueueProbe(connect(settings.store.broker))
    assert sweep_once(client.store, client.dispatcher, probe, settings) == 2
    for lane, stream in streams.items():
        assert probe.queued_windows([queue]) >= {(stream, 0)}
        assert stream.encode() in raw_redis.lindex(lane_list(queue, lane), 0)
    probe.client.close()


def test_the_lane_is_checked_and_kept_by_a_retried_open(make_client, raw_redis, namespace):
    client = make_client()
    before = sorted(raw_redis.scan_iter(match=f"{namespace}:*"))
    with pytest.raises(ValidationError) as refused:
        client.open("q", [{"id": "a", "text": "x"}], lane="urgent")
    assert refused.value.field == "lane"
    assert sorted(raw_redis.scan_iter(match=f"{namespace}:*")) == before

    stream = client.open("q", [{"id": "a", "text": "x"}], lane="batch", idempotency_key="job-7")
    assert client.open("q", [{"id": "a", "text": "x"}], idempotency_key="job-7") == stream
    assert client.progress([stream])[stream].lane == "batch"
    assert client.store.snapshot(stream).lane == "batch"
