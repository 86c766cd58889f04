"""A window that kills its process every time ends `failed` after N attempts, visibly."""

from __future__ import annotations

import msgspec
import pytest
from conftest import BROKERS, make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete

from producer import Failed

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_window_that_kills_every_process_commits_failed_after_max_attempts(
    start_worker, make_client, tmp_path, raw_redis, broker
):
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(env=provider_env("SuicideProvider", mark_dir=marks, max_attempts=2))
    client = make_client(max_attempts=2)
    stream = client.open("payment gateway error", make_candidates(5), window_size=5)

    page = pull_until_complete(client, stream, 5, timeout_s=90)

    # Two attempts reached the provider (and died); the third delivery gave up without scoring.
    assert len(list(marks.iterdir())) == 2
    assert [r.kind for r in page.rows] == ["failed"] * 5
    assert all(isinstance(r.decision, Failed) and "poison" in r.decision.reason for r in page.rows)
    window = client.status(stream).windows[0]
    assert window.state == "committed" and window.failed == 5
    assert window.attempts == 2 and window.reason == "poison: gave up after 2 attempts"
    assert commits_per_window(raw_redis, client, stream) == {0: 1}
    assert client.store.counters().get("windows_poisoned") == 1
    log = worker.log()
    assert "window_poisoned" in log and "window_attempt_again" in log
    assert worker.proc.poll() is None, "the worker survives; only its children died"


def test_a_window_that_cannot_be_decoded_commits_failed_once(start_worker, make_client, raw_redis):
    """A stream whose stored spec or candidate cannot be decoded once failed the task before the
    attempt cap was consulted: never committed, never `failed`, re-sent forever. Now it fails
    once, with a reason, and readers and the sweep serve every other stream as before."""
    from test_sweep import _open_without_dispatch

    client = make_client(redeliver_after_s=2)
    bad_spec = _open_without_dispatch(client, 10, 10, 1, grace_s=0, stream="s_" + "a" * 32)
    bad_candidate = _open_without_dispatch(client, 20, 10, 2, grace_s=0, stream="s_" + "b" * 32)
    healthy = _open_without_dispatch(client, 10, 10, 1, grace_s=0, stream="s_" + "c" * 32)
    raw_redis.set(client.store.keys.stream(bad_spec).spec, b"\xc1 not msgpack")
    raw_redis.lset(
        client.store.keys.stream(bad_candidate).candidates, 13, msgspec.msgpack.encode({"id": "c13", "text": 5})
    )  # decodes, but not as a Candidate
    start_worker(env=provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1))

    for stream in (bad_spec, bad_candidate, healthy):
        pull_until_complete(client, stream, 20, timeout_s=30)
    spec_window = client.status(bad_spec).windows[0]
    assert spec_window.failed == 10 and "undecodable stream spec" in spec_window.reason
    assert spec_window.attempts == 1
    cand_windows = client.status(bad_candidate).windows
    assert cand_windows[0].ranked == 10  # the other window of that stream is scored as usual
    assert cand_windows[1].failed == 10 and "undecodable candidate 3" in cand_windows[1].reason
    rows = client.pull(bad_candidate, 0, 20, timeout=1).rows
    assert [r.id for r in rows[10:]] == [f"c{i}" for i in range(10, 20)]  # ids kept, fusion order
    assert all(r.kind == "failed" and r.reason.startswith("undecodable") for r in rows[10:])
    assert client.status(healthy).windows[0].ranked == 10
    assert commits_per_window(raw_redis, client, bad_spec) == {0: 1}
    assert client.store.counters().get("windows_failed") == 2
