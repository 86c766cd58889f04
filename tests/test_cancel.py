"""Cancelling a stream: every window not yet committed is committed as cancelled at once, no
provider is called for it after, the stream reads complete, and the cancelled windows' fair
share comes back. Through a real Redis and a real worker, the client, and ``rerankq cancel``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import rerankq
from conftest import make_candidates
from delivery_helpers import provider_env, pull_until_complete, wait_for

from kernel.fair_share import member
from producer import RerankClient, StreamNotFound
from worker.embedded.worker_process import WorkerProcess


def scored_windows(mark_dir: Path, stream: str) -> list[int]:
    """The windows the provider was called for (a mark each call: ``<pid>.<stream>.<window>``)."""
    return sorted(int(p.name.rsplit(".", 1)[1]) for p in mark_dir.iterdir() if p.name.split(".")[1] == stream)


def test_a_stream_cancelled_mid_way_reads_complete_and_nothing_is_scored_after(
    start_worker: Callable[..., WorkerProcess], make_client: Callable[..., RerankClient], tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    start_worker(provider_env("SlowProvider", mark_dir=marks, sleep_s=0.5))
    client = make_client()
    stream = client.open("a long job", make_candidates(40), window_size=4, first_windows=10)
    wait_for(lambda: client.store.snapshot(stream).results, 30, "the first window to commit")

    outcome = client.cancel(stream)
    assert outcome.cancelled_windows and outcome.n_windows == 10
    page = client.pull(stream, 0, 40, timeout=0)
    assert page.complete and page.total == 40
    kinds = [row.kind for row in page.rows]
    first_cancelled = kinds.index("cancelled")
    # The rows committed before the cancel, then only cancelled ones, in fusion order.
    assert set(kinds[first_cancelled:]) == {"cancelled"}
    assert {row.window for row in page.rows if row.kind == "cancelled"} == set(outcome.cancelled_windows)
    assert all(row.reason == "cancelled" for row in page.rows if row.kind == "cancelled")
    assert [row.id for row in page.rows if row.kind == "cancelled"] == [
        f"c{i}" for w in outcome.cancelled_windows for i in range(4 * w, 4 * w + 4)
    ]
    after_cancel = client.store.snapshot(stream).results

    # Another stream on the same queue completes only once the worker has taken every message
    # sent before it: the cancelled windows' messages are all behind us then.
    later = client.open("after the cancel", make_candidates(4, prefix="l"), window_size=4)
    pull_until_complete(client, later, 4)
    pull_until_complete(client, client.open("and one more", make_candidates(4, prefix="m"), window_size=4), 4)

    # Only windows a delivery had begun before the cancel were ever given to the provider (a
    # begin after it finds the window committed), and a commit that came after lost the race.
    begun_before = set(client.store.attempts(stream))
    assert set(scored_windows(marks, stream)) <= begun_before
    assert len(begun_before) < outcome.n_windows - 1
    assert client.store.snapshot(stream).results == after_cancel
    assert client.status(stream).windows[-1].cancelled == 4

    again = client.cancel(stream)  # idempotent: nothing left to cancel
    assert again.cancelled_windows == []
    assert client.fair_share.in_flight("cpu").keys().isdisjoint({member(stream, w) for w in range(10)})


def test_cancel_gives_back_the_fair_share_of_windows_sent_and_waiting(make_client: Callable[..., RerankClient]) -> None:
    client = make_client(tenant_queued_windows=2)
    stream = client.open("a backlog", make_candidates(10), window_size=1, first_windows=10)
    members = [member(stream, w) for w in range(10)]
    assert len(client.fair_share.deferred("cpu", members)) == 8  # two sent, eight waiting
    assert set(client.fair_share.in_flight("cpu")) & set(members)

    assert client.cancel(stream).cancelled_windows == list(range(10))
    assert not client.fair_share.deferred("cpu", members)
    assert not set(client.fair_share.in_flight("cpu")) & set(members)
    assert client.progress([stream])[stream].complete
    # Not one window is left for a deeper pull to admit and send.
    page = client.pull(stream, 0, 10, timeout=0)
    assert page.complete and [row.kind for row in page.rows] == ["cancelled"] * 10
    assert client.store.counters().get("windows_cancelled") == 10

    with pytest.raises(StreamNotFound):
        client.cancel("s_" + "0" * 32)


def test_rerankq_cancel_cancels_once_and_names_a_missing_stream(
    make_client: Callable[..., RerankClient], base_env: dict[str, str]
) -> None:
    client = make_client()
    stream = client.open("nobody serves this", make_candidates(12), window_size=4, first_windows=1)
    done = rerankq(["cancel", stream], base_env)
    assert done.returncode == 0, done.stderr
    assert f"cancelled 3 of 3 windows of {stream}" in done.stdout
    assert client.pull(stream, 0, 12, timeout=0).complete

    again = rerankq(["cancel", stream], base_env)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout

    missing = rerankq(["cancel", "s_" + "0" * 32], base_env)
    assert missing.returncode == 1
    assert "does not exist" in (missing.stderr + missing.stdout)
    assert len((missing.stderr + missing.stdout).strip().splitlines()) == 1


def test_rerankq_pull_keeps_its_columns_for_long_ids_and_cancelled_rows(
    make_client: Callable[..., RerankClient], base_env: dict[str, str]
) -> None:
    client = make_client()
    candidates = [{"id": f"kb-article-{i:04d}-revision-{'x' * i}", "text": f"note {i}"} for i in range(4)]
    stream = client.open("columns", candidates, window_size=4)
    client.cancel(stream)
    done = rerankq(["pull", stream, "--limit", "4"], base_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("rank"))
    rows = [line for line in lines if line.lstrip()[:1].isdigit()]
    assert len(rows) == 4 and all(" cancelled " in row for row in rows)
    column = header.index("document")
    for row, candidate in zip(rows, candidates):
        assert row[column:].startswith("note "), (header, row)
        assert candidate["id"] in row
