"""A window that kills its process every time ends `failed` after N attempts, visibly."""

from __future__ import annotations

from conftest import make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete

from producer import Failed


def test_window_that_kills_every_process_commits_failed_after_max_attempts(start_worker, make_client, tmp_path,
                                                                           raw_redis):
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
