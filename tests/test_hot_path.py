"""The window hot path's saved round trips keep their meaning, against a real Redis.

The test plays the worker in process (``WindowScorer.process``, the task body) with a provider
that imports no model, so each step happens exactly when the test says: a reader's wait reads
the commit that woke it; a pull right after ``open`` reads a window committed in between, at
once; the counters and cache entries that ride on a commit's round trip land with it, also
after Redis lost its scripts (a restart).
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import make_candidates

from kernel.settings import load_settings
from producer import RerankClient
from worker.runtime import Runtime


class NotSent:
    """The test runs each window itself: no message needs to reach a queue."""

    def send(self, *args: object, **kwargs: object) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def parts(base_env):
    settings = load_settings({**base_env, "RERANKQ_RERANKER_PROVIDER": "delivery_providers:FastProvider"})
    client = RerankClient(settings, dispatcher=NotSent())
    runtime = Runtime(settings)
    yield client, runtime
    runtime.close()
    client.close()


def calls(client: RerankClient) -> int:
    return sum(v for k, v in client.store.counters().items() if k.startswith("provider_calls:"))


def test_a_reader_woken_by_a_commit_reads_that_commit(parts):
    client, runtime = parts
    stream = client.open("payment gateway error", make_candidates(20), window_size=10)
    before = client.store.snapshot(stream)
    worker = threading.Timer(0.3, lambda: runtime.scorer.process(stream, 0, delivery="d0"))
    start = time.monotonic()
    worker.start()

    woken = client.store.wait_and_snapshot(stream, before.last_event_id, 10)

    assert 0.25 <= time.monotonic() - start < 5  # it waited for the commit, and no longer
    assert list(woken.results) == [0]
    worker.join()


def test_a_wait_that_times_out_still_reads(parts):
    client, _ = parts
    stream = client.open("payment gateway error", make_candidates(20), window_size=10)
    before = client.store.snapshot(stream)
    start = time.monotonic()

    after = client.store.wait_and_snapshot(stream, before.last_event_id, 0.3)

    assert 0.25 <= time.monotonic() - start < 5
    assert after.results == {} and after.admitted == 1 and after.n_candidates == 20


def test_a_pull_right_after_open_reads_a_window_committed_in_between_at_once(parts):
    client, runtime = parts
    stream = client.open("payment gateway error", make_candidates(20), window_size=10)
    assert runtime.scorer.process(stream, 0, delivery="d0") == "committed"
    start = time.monotonic()

    page = client.pull(stream, 0, 10, timeout=10)

    assert time.monotonic() - start < 1
    assert [r.rank for r in page.rows] == list(range(1, 11)) and page.pending_windows == 0


def test_a_pull_right_after_open_that_needs_more_windows_admits_them(parts):
    client, runtime = parts
    stream = client.open("payment gateway error", make_candidates(30), window_size=10)

    page = client.pull(stream, 0, 25, timeout=0.5)  # no worker ran yet: what it learnt is sent

    assert page.rows == [] and page.pending_windows == 3
    for window in range(3):
        assert runtime.scorer.process(stream, window, delivery=f"d{window}") == "committed"
    assert len(client.pull(stream, 0, 25, timeout=10).rows) == 25


def test_what_rides_on_a_commit_lands_with_it_even_after_redis_lost_its_scripts(parts, raw_redis):
    client, runtime = parts
    stream = client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2)
    assert runtime.scorer.process(stream, 0, delivery="d0") == "committed"
    raw_redis.script_flush()  # as after a restart: the cache's script must be loaded again

    assert runtime.scorer.process(stream, 1, delivery="d1") == "committed"

    counters = client.store.counters()
    assert calls(client) == 2 and counters["windows_committed"] == 2
    assert counters["pair_cache_misses"] == 20 and "pair_cache_hits" not in counters
    # The scores were cached: the same query over the same documents costs no provider call.
    again = client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2)
    for window in range(2):
        assert runtime.scorer.process(again, window, delivery=f"again{window}") == "committed"
    assert calls(client) == 2 and client.store.counters()["pair_cache_hits"] == 20


def test_a_poll_right_after_open_reads_what_is_committed(parts):
    client, runtime = parts
    stream = client.open("payment gateway error", make_candidates(20), window_size=10)
    assert runtime.scorer.process(stream, 0, delivery="d0") == "committed"

    page = client.pull(stream, 0, 10, timeout=0)

    assert len(page.rows) == 10
