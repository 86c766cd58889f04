"""No window left behind: overdue windows are re-sent by the workers' sweep and by readers."""

from __future__ import annotations

import time

from conftest import make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete, wait_for

from producer import Candidate, StreamSpec
from producer.store import Store


def _open_without_dispatch(client, n: int, window_size: int, first_windows: int, grace_s: float,
                           stream: str = "s_" + "ab" * 16) -> str:
    """Admit windows the way the producer does, then "die" before sending their messages."""
    spec = StreamSpec(query="payment gateway error", window_size=window_size, n_candidates=n)
    candidates = [Candidate(id=f"c{i}", text=f"payment gateway error number {i}") for i in range(n)]
    client.store.open(stream, spec, candidates, first_windows=first_windows, enqueue_grace_s=grace_s,
                      fingerprint="x")
    return stream


def test_admitted_but_never_sent_window_is_recovered_by_the_worker_sweep(start_worker, make_client, raw_redis):
    client = make_client(redeliver_after_s=2)
    stream = _open_without_dispatch(client, 20, 10, 2, grace_s=1)
    worker = start_worker(env=provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1))

    # No reader pulls: the worker's own timer must find and re-send both windows.
    wait_for(lambda: len(client.store.snapshot(stream).results) == 2, 20, "the sweep to recover both windows", 0.2)

    assert commits_per_window(raw_redis, client, stream) == {0: 1, 1: 1}
    assert client.store.counters().get("windows_redelivered") == 2
    assert "windows_redelivered" in worker.log()


def test_message_dropped_from_the_broker_queue_is_recovered(start_worker, make_client, raw_redis, namespace):
    client = make_client(redeliver_after_s=2)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    # The message vanishes before any worker fetched it.
    assert raw_redis.delete(f"{namespace}.cpu") == 1
    start_worker(env=provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1))

    page = pull_until_complete(client, stream, 10, timeout_s=30)

    assert page.total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}
    assert client.status(stream).windows[0].attempts == 1


def test_a_reader_whose_wait_times_out_resends_its_stream(start_worker, make_client, raw_redis, namespace):
    # The workers' sweep is effectively off: only the reader can recover the window.
    start_worker(env=provider_env("FastProvider", redeliver_after_s=1, sweep_interval_s=3600))
    client = make_client(redeliver_after_s=1)
    stream = _open_without_dispatch(client, 10, 10, 1, grace_s=1)

    first = client.pull(stream, 0, 10, timeout=1.5)  # times out, and re-sends on its way out
    assert first.rows == [] and first.pending_windows == 1
    page = client.pull(stream, 0, 10, timeout=20)

    assert page.complete and page.total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}


def test_due_claims_a_window_once_and_never_while_leased(make_client):
    client = make_client()
    store: Store = client.store
    stream = _open_without_dispatch(client, 20, 10, 2, grace_s=0)
    time.sleep(0.01)

    # A live lease (a delivery scoring window 0) keeps the sweep off it.
    assert store.begin(stream, 0, work_deadline_s=60, delivery="a") == 1
    assert store.due_windows(stream, retry_in_s=60) == [1]
    # Claimed: a second sweeper right after gets nothing.
    assert store.due_windows(stream, retry_in_s=60) == []


def test_lease_turns_away_duplicates_and_lets_the_same_delivery_take_over(make_client):
    client = make_client()
    store: Store = client.store
    stream = _open_without_dispatch(client, 10, 10, 1, grace_s=60)

    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="first") == 1
    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="duplicate") == -4  # not counted
    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="first") == 2  # requeued after a crash
    time.sleep(0.4)
    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="swept") == 3  # lease ran out
    assert store.attempts(stream) == {0: 3}
    assert store.begin(stream, 1, work_deadline_s=1, delivery="x") == -2  # never admitted
    assert store.begin("s_" + "0" * 32, 0, work_deadline_s=1, delivery="x") == -3  # no such stream


def test_sweep_lock_lets_one_sweeper_per_interval(make_client):
    store = make_client().store
    assert store.try_sweep_lock(0.3) is True
    assert store.try_sweep_lock(0.3) is False
    time.sleep(0.35)
    assert store.try_sweep_lock(0.3) is True


def test_sweep_once_resends_every_overdue_window_of_every_stream_once(make_client, raw_redis, namespace):
    from worker.sweep import sweep_once

    client = make_client()
    for stream in ("s_" + "1" * 32, "s_" + "2" * 32):
        _open_without_dispatch(client, 30, 10, 3, grace_s=0, stream=stream)
    fresh = _open_without_dispatch(client, 10, 10, 1, grace_s=60, stream="s_" + "3" * 32)
    time.sleep(0.01)

    assert sweep_once(client.store, client.dispatcher, client.settings) == 6
    assert raw_redis.llen(f"{namespace}.cpu") == 6  # the not-yet-due stream sent nothing
    assert sweep_once(client.store, client.dispatcher, client.settings) == 0  # claimed
    assert client.store.due_windows(fresh, retry_in_s=1) == []
    raw_redis.delete(f"{namespace}.cpu")
