"""No window left behind: overdue windows with no message queued are re-sent by the workers' sweep."""

from __future__ import annotations

import time

import msgspec
from conftest import make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete, wait_for

from kernel.store import Store
from kernel.wire import candidate_decoder
from producer import Candidate, StreamSpec, WindowResult


def _open_without_dispatch(
    client, n: int, window_size: int, first_windows: int, grace_s: float, stream: str = "s_" + "ab" * 16
) -> str:
    """Admit windows the way the producer does, then "die" before sending their messages."""
    spec = StreamSpec(query="payment gateway error", window_size=window_size, n_candidates=n)
    candidates = [Candidate(id=f"c{i}", text=f"payment gateway error number {i}") for i in range(n)]
    client.store.open(stream, spec, candidates, first_windows=first_windows, enqueue_grace_s=grace_s, fingerprint="x")
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


def test_a_reader_only_reads_recovery_is_the_sweeps(start_worker, make_client, raw_redis, namespace):
    # The workers' sweep is effectively off: a reader whose wait times out must not re-send
    # (it would hide a broken sweep), so the window stays pending.
    start_worker(env=provider_env("FastProvider", redeliver_after_s=1, sweep_interval_s=3600))
    client = make_client(redeliver_after_s=1)
    stream = _open_without_dispatch(client, 10, 10, 1, grace_s=0)

    first = client.pull(stream, 0, 10, timeout=1.5)
    second = client.pull(stream, 0, 10, timeout=1.5)

    assert first.rows == [] and second.rows == [] and second.pending_windows == 1
    assert raw_redis.llen(f"{namespace}.cpu") == 0
    assert client.status(stream).windows[0].attempts == 0


def test_due_claims_a_window_once_and_never_while_leased(make_client):
    client = make_client()
    store: Store = client.store
    stream = _open_without_dispatch(client, 20, 10, 2, grace_s=0)
    time.sleep(0.01)

    # A live lease (a delivery scoring window 0) keeps the sweep off it.
    assert store.begin(stream, 0, work_deadline_s=60, delivery="a").attempt == 1
    assert store.due_windows(stream, retry_in_s=60) == [1]
    # Claimed: a second sweeper right after gets nothing.
    assert store.due_windows(stream, retry_in_s=60) == []


def test_lease_turns_away_duplicates_and_copies_until_its_attempt_is_released(make_client):
    client = make_client()
    store: Store = client.store
    stream = _open_without_dispatch(client, 10, 10, 1, grace_s=60)

    first = store.begin(stream, 0, work_deadline_s=0.5, delivery="first")
    assert first.attempt == 1 and [c.id for c in map(candidate_decoder.decode, first.candidates)] == [
        f"c{i}" for i in range(10)
    ]
    assert store.begin(stream, 0, work_deadline_s=0.5, delivery="duplicate") == -4  # not counted
    # A copy of the running message itself (anyone who can write to the queue can replay one).
    assert store.begin(stream, 0, work_deadline_s=0.5, delivery="first") == -4
    assert store.attempts(stream) == {0: 1}
    assert store.release(stream, 0, delivery="duplicate", refund=False) == 0  # not its lease
    # Its process died: the worker releases the lease, the requeued message takes over, counted.
    assert store.release(stream, 0, delivery="first", refund=False) == 1
    assert store.release(stream, 0, delivery="first", refund=False) == 0  # once
    assert store.begin(stream, 0, work_deadline_s=0.5, delivery="first").attempt == 2
    # Cancelled by its worker (a shutdown): the attempt is given back.
    assert store.release(stream, 0, delivery="first", refund=True) == 1
    assert store.attempts(stream) == {0: 1}
    assert store.begin(stream, 0, work_deadline_s=0.5, delivery="first").attempt == 2
    # Its whole worker died and the broker itself hands the message back (RabbitMQ's
    # redelivered flag): that delivery takes its live lease over, counted; no other does.
    assert store.begin(stream, 0, work_deadline_s=0.5, delivery="duplicate", takeover=True) == -4
    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="first", takeover=True).attempt == 3
    time.sleep(0.4)
    assert store.begin(stream, 0, work_deadline_s=0.3, delivery="swept").attempt == 4  # lease ran out
    assert store.attempts(stream) == {0: 4}
    assert store.release(stream, 0, delivery="first", refund=True) == 0  # not its lease any more
    assert store.begin("s_" + "0" * 32, 0, work_deadline_s=1, delivery="x") == -3  # no such stream


def test_begin_and_commit_refuse_windows_the_stream_does_not_have(make_client):
    """The queue is an input: -1, a huge number or a non-canonical one never reaches a real stream."""
    client = make_client()
    store: Store = client.store
    stream = _open_without_dispatch(client, 30, 10, 1, grace_s=60)
    result = WindowResult(
        window=0, start=0, end=0, served_by=None, passthrough=False, attempts=1, committed_at=0.0, decisions=[]
    )
    for window in (-1, -1000000, 3, 10**12, "01", "1.0", " 1", "1\n"):
        assert store.begin(stream, window, work_deadline_s=1, delivery="x") == -5, window
        assert store.commit(stream, msgspec.structs.replace(result, window=window), outcome="ranked").code == -5, window
    assert store.begin(stream, 1, work_deadline_s=1, delivery="x") == -2  # a real window, never admitted
    assert store.commit(stream, msgspec.structs.replace(result, window=1), outcome="ranked").code == -2
    assert client.status(stream).windows[0].state == "admitted"
    assert store.snapshot(stream).results == {} and store.counters() == {}


def test_sweep_lock_lets_one_sweeper_per_interval(make_client):
    store = make_client().store
    assert store.try_sweep_lock(0.3) is True
    assert store.try_sweep_lock(0.3) is False
    time.sleep(0.35)
    assert store.try_sweep_lock(0.3) is True


def test_sweep_once_resends_every_overdue_window_of_every_stream_once(make_client, raw_redis, namespace):
    from worker.sweep import broker_probe, sweep_once

    client = make_client()
    probe = broker_probe(client.settings)
    for stream in ("s_" + "1" * 32, "s_" + "2" * 32):
        _open_without_dispatch(client, 30, 10, 3, grace_s=0, stream=stream)
    fresh = _open_without_dispatch(client, 10, 10, 1, grace_s=60, stream="s_" + "3" * 32)
    time.sleep(0.01)

    assert sweep_once(client.store, client.dispatcher, probe, client.settings) == 6
    assert raw_redis.llen(f"{namespace}.cpu") == 6  # the not-yet-due stream sent nothing
    assert sweep_once(client.store, client.dispatcher, probe, client.settings) == 0  # claimed
    assert client.store.due_windows(fresh, retry_in_s=1) == []
    raw_redis.delete(f"{namespace}.cpu")


def test_a_window_still_queued_is_not_resent_a_lost_one_is(make_client, raw_redis, namespace):
    """Under a backlog most overdue windows are only waiting: the sweep re-sends what is nowhere."""
    from worker.sweep import broker_probe, sweep_once

    client = make_client(redeliver_after_s=1)
    probe = broker_probe(client.settings)
    waiting = client.open("payment gateway error", make_candidates(30), window_size=10, first_windows=3)
    lost = client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2)
    queue = f"{namespace}.cpu"
    # Drop the lost stream's second message, as a worker killed between fetch and record would.
    for raw in raw_redis.lrange(queue, 0, -1):
        if f"rq:{lost}:1:".encode() in raw:
            raw_redis.lrem(queue, 1, raw)
    assert probe.queued_windows([queue]) == {(waiting, 0), (waiting, 1), (waiting, 2), (lost, 0)}
    time.sleep(1.1)  # every window is past its enqueue grace

    assert sweep_once(client.store, client.dispatcher, probe, client.settings) == 1
    assert probe.queued_windows([queue]) == {(waiting, 0), (waiting, 1), (waiting, 2), (lost, 0), (lost, 1)}
    assert raw_redis.llen(queue) == 5
    assert client.store.counters().get("windows_redelivered") == 1


def test_one_stream_that_cannot_be_swept_does_not_stop_the_others(make_client, raw_redis, namespace):
    """A stream whose stored device is unusable is skipped; every other stream is still re-sent."""
    from worker.sweep import broker_probe, sweep_once

    client = make_client()
    bad = _open_without_dispatch(client, 10, 10, 1, grace_s=0, stream="s_" + "4" * 32)
    raw_redis.hset(client.store.keys.stream(bad).meta, "device", "quantum")
    good = [_open_without_dispatch(client, 10, 10, 1, grace_s=0, stream="s_" + c * 32) for c in "5678"]
    time.sleep(0.01)

    assert sweep_once(client.store, client.dispatcher, broker_probe(client.settings), client.settings) == 4
    assert {s for s, _ in broker_probe(client.settings).queued_windows([f"{namespace}.cpu"])} == set(good)
    raw_redis.delete(f"{namespace}.cpu")
