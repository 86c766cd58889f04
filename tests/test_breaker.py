"""The circuit breaker: its Lua state machine against real Redis, then real workers.

The worker tests count the requests a real rerank server saw: an open breaker must make
no call at all, in any worker process, until one half-open probe closes it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import make_candidates
from delivery_helpers import wait_committed
from rerank_servers import RerankServer

from kernel.keys import Keys
from worker.chain.breaker import Breaker, Gate

# -- the state machine ----------------------------------------------------------

# Long enough that a busy machine does not see it pass between two calls.
COOLDOWN_S = 0.6


@pytest.fixture
def breaker(raw_redis, namespace) -> Breaker:
    return Breaker(raw_redis, Keys(namespace), failures=3, cooldown_s=COOLDOWN_S)


def test_opens_after_k_consecutive_failures_only(breaker):
    for _ in range(2):
        assert breaker.record_failure("0:tei") == "closed"
    breaker.record_success("0:tei")  # a success in between: not consecutive
    assert breaker.state("0:tei") == {}
    assert [breaker.record_failure("0:tei") for _ in range(3)] == ["closed", "closed", "opened"]
    assert breaker.acquire("0:tei", probe_lease_s=5) is Gate.SKIP
    assert breaker.acquire("1:cohere", probe_lease_s=5) is Gate.CALL  # per member
    key = Keys(breaker.keys.namespace).breaker("0:tei")
    assert breaker.client.pttl(key) > 0  # a breaker never lingers forever


def test_after_cooldown_exactly_one_concurrent_caller_gets_the_probe(breaker):
    for _ in range(3):
        breaker.record_failure("0:tei")
    time.sleep(COOLDOWN_S + 0.05)
    gates: list[Gate] = []
    start = threading.Barrier(12)

    def caller() -> None:
        start.wait()
        gates.append(breaker.acquire("0:tei", probe_lease_s=5))

    threads = [threading.Thread(target=caller) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gates.count(Gate.PROBE) == 1 and gates.count(Gate.SKIP) == 11
    breaker.record_success("0:tei")
    assert breaker.acquire("0:tei", probe_lease_s=5) is Gate.CALL


def test_failed_probe_opens_for_another_cooldown(breaker):
    for _ in range(3):
        breaker.record_failure("0:tei")
    time.sleep(COOLDOWN_S + 0.05)
    assert breaker.acquire("0:tei", probe_lease_s=5) is Gate.PROBE
    assert breaker.record_failure("0:tei") == "opened"  # one failure is enough when half-open
    assert breaker.acquire("0:tei", probe_lease_s=5) is Gate.SKIP
    time.sleep(COOLDOWN_S + 0.05)
    assert breaker.acquire("0:tei", probe_lease_s=5) is Gate.PROBE


def test_a_probe_whose_holder_died_lapses(breaker):
    for _ in range(3):
        breaker.record_failure("0:tei")
    time.sleep(COOLDOWN_S + 0.05)
    assert breaker.acquire("0:tei", probe_lease_s=0.6) is Gate.PROBE
    assert breaker.acquire("0:tei", probe_lease_s=0.6) is Gate.SKIP
    time.sleep(0.65)  # the holder never reported back
    assert breaker.acquire("0:tei", probe_lease_s=0.6) is Gate.PROBE


# -- real workers ---------------------------------------------------------------


@pytest.fixture
def tei() -> Iterator[RerankServer]:
    server = RerankServer("tei").start()
    yield server
    server.stop()


def chain_env(tei: RerankServer, *, failures: int, cooldown_s: float) -> dict[str, str]:
    return {
        "RERANKQ_RERANKER_PROVIDER": "tei",
        "RERANKQ_RERANKER_URL": tei.url,
        "RERANKQ_RERANKER_TIMEOUT_S": "1",
        "RERANKQ_RERANKER_MAX_RETRIES": "0",
        "RERANKQ_RERANKER_1_PROVIDER": "rrf",
        "RERANKQ_BREAKER_FAILURES": str(failures),
        "RERANKQ_BREAKER_COOLDOWN_S": str(cooldown_s),
    }


def score_windows(client, n_windows: int, size: int = 4) -> tuple[str, list[str], list[list[str]]]:
    """Open a stream of ``n_windows`` windows, wait for all; (id, served_by, failovers) per window."""
    # Texts unique to this stream, so the pair-score cache never answers for the member.
    tag = f"w{time.monotonic_ns()}"
    stream = client.open(
        "gateway error",
        make_candidates(n_windows * size, prefix=tag, text=tag + " gateway error {i}"),
        window_size=size,
        first_windows=n_windows,
    )
    wait_committed(client, stream)
    results = client.store.snapshot(stream).results
    return stream, [results[w].served_by for w in range(n_windows)], [results[w].failovers for w in range(n_windows)]


def test_open_breaker_makes_no_call_and_the_probe_closes_it(tei, start_worker, make_client):
    tei.mode = "500"
    worker = start_worker(env=chain_env(tei, failures=2, cooldown_s=3), drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client()

    _, served, failovers = score_windows(client, 5)
    opened_at = time.monotonic()
    assert served == ["1:rrf"] * 5
    assert tei.count == 2  # two failures opened it; three windows were skipped without a call
    assert sorted(f[0] for f in failovers) == ["0:tei: breaker_open"] * 3 + ["0:tei: http_500"] * 2
    counters = client.store.counters()
    assert counters["provider_calls:0:tei"] == 2 and counters["failovers:0:tei"] == 5

    tei.mode = "ok"  # the member recovers; the breaker only learns it from a probe
    time.sleep(max(0.0, opened_at + 3.1 - time.monotonic()))
    _, served, failovers = score_windows(client, 3)
    assert served == ["0:tei"] * 3 and failovers == [[], [], []]
    assert tei.count == 5  # the probe, then two calls through the closed breaker
    log = worker.log()
    assert "breaker_opened" in log and "breaker_probe" in log and "breaker_closed" in log
    # One name for the member everywhere: the endpoint digest stays inside the breaker's key.
    for event in ("breaker_opened", "breaker_probe", "breaker_closed", "reranker_failover"):
        lines = [line for line in log.splitlines() if event in line]
        assert lines and all(re.search(r"member=0:tei(\s|$)", line) for line in lines), (event, lines)
    assert not re.search(r"0:tei:[0-9a-f]{8}", log)


def test_the_breaker_is_shared_by_worker_processes(tei, start_worker, make_client):
    tei.mode = "500"
    env = chain_env(tei, failures=2, cooldown_s=60)
    first = start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client()
    _, served, _ = score_windows(client, 3)
    assert served == ["1:rrf"] * 3 and tei.count == 2
    first.stop()

    # A fresh process has no memory of its own: only Redis can tell it the member is open.
    second = start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    _, served, failovers = score_windows(client, 3)
    assert served == ["1:rrf"] * 3
    assert failovers == [["0:tei: breaker_open"]] * 3
    assert tei.count == 2  # still two: the second process made no call
    assert "breaker_open" in second.log()
