"""Coalescing: windows in flight together share one forward pass, and nothing else changes.

The same code path the GPU worker runs, here on the CPU (``--pool threads``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest
from conftest import make_candidates

from worker.engine.coalesce import Coalescer, CoalesceTimeout

QUERIES = [f"payment gateway error {topic}" for topic in ("tls", "dns", "retry", "region", "checkout", "cache")]


class RecordingScorer:
    """A real scoring function (length of the document) that remembers each call's size."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[int] = []
        self.prompts: list[str | None] = []
        self.delay_s = delay_s

    def __call__(self, pairs, *, prompt=None):
        time.sleep(self.delay_s)
        self.calls.append(len(pairs))
        self.prompts.append(prompt)
        return [float(len(prompt or "") * 1_000_000 + len(q) * 1000 + len(d)) for q, d in pairs]


def test_windows_with_different_instructions_flushed_together_are_each_scored_under_their_own():
    from concurrent.futures import ThreadPoolExecutor

    scorer = RecordingScorer()
    coalescer = Coalescer(scorer, max_pairs=1000, max_delay_s=0.3)
    windows = [("q", ["a", "bb"], None), ("qq", ["ccc"], "find runbooks"), ("qqq", ["dddd"], None)]
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda w: coalescer.score(w[0], w[1], prompt=w[2]), windows))
    finally:
        coalescer.close()
    assert coalescer.flushes == 1 and sorted(scorer.calls) == [1, 3]  # one flush, one engine call per prompt
    assert sorted(scorer.prompts, key=str) == [None, "find runbooks"]
    for (query, documents, prompt), scores in zip(windows, results):
        assert scores == [float(len(prompt or "") * 1_000_000 + len(query) * 1000 + len(d)) for d in documents]


def test_windows_arriving_together_share_one_flush():
    scorer = RecordingScorer()
    coalescer = Coalescer(scorer, max_pairs=1000, max_delay_s=0.2)
    barrier = threading.Barrier(6)

    def one_window(k: int) -> list[float]:
        barrier.wait()
        return coalescer.score("q" * (k + 1), [f"doc{j}" * (j + 1) for j in range(5 + k)])

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one_window, range(6)))
    coalescer.close()

    for k, scores in enumerate(results):  # each window gets exactly its own scores back
        assert scores == [float((k + 1) * 1000 + len(f"doc{j}" * (j + 1))) for j in range(5 + k)]
    assert sum(scorer.calls) == sum(5 + k for k in range(6))
    assert len(scorer.calls) < 6


def test_flush_by_size_never_splits_a_window():
    scorer = RecordingScorer(delay_s=0.05)
    coalescer = Coalescer(scorer, max_pairs=10, max_delay_s=0.5)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda k: coalescer.score(f"q{k}", ["d"] * 6), range(4)))
    coalescer.close()
    assert all(len(r) == 6 for r in results)
    assert all(n % 6 == 0 and n <= 12 for n in scorer.calls)


def test_an_engine_error_reaches_every_waiting_window():
    def broken(pairs, *, prompt=None):
        raise RuntimeError("out of memory")

    coalescer = Coalescer(broken, max_pairs=100, max_delay_s=0.05)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(coalescer.score, "q", ["a", "b"]) for _ in range(3)]
        for future in futures:
            with pytest.raises(RuntimeError, match="out of memory"):
                future.result()
    coalescer.close()


def test_a_window_past_its_deadline_times_out():
    coalescer = Coalescer(RecordingScorer(delay_s=0.5), max_pairs=100, max_delay_s=0.0)
    with pytest.raises(CoalesceTimeout):
        coalescer.score("q", ["a"], deadline=time.monotonic() + 0.05)
    coalescer.close()


def score_streams(client, candidates) -> list[bytes]:
    """Open every stream at once (so their windows are in flight together), then read them all."""
    streams = [client.open(q, candidates, window_size=10, first_windows=3) for q in QUERIES]
    return [msgspec.json.encode(client.pull(s, 0, len(candidates), timeout=90).rows) for s in streams]


@pytest.mark.slow
def test_same_decisions_with_and_without_coalescing(start_worker, make_client):
    candidates = make_candidates(30)
    no_cache = {"RERANKQ_PAIR_CACHE": "false"}
    plain = start_worker(env={**no_cache, "RERANKQ_COALESCE": "false"})
    client = make_client()
    expected = score_streams(client, candidates)
    plain.stop()

    coalescing = start_worker(
        env={**no_cache, "RERANKQ_COALESCE_DELAY_MS": "50"},
        args=["--device", "cpu", "--pool", "threads", "--threads", "6", "--loglevel", "DEBUG"],
    )
    got = score_streams(client, candidates)

    assert "coalesced" in coalescing.log()  # several windows did share a forward pass
    for a, b in zip(expected, got):
        rows_a, rows_b = msgspec.json.decode(a), msgspec.json.decode(b)
        assert [r["decision"]["id"] for r in rows_a] == [r["decision"]["id"] for r in rows_b]
        assert [r["decision"]["served_by"] for r in rows_a] == [r["decision"]["served_by"] for r in rows_b]
        for ra, rb in zip(rows_a, rows_b):
            assert ra["decision"]["score"] == pytest.approx(rb["decision"]["score"], abs=1e-5)


@pytest.mark.slow
def test_cache_and_coalescing_together_keep_decisions(start_worker, make_client):
    candidates = make_candidates(30)
    start_worker(env={"RERANKQ_COALESCE_DELAY_MS": "20"}, args=["--device", "cpu", "--pool", "threads"])
    client = make_client()
    first = score_streams(client, candidates)
    calls = client.store.counters().get("provider_calls:0:local", 0)
    second = score_streams(client, candidates)
    assert client.store.counters().get("provider_calls:0:local", 0) == calls  # all from the cache
    assert first == second
