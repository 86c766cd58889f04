"""The windowed rerank queue end to end: a real Redis, a real Celery worker, a tiny real model."""

from __future__ import annotations

import math
import os
import uuid

import msgspec
import pytest
from conftest import BROKERS, ROOT, make_candidates, queue_env_for

from kernel.celery_config import TASK_NAME
from producer import Failed, Filtered, Ranked, RerankClient, load_settings
from worker.embedded.redis_server import EmbeddedRedis, bundled_redis_server_binary, redis_server_binary
from worker.embedded.worker_process import WorkerProcess


@pytest.fixture(scope="module", params=["system", "bundled-6.2"])
def redis_server(request):
    """The flow runs on the machine's redis-server (7.x here) and on the 6.2 binary the dev
    extra ships, the oldest server rerankq supports (managed Redis 6.2 is still common)."""
    binary = redis_server_binary() if request.param == "system" else bundled_redis_server_binary()
    server = EmbeddedRedis(binary=binary).start()
    yield server
    server.stop()


class Flow:
    """One worker with the tiny model, shared by the module's tests that need no other: each test
    asks its own query (the pair cache keys on it, so no test reads another's scores) and counts
    provider calls from where it started."""

    def __init__(self, env: dict[str, str], make_client) -> None:
        self.env = env
        self._make_client = make_client

    def client(self):
        return self._make_client(self.env)


@pytest.fixture(scope="module")
def flow(redis_server, tiny_model_dir, tmp_path_factory):
    namespace = "f" + uuid.uuid4().hex[:10]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(queue_env_for(redis_server.url, namespace, tiny_model_dir))
    worker = WorkerProcess.rerankq(env, tmp_path_factory.mktemp("flow") / "worker.log", "--device", "cpu", cwd=ROOT)
    worker.start()
    clients: list[RerankClient] = []

    def make(env: dict[str, str]) -> RerankClient:
        clients.append(RerankClient(load_settings(env)))
        return clients[-1]

    yield Flow(env, make)
    for client in clients:
        client.close()
    worker.kill()


@pytest.fixture
def query(request) -> str:
    """A query of this test's own (the shared worker's pair cache keys on the query)."""
    return f"payment gateway error ({request.node.name})"


def test_the_server_is_the_one_asked_for(redis_server, raw_redis, request):
    version = raw_redis.info("server")["redis_version"]
    if "bundled-6.2" in request.node.callspec.id:
        assert version.startswith("6.2.")


def provider_calls(client, member: str = "0:local") -> int:
    return client.store.counters().get(f"provider_calls:{member}", 0)


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_stream_is_scored_end_to_end(start_worker, make_client, broker):
    start_worker()
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(30), window_size=10)

    page = client.pull(stream, 0, 10, timeout=60)

    assert [r.rank for r in page.rows] == list(range(1, 11))
    assert all(r.kind == "ranked" and r.served_by == "0:local" and r.window == 0 for r in page.rows)
    scores = [r.final_score for r in page.rows]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)  # logits went through a sigmoid
    assert {r.id for r in page.rows} == {f"c{i}" for i in range(10)}
    assert page.rows[0].decision.document.startswith("payment gateway error number")
    status = client.status(stream)
    assert [w.state for w in status.windows] == ["committed", "not_admitted", "not_admitted"]
    assert status.windows[0].ranked == 10 and status.windows[0].served_by == "0:local"


def test_deeper_pull_scores_only_the_new_window(flow, query):
    client = flow.client()
    before = provider_calls(client)
    stream = client.open(query, make_candidates(30), window_size=10)

    client.pull(stream, 0, 5, timeout=60)
    assert provider_calls(client) == before + 1

    deeper = client.pull(stream, 10, 10, timeout=60)
    assert provider_calls(client) == before + 2
    assert [r.window for r in deeper.rows] == [1] * 10
    assert [w.state for w in client.status(stream).windows] == ["committed", "committed", "not_admitted"]


def test_repulling_a_committed_page_is_a_read(flow, query):
    client = flow.client()
    stream = client.open(query, make_candidates(30), window_size=10)
    first = client.pull(stream, 0, 10, timeout=60)
    calls = provider_calls(client)

    assert msgspec.json.encode(client.pull(stream, 0, 10, timeout=60)) == msgspec.json.encode(first)
    assert provider_calls(client) == calls

    # Deeper windows commit in between: the rows already returned must not change.
    client.pull(stream, 0, 30, timeout=60)
    again = client.pull(stream, 0, 10, timeout=60)
    assert msgspec.json.encode(again.rows) == msgspec.json.encode(first.rows)
    assert (again.total, again.complete) == (30, True)
    assert provider_calls(client) == calls + 2  # only the two deeper windows were scored
    client.pull(stream, 0, 30, timeout=60)
    assert provider_calls(client) == calls + 2


def test_duplicate_delivery_commits_once(flow, query, raw_redis):
    client = flow.client()
    before = provider_calls(client)
    stream = client.open(query, make_candidates(10), window_size=10)
    client.pull(stream, 0, 10, timeout=60)

    # The same trigger delivered twice more: at-least-once delivery in action.
    queue = client.settings.queues.cpu_queue
    client.dispatcher.app.send_task(TASK_NAME, args=[stream, 0], queue=queue)
    client.dispatcher.app.send_task(TASK_NAME, args=[stream, 0], queue=queue)
    # A later window's commit tells us both duplicates were consumed before it (one worker, FIFO).
    stream2 = client.open(query, make_candidates(10, text="cache miss {i}"), window_size=10)
    client.pull(stream2, 0, 1, timeout=60)

    events = raw_redis.xrange(client.store.keys.stream(stream).events)
    assert [fields[b"window"] for _, fields in events] == [b"0"]
    assert provider_calls(client) == before + 2  # one per stream, none for the duplicates
    assert client.status(stream).windows[0].attempts == 1  # a duplicate finds the window committed


def test_filtered_rows_take_no_page_slot(flow):
    client = flow.client()
    candidates = make_candidates(40)
    query = "payment gateway error"  # the tiny model scores enough of these above half of window 0's
    reference = client.open(query, candidates, window_size=10)
    everything = client.pull(reference, 0, 40, timeout=60)
    threshold = sorted(r.score for r in everything.rows if r.window == 0)[5]  # half of window 0 falls below
    below = sum(r.score < threshold for r in everything.rows if r.window == 0)

    stream = client.open(query, candidates, window_size=10, min_score=threshold)
    page = client.pull(stream, 0, 10, timeout=60)

    assert len(page.rows) == 10
    assert all(r.score >= threshold for r in page.rows)
    assert {r.window for r in page.rows} >= {0, 1}  # window 0 alone could not fill it
    window0 = client.store.snapshot(stream).results[0]
    filtered = [d for d in window0.decisions if isinstance(d, Filtered)]
    assert len(filtered) == below >= 4 and all(d.score < threshold and d.reason == "min_score" for d in filtered)
    snapshot = client.store.snapshot(stream)
    assert page.total == sum(isinstance(d, Ranked) for w in snapshot.results.values() for d in w.decisions)


def test_chain_falls_to_rrf_when_the_model_cannot_load(start_worker, make_client):
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_MODEL": "/nonexistent/model",
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
            "RERANKQ_SERVE_WITHOUT_SCORING": "true",
        }
    )
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(12), window_size=4)

    page = client.pull(stream, 0, 4, timeout=60)

    assert [r.served_by for r in page.rows] == ["1:rrf"] * 4
    # Passthrough keeps fusion order, seeded from rank.
    assert [r.id for r in page.rows] == ["c0", "c1", "c2", "c3"]
    assert [round(r.score, 6) for r in page.rows] == [1.0, 0.7, 0.4, 0.1]
    result = client.store.snapshot(stream).results[0]
    assert result.passthrough and result.failovers and result.failovers[0].startswith("0:local")
    log = worker.log()
    # Said once, at start; each window it is passed over for is counted apart from failovers.
    assert "member_start_failed" in log and "warning" in log.lower() and "reranker_failover" not in log
    assert client.store.counters()["members_not_started:0:local"] >= 1


def test_chain_without_a_fail_open_member_commits_failed(start_worker, make_client):
    start_worker(env={"RERANKQ_RERANKER_MODEL": "/nonexistent/model", "RERANKQ_SERVE_WITHOUT_SCORING": "true"})
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(6), window_size=3)

    page = client.pull(stream, 0, 3, timeout=60)

    assert [r.kind for r in page.rows] == ["failed"] * 3
    assert [r.id for r in page.rows] == ["c0", "c1", "c2"]  # fusion order
    assert "0:local" in page.rows[0].decision.reason
    assert isinstance(page.rows[0].decision, Failed)
    from producer import WindowFailed

    with pytest.raises(WindowFailed):
        client.pull(stream, 0, 3, timeout=5, raise_on_failed=True)


def test_candidate_without_text_sinks_and_is_kept(flow, query):
    client = flow.client()
    candidates = make_candidates(5)
    candidates[0]["text"] = ""
    stream = client.open(query, candidates, window_size=5)

    page = client.pull(stream, 0, 5, timeout=60)

    assert len(page.rows) == 5
    assert page.rows[-1].id == "c0" and page.rows[-1].score == -math.inf
    assert all(isinstance(r.decision, Ranked) for r in page.rows)


def test_retried_open_with_an_idempotency_key_returns_the_same_stream(flow, query):
    client = flow.client()
    candidates = make_candidates(10)

    first = client.open(query, candidates, window_size=10, idempotency_key="job-42")
    again = client.open(query, candidates, window_size=10, idempotency_key="job-42")
    assert first == again == "k_job-42"
    client.pull(first, 0, 10, timeout=60)
    from producer import IdempotencyConflict

    with pytest.raises(IdempotencyConflict):
        client.open("a different query", candidates, window_size=10, idempotency_key="job-42")
    assert client.status(first).windows[0].attempts == 1
