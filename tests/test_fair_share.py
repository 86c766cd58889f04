"""Each tenant's fair share of a device queue, counted by cost: one tenant's backlog, of many
windows or of costly ones, holds another tenant's window back by at most its share; the windows
past a share wait in Redis and all of them commit; what a crash leaves, the sweep repairs; and
a window that could outlive the task's time limit is refused at open."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import BROKERS, make_candidates
from delivery_helpers import patient
from gateway_helpers import GatewayProcess, write_keys

from kernel.fair_share import member
from producer import RerankClient, ValidationError
from worker.embedded.worker_process import WorkerProcess

SLOW = {"RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:FastProvider", "TEST_PROVIDER_SLEEP_S": "0.15"}


def wait_until(done: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + patient(timeout_s)
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def committed_at(client: RerankClient, stream_id: str) -> list[float]:
    return [r.committed_at for r in client.store.snapshot(stream_id).results.values()]


def wait_all(client: RerankClient, stream_ids: list[str], timeout_s: float = 90) -> None:
    for stream_id in stream_ids:
        status = client.status(stream_id)
        page = client.pull(stream_id, 0, status.n_candidates, timeout=timeout_s)
        assert page.complete, (stream_id, page)


def a_flood_and_b(
    client: RerankClient, *, streams: int, windows: int, window_size: int, text: str
) -> tuple[list[str], str, float]:
    """Tenant A opens its backlog, then tenant B one window; returns A's streams, B's, and when B opened."""
    flood = [
        client.open(
            f"a flood {i}",
            make_candidates(windows * window_size, prefix=f"a{i}-", text=text),
            tenant="tenant-a",
            window_size=window_size,
            first_windows=windows,
        )
        for i in range(streams)
    ]
    opened = time.time()
    b = client.open("b asks", make_candidates(2, prefix="b"), tenant="tenant-b", window_size=2)
    return flood, b, opened


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_tenants_many_windows_hold_anothers_back_by_its_share_and_all_commit(
    start_worker: Callable[..., WorkerProcess], make_client: Callable[..., RerankClient], broker: str
) -> None:
    share = {"RERANKQ_TENANT_QUEUED_WINDOWS": "2"}
    start_worker(env={**SLOW, **share})
    client = make_client(tenant_queued_windows=2)
    flood, b, opened = a_flood_and_b(client, streams=3, windows=8, window_size=1, text="note {i}")
    page = client.pull(b, 0, 2, timeout=60)
    assert page.complete
    b_done = max(committed_at(client, b))
    # B's window was sent behind at most A's share (2 windows); A's later ones waited in Redis.
    a_before_b = [t for s in flood for t in committed_at(client, s) if opened < t < b_done]
    assert len(a_before_b) <= 2, f"tenant A committed {len(a_before_b)} windows while tenant B waited"
    # Nothing of A's backlog is lost, and nothing is left counted once it drained.
    wait_all(client, flood)
    wait_until(lambda: not client.fair_share.in_flight("cpu"))
    assert client.store.client.zcard(client.store.keys.fair_share("cpu").waiting) == 0


def test_the_share_counts_cost_not_windows(
    start_worker: Callable[..., WorkerProcess], make_client: Callable[..., RerankClient]
) -> None:
    # Windows of four 2,000-character documents cost about 8,000 tokens: a share of 10,000
    # holds one of them, though the share in windows would take a hundred.
    share = {"RERANKQ_TENANT_QUEUED_WINDOWS": "100", "RERANKQ_TENANT_QUEUED_TOKENS": "10000"}
    start_worker(env={**SLOW, **share})
    client = make_client(tenant_queued_windows=100, tenant_queued_tokens=10000)
    long = "payment gateway error {i} " + "the checkout service returned 502 " * 60
    flood, b, opened = a_flood_and_b(client, streams=1, windows=8, window_size=4, text=long)
    assert client.pull(b, 0, 2, timeout=60).complete
    b_done = max(committed_at(client, b))
    a_before_b = [t for s in flood for t in committed_at(client, s) if opened < t < b_done]
    assert len(a_before_b) <= 1, f"tenant A committed {len(a_before_b)} costly windows while tenant B waited"
    wait_all(client, flood)


def test_the_sweep_gives_back_a_share_never_returned_and_sends_a_window_released_but_never_sent(
    start_worker: Callable[..., WorkerProcess], make_client: Callable[..., RerankClient]
) -> None:
    fast = {
        "RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:FastProvider",
        "RERANKQ_TENANT_QUEUED_WINDOWS": "1",
        "RERANKQ_REDELIVER_AFTER_S": "2",
        "RERANKQ_SWEEP_INTERVAL_S": "0.5",
    }
    client = make_client(tenant_queued_windows=1, redeliver_after_s=2)
    fair = client.fair_share
    # A worker killed between a commit and giving its share back: the share stays counted.
    start_worker(env=fast)
    done = client.open("done", make_candidates(2), tenant="acme", window_size=2)
    assert client.pull(done, 0, 2, timeout=30).complete
    wait_until(lambda: not fair.in_flight("cpu"))  # the worker gives the share back after its commit
    assert fair.enter(done, device="cpu", bucket="acme/interactive", lane="interactive",
                      expire_at_ms=2**42, windows=[0], costs=[10]) == [0]  # fmt: skip
    held = client.open("held back", make_candidates(2), tenant="acme", window_size=2)
    assert fair.deferred("cpu", [member(held, 0)]) == {member(held, 0)}
    # Nothing commits for acme any more; the sweep finds the share whose window is committed.
    assert client.pull(held, 0, 2, timeout=30).complete

    # A window released (a commit gave its share back) whose message was never sent.
    other = client.open("other", make_candidates(2), tenant="beta", window_size=2, device="gpu")
    lost = client.open("lost", make_candidates(2), tenant="beta", window_size=2, device="gpu")
    assert fair.deferred("gpu", [member(lost, 0)]) == {member(lost, 0)}
    released = fair.done("gpu", [member(other, 0)])  # as if the window had committed, then the process died
    assert [(r.stream_id, r.window) for r in released] == [(lost, 0)]
    # No worker serves the gpu queue yet: one that does starts now.
    start_worker(env={**fast, "RERANKQ_CPU_QUEUE": client.settings.queues.gpu_queue})
    assert client.pull(lost, 0, 2, timeout=30).complete
    assert client.pull(other, 0, 2, timeout=30).complete


def test_a_window_that_could_outlive_the_time_limit_is_refused_at_open(
    make_client: Callable[..., RerankClient], raw_redis: Any, namespace: str
) -> None:
    # 100 tokens a second for 90% of 300 s: 27,000 tokens a window at most.
    client = make_client(scoring_tokens_per_s=100)
    items = make_candidates(25, text="payment gateway error {i} " + "the checkout service returned 502 " * 60)
    with pytest.raises(ValidationError) as err:
        client.open("why did checkout fail", items)
    assert err.value.field == "window_size" and "RERANKQ_SCORING_TOKENS_PER_S" in str(err.value)
    with pytest.raises(ValidationError) as err:
        client.open("why did checkout fail", items[:5], long_documents="passages", window_size=5)
    assert err.value.field == "max_passages"
    assert not list(raw_redis.scan_iter(match=f"{namespace}:*"))
    assert client.open("why did checkout fail", items, window_size=10)


def test_through_the_gateway_b_is_answered_while_a_floods_and_a_past_its_backlog_is_refused(
    start_worker: Callable[..., WorkerProcess],
    make_client: Callable[..., RerankClient],
    base_env: dict[str, str],
    tmp_path: Path,
) -> None:
    share = {
        "RERANKQ_TENANT_QUEUED_WINDOWS": "2",
        "RERANKQ_TENANT_MAX_WAITING": "100",
        "RERANKQ_GATEWAY_DRAIN_SAMPLE_S": "0.1",
    }
    env = {**base_env, **SLOW, **share, "TEST_PROVIDER_SLEEP_S": "0.1"}
    keys = write_keys(
        tmp_path / "keys.json", [{"name": "a", "tenant": "tenant-a"}, {"name": "b", "tenant": "tenant-b"}]
    )
    start_worker(env=env)
    gateway = GatewayProcess(env, tmp_path / "gateway.log", "--keys-file", str(tmp_path / "keys.json")).start()
    client = make_client(tenant_queued_windows=2)
    auth = {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            # Tenant A: three stream opens of 33 one-candidate windows, answered 201 at once: 99
            # windows, at most 97 of them waiting, stay under A's bound of 100 however fresh the
            # gateway's sample of A's backlog is.
            flood = []
            for i in range(3):
                opened = http.post(
                    "/v1/streams",
                    json={
                        "query": f"a flood {i}",
                        "candidates": make_candidates(33, prefix=f"a{i}-"),
                        "window_size": 1,
                        "first_windows": 33,
                    },
                    headers=auth["a"],
                )
                assert opened.status_code == 201, opened.text
                flood.append(opened.json()["stream_id"])
            started = time.time()
            answer = http.post(
                "/v2/rerank", json={"model": "m", "query": "b asks", "documents": ["x", "y"]}, headers=auth["b"]
            )
            answered = time.time()
            assert answer.status_code == 200, answer.text
            a_meanwhile = [t for s in flood for t in committed_at(client, s) if started < t < answered]
            assert len(a_meanwhile) <= 2, f"tenant A committed {len(a_meanwhile)} windows while tenant B waited"
            # A opens 40 more windows at a time until its backlog is past its bound: A is then
            # refused, B is not.
            more = {"query": "a again", "candidates": make_candidates(40), "window_size": 1, "first_windows": 40}
            deadline = time.monotonic() + patient(10)
            while (refused := http.post("/v1/streams", json=more, headers=auth["a"])).status_code != 429:
                assert time.monotonic() < deadline, refused.text
                time.sleep(0.1)
            assert "tenant has" in refused.json()["error"]["message"] and refused.headers["retry-after"]
            assert http.post("/v1/streams", json={**more, "query": "b too"}, headers=auth["b"]).status_code == 201
    finally:
        gateway.stop()


def test_a_stream_without_a_tenant_is_a_bucket_of_its_own(
    start_worker: Callable[..., WorkerProcess], make_client: Callable[..., RerankClient]
) -> None:
    # A pipeline on RerankClient with no tenant: each stream has its own share, so one stream's
    # backlog holds another stream back by at most that share.
    start_worker(env={**SLOW, "RERANKQ_TENANT_QUEUED_WINDOWS": "2"})
    client = make_client(tenant_queued_windows=2)
    flood = client.open("a backlog", make_candidates(10, text="note {i}"), window_size=1, first_windows=10)
    assert client.fair_share.deferred("cpu", [member(flood, w) for w in range(10)]) == {
        member(flood, w) for w in range(2, 10)
    }
    opened = time.time()
    other = client.open("another stream", make_candidates(2, prefix="o"), window_size=2)
    assert client.pull(other, 0, 2, timeout=60).complete
    other_done = max(committed_at(client, other))
    before_other = [t for t in committed_at(client, flood) if opened < t < other_done]
    assert len(before_other) <= 2, f"the first stream committed {len(before_other)} windows while the other waited"
    wait_all(client, [flood])


def test_the_gateway_answers_429_to_a_tenant_whose_waiting_windows_cost_past_its_bound(
    base_env: dict[str, str], make_client: Callable[..., RerankClient], tmp_path: Path
) -> None:
    # No worker: nothing commits, so what A opens past its share waits, and its cost adds up.
    env = {
        **base_env,
        "RERANKQ_TENANT_QUEUED_WINDOWS": "1",
        "RERANKQ_TENANT_MAX_WAITING_TOKENS": "20000",
        "RERANKQ_GATEWAY_DRAIN_SAMPLE_S": "0.1",
    }
    keys = write_keys(
        tmp_path / "keys.json", [{"name": "a", "tenant": "tenant-a"}, {"name": "b", "tenant": "tenant-b"}]
    )
    gateway = GatewayProcess(env, tmp_path / "gateway.log", "--keys-file", str(tmp_path / "keys.json")).start()
    auth = {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
    long = "payment gateway error {i} " + "the checkout service returned 502 " * 60
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            # Ten windows of four 2,000-character documents: about 8,000 tokens each, nine waiting.
            body = {"query": "a asks", "candidates": make_candidates(40, text=long), "window_size": 4}
            assert http.post("/v1/streams", json={**body, "first_windows": 10}, headers=auth["a"]).status_code == 201
            few = {"query": "one more", "candidates": make_candidates(1), "window_size": 1}
            deadline = time.monotonic() + patient(10)
            # Nine windows are under RERANKQ_TENANT_MAX_WAITING (5000): the cost is what refuses.
            while (refused := http.post("/v1/streams", json=few, headers=auth["a"])).status_code != 429:
                assert refused.status_code == 201, refused.text
                assert time.monotonic() < deadline, "tenant A was never refused"
                time.sleep(0.1)
            assert "20000 tokens" in refused.json()["error"]["message"] and refused.headers["retry-after"]
            assert http.post("/v1/streams", json={**few, "query": "b"}, headers=auth["b"]).status_code == 201
    finally:
        gateway.stop()
    client = make_client()
    waiting = client.store.client.hget(client.store.keys.fair_share("cpu").queued, "tenant-a/interactive c")
    assert int(waiting) > 20000
