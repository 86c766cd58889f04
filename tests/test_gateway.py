"""The HTTP gateway against a real uvicorn server on loopback, real workers and a real Redis.

One deployment serves the module: a worker scoring with ``FastProvider`` (a fixed function
of query and document, so every score can be checked) and a gateway with three API keys.
Shapes are checked field by field against what Cohere (v1, v2) and TEI publish; rerankq's own
``cohere`` and ``tei`` providers, in a second deployment, call the gateway as chain members.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio
from delivery_helpers import patient
from delivery_providers import _score
from gateway_helpers import GatewayProcess, queue_env, sse_events, write_keys
from test_options import BAD

from kernel import consumers
from producer import RerankClient, load_settings
from producer.gateway.config import load_gateway_settings
from producer.gateway.limits import Backlog, CountingDispatcher
from producer.gateway.problems import Problem
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
FAST = "tests.delivery_providers:FastProvider"
SERVED_BY = f"0:{FAST}"
MAX_DOCUMENTS = 40
MAX_CHARS = 3000
MAX_BODY = 200_000
MAX_WINDOW = 16


@dataclass
class Deployment:
    env: dict[str, str]
    keys: dict[str, str]
    gateway: GatewayProcess
    client: RerankClient
    http: httpx.Client
    tmp: Path

    def post(self, path: str, body: object, key: str | None = "acme", **headers: str) -> httpx.Response:
        if key is not None:
            headers["Authorization"] = f"Bearer {self.keys[key]}"
        return self.http.post(path, content=json.dumps(body), headers=headers)

    def get(self, path: str, key: str | None = "acme", **params: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[key]}"} if key else {}
        return self.http.get(path, params=params, headers=headers)

    def calls(self) -> dict[str, int]:
        counters = self.client.store.counters()
        return {
            name: counters.get(name, 0)
            for name in (f"provider_calls:{SERVED_BY}", "windows_committed", "pair_cache_hits", "pair_cache_misses")
        }


@pytest.fixture(scope="module")
def deployment(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("gateway")
    env = queue_env(
        redis_server.url,
        "g" + uuid.uuid4().hex[:10],
        RERANKQ_RERANKER_PROVIDER=FAST,
        RERANKQ_CHAIN_FAST="0",
        RERANKQ_MAX_WINDOW_SIZE=str(MAX_WINDOW),
        RERANKQ_WINDOW_SIZE="10",
    )
    keys = write_keys(
        tmp / "keys.json",
        [
            {"name": "acme", "tenant": "acme", "devices": ["cpu", "gpu"]},
            {"name": "other", "tenant": "other"},
            {"name": "pinned", "tenant": "acme", "chain": "fast"},
        ],
    )
    worker = WorkerProcess.rerankq(env, tmp / "worker.log", "--device", "cpu", cwd=ROOT).start()
    gateway = GatewayProcess(
        {
            **env,
            "RERANKQ_GATEWAY_KEYS_FILE": str(tmp / "keys.json"),
            "RERANKQ_GATEWAY_MAX_DOCUMENTS": str(MAX_DOCUMENTS),
            "RERANKQ_GATEWAY_MAX_DOCUMENT_CHARS": str(MAX_CHARS),
            "RERANKQ_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY),
        },
        tmp / "gateway.log",
        "--log-level",
        "debug",
        "--access-log",
    ).start()
    client = RerankClient(load_settings(env))
    http = httpx.Client(base_url=gateway.url, timeout=60)
    try:
        yield Deployment(env, keys, gateway, client, http, tmp)
    finally:
        http.close()
        client.close()
        gateway.stop()
        worker.stop()


def query(tag: str) -> str:
    return f"payment gateway 502 {tag} {uuid.uuid4().hex[:6]}"


DOCS = [
    "the cat sat on the mat",
    "checkout returned 502 after the certificate expired",
    "how to recover checkout after 502s",
    "office facilities: the printer on floor 3",
    "a payment gateway runbook",
]


# -- Cohere ---------------------------------------------------------------------------------


def test_cohere_v2_answers_in_cohere_shape_best_first(deployment: Deployment) -> None:
    q = query("v2")
    answer = deployment.post("/v2/rerank", {"model": "rerank-v3.5", "query": q, "documents": DOCS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"id", "results", "meta"}
    uuid.UUID(body["id"])
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    assert all(set(result) == {"index", "relevance_score"} for result in body["results"])
    assert sorted(r["index"] for r in body["results"]) == list(range(len(DOCS)))
    expected = sorted(((_score(q, d), i) for i, d in enumerate(DOCS)), key=lambda p: (-p[0], p[1]))
    assert [r["index"] for r in body["results"]] == [i for _, i in expected]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([score for score, _ in expected])
    assert answer.headers["x-rerankq-stream-id"].startswith("k_gw-")

    top = deployment.post("/v2/rerank", {"model": "rerank-v3.5", "query": q, "documents": DOCS, "top_n": 2}).json()
    assert top["results"] == body["results"][:2]


def test_cohere_v1_returns_documents_as_given_and_ranks_by_rank_fields(deployment: Deployment) -> None:
    q = query("v1")
    documents = [DOCS[0], {"text": DOCS[1], "id": "d1"}, DOCS[2]]
    body = deployment.post("/v1/rerank", {"query": q, "documents": documents, "return_documents": True}).json()
    assert body["meta"]["api_version"] == {"version": "1"}
    by_index = {r["index"]: r for r in body["results"]}
    assert by_index[0]["document"] == {"text": DOCS[0]}
    assert by_index[1]["document"] == {"text": DOCS[1], "id": "d1"}
    assert by_index[1]["relevance_score"] == pytest.approx(_score(q, DOCS[1]))
    assert [r["relevance_score"] for r in body["results"]] == sorted(
        (r["relevance_score"] for r in body["results"]), reverse=True
    )

    plain = deployment.post("/v1/rerank", {"query": q, "documents": documents, "top_n": 1}).json()
    assert len(plain["results"]) == 1 and set(plain["results"][0]) == {"index", "relevance_score"}

    fielded = [{"title": "Checkout runbook", "body": DOCS[2]}, {"title": "Cats", "body": DOCS[0]}]
    ranked = deployment.post("/v1/rerank", {"query": q, "documents": fielded, "rank_fields": ["title", "body"]}).json()
    scores = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    assert scores[0] == pytest.approx(_score(q, f"title: Checkout runbook\nbody: {DOCS[2]}"))


def test_cohere_v1_max_chunks_per_doc_scores_passages_and_answers_per_document(deployment: Deployment) -> None:
    from kernel.wire import Candidate, StreamSpec
    from worker.scoring.passages import fallback_cutter, split

    q = query("chunks")
    words = "gateway payment checkout certificate region outage invoice laptop".split()
    documents = [" ".join(f"{words[(i + j) % len(words)]}{j}" for j in range(250)) for i in range(3)]
    answer = deployment.post("/v1/rerank", {"query": q, "documents": documents, "max_chunks_per_doc": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert sorted(r["index"] for r in body["results"]) == [0, 1, 2]  # one result per document
    # Each document split into at most two passages on the tokenizer's boundaries, each scored:
    # its score is its best passage's (MaxP), not the score of the document cut to a budget.
    spec = StreamSpec(query=q, window_size=3, long_documents="passages", max_passages=2)
    for result in body["results"]:
        passages = split(Candidate(id="x", text=documents[result["index"]]), q, fallback_cutter(), spec)
        assert len(passages) == 2
        assert result["relevance_score"] == pytest.approx(max(_score(q, p.text) for p in passages))
    too_many = deployment.post("/v1/rerank", {"query": q, "documents": documents, "max_chunks_per_doc": 1000})
    assert too_many.status_code == 400 and "max_chunks_per_doc" in too_many.json()["message"]


def test_cohere_errors_name_the_field_with_cohere_codes(deployment: Deployment) -> None:
    def refused(body: object, status: int, *needles: str, raw: bytes | None = None) -> None:
        headers = {"Authorization": f"Bearer {deployment.keys['acme']}"}
        answer = deployment.http.post(
            "/v2/rerank", content=raw if raw is not None else json.dumps(body), headers=headers
        )
        assert answer.status_code == status, answer.text
        assert set(answer.json()) == {"message"}
        for needle in needles:
            assert needle in answer.json()["message"]

    q = query("errors")
    refused({"query": q, "documents": DOCS}, 400, "invalid request", "model")
    refused({"model": "m", "query": q, "documents": ["a", "b", 3]}, 400, "documents[2]")
    refused({"model": "m", "query": q, "documents": DOCS, "top-n": 2}, 400, "top-n")
    refused({"model": "m", "query": q, "documents": []}, 400, "invalid request: list of documents must not be empty")
    refused({"model": "m", "query": "   ", "documents": DOCS}, 400, "query must not be empty")
    refused({"model": "m", "query": q, "documents": DOCS, "top_n": 0}, 400, "top_n")
    refused({"model": "m", "query": q, "documents": ["d"] * (MAX_DOCUMENTS + 1)}, 400, "documents", str(MAX_DOCUMENTS))
    refused({"model": "m", "query": q, "documents": ["a", "x" * (MAX_CHARS + 1)]}, 400, "documents[1]", str(MAX_CHARS))
    refused({"model": "m", "query": q, "documents": ["x" * 2000] * MAX_DOCUMENTS * 3}, 413, "bytes")
    refused(None, 400, "not valid JSON", raw=b'{"model": "m", "query": ')
    # An object without text is an empty text (scored last, test_blank_documents.py); rank_fields
    # that no document has is a mistake, refused.
    v1 = deployment.post("/v1/rerank", {"query": q, "documents": [{"title": "t"}], "rank_fields": ["titel"]})
    assert v1.status_code == 400 and "rank_fields" in v1.json()["message"]


def test_more_documents_than_a_window_holds_are_scored_in_windows_and_ranked_together(deployment: Deployment) -> None:
    q = query("windows")
    documents = [f"note {i} on payment gateway errors" for i in range(MAX_DOCUMENTS)]
    answer = deployment.post("/v2/rerank", {"model": "m", "query": q, "documents": documents})
    assert answer.status_code == 200, answer.text
    status = deployment.client.status(answer.headers["x-rerankq-stream-id"])
    assert [(w.start, w.end, w.state) for w in status.windows] == [
        (0, 16, "committed"),
        (16, 32, "committed"),
        (32, 40, "committed"),
    ]
    expected = sorted(((_score(q, d), i) for i, d in enumerate(documents)), key=lambda p: (-p[0], p[1]))
    assert [r["index"] for r in answer.json()["results"]] == [i for _, i in expected]


# -- TEI --------------------------------------------------------------------------------------


def test_tei_answers_a_bare_array_with_text_and_raw_scores(deployment: Deployment) -> None:
    q = query("tei")
    answer = deployment.post("/rerank", {"query": q, "texts": DOCS})
    assert answer.status_code == 200, answer.text
    ranks = answer.json()
    assert isinstance(ranks, list) and all(set(r) == {"index", "score"} for r in ranks)
    expected = sorted(((_score(q, d), i) for i, d in enumerate(DOCS)), key=lambda p: (-p[0], p[1]))
    assert [r["index"] for r in ranks] == [i for _, i in expected]
    assert [r["score"] for r in ranks] == pytest.approx([score for score, _ in expected])

    raw = deployment.post(
        "/rerank",
        {
            "query": q,
            "texts": DOCS,
            "raw_scores": True,
            "return_text": True,
            "truncate": True,
            "truncation_direction": "Left",
            "unknown": 1,
        },
    ).json()
    assert [r["index"] for r in raw] == [r["index"] for r in ranks]
    for rank in raw:
        assert set(rank) == {"index", "score", "text"}
        assert rank["text"] == DOCS[rank["index"]]
        p = _score(q, DOCS[rank["index"]])
        assert rank["score"] == pytest.approx(math.log(p / (1 - p)))


def test_tei_errors_in_tei_shape_with_413_422(deployment: Deployment) -> None:
    def refused(body: object, status: int, error_type: str, *needles: str, raw: bytes | None = None) -> None:
        answer = deployment.http.post(
            "/rerank",
            content=raw if raw is not None else json.dumps(body),
            headers={"Authorization": f"Bearer {deployment.keys['acme']}"},
        )
        assert answer.status_code == status, answer.text
        assert answer.json()["error_type"] == error_type and set(answer.json()) == {"error", "error_type"}
        for needle in needles:
            assert needle in answer.json()["error"]

    q = query("tei errors")
    refused({"query": q, "texts": []}, 400, "Empty", "`texts` cannot be empty")
    refused(
        {"query": q, "texts": ["t"] * (MAX_DOCUMENTS + 1)},
        413,
        "Validation",
        f"batch size {MAX_DOCUMENTS + 1} > maximum allowed batch size {MAX_DOCUMENTS}",
    )
    refused({"query": q, "texts": ["x" * 2000] * MAX_DOCUMENTS * 3}, 413, "Validation", "bytes")
    refused({"query": q, "texts": ["a", 7]}, 422, "Validation", "texts[1]")
    refused({"query": q, "texts": ["a", "x" * (MAX_CHARS + 1)]}, 422, "Validation", "texts[1]")
    refused({"texts": ["a"]}, 422, "Validation", "query")
    refused(None, 422, "Validation", raw=b"not json")
    long_text = "payment " * 300  # 2400 characters, over the default document budget of 2048
    refused({"query": q, "texts": ["a", long_text], "truncate": False}, 422, "Validation", "texts[1]", "truncate")
    assert deployment.post("/rerank", {"query": q, "texts": ["a", long_text], "truncate": True}).status_code == 200


# -- repeats, timeouts -------------------------------------------------------------------------


def test_a_repeat_is_answered_from_retained_decisions_without_a_provider_call(deployment: Deployment) -> None:
    q = query("repeat")
    first = deployment.post("/v2/rerank", {"model": "m", "query": q, "documents": DOCS})
    assert first.status_code == 200
    before = deployment.calls()
    again = deployment.post("/v2/rerank", {"model": "m", "query": q, "documents": DOCS, "top_n": 3})
    as_tei = deployment.post("/rerank", {"query": q, "texts": DOCS})
    assert deployment.calls() == before  # no provider call, no window, not even a cache lookup
    assert (
        again.headers["x-rerankq-stream-id"]
        == first.headers["x-rerankq-stream-id"]
        == as_tei.headers["x-rerankq-stream-id"]
    )
    assert again.json()["results"] == first.json()["results"][:3]
    assert [(r["index"], r["score"]) for r in as_tei.json()] == [
        (r["index"], r["relevance_score"]) for r in first.json()["results"]
    ]


def test_a_timeout_answers_504_and_the_result_is_fetched_later_by_stream_id(deployment: Deployment) -> None:
    q = query("late")
    # A worker that is live but never gets to the GPU queue's windows: they wait there.
    store, gpu_queue = deployment.client.store, deployment.env["RERANKQ_GPU_QUEUE"]
    consumers.record(store.client, store.keys, "busy-elsewhere", [gpu_queue])
    deadline = time.monotonic() + 2 * consumers.CACHE_S
    while True:  # until the gateway's cached view of the consumers registry has it
        late = deployment.post(
            "/gpu/v2/rerank", {"model": "m", "query": q, "documents": DOCS}, **{"X-Rerankq-Timeout": "0.5"}
        )
        if late.status_code != 429 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert late.status_code == 504 and set(late.json()) == {"message"}
    stream_id = late.headers["x-rerankq-stream-id"]
    assert stream_id in late.json()["message"]
    tei_late = deployment.post(
        "/rerank", {"query": q, "texts": DOCS}, **{"X-Rerankq-Device": "gpu", "X-Rerankq-Timeout": "0.3"}
    )
    assert tei_late.status_code == 504 and tei_late.json()["error_type"] == "Backend"
    assert tei_late.headers["x-rerankq-stream-id"] == stream_id  # the same job, the same stream

    gpu = WorkerProcess.rerankq(deployment.env, deployment.tmp / "gpu-worker.log", "--device", "gpu", cwd=ROOT).start()
    try:
        page = deployment.get(f"/v1/streams/{stream_id}/page", limit=10, wait=30)
    finally:
        gpu.stop()
        consumers.forget(store.client, store.keys, "busy-elsewhere", [gpu_queue])
    assert page.status_code == 200 and page.json()["complete"]
    before = deployment.calls()
    done = deployment.post("/gpu/v2/rerank", {"model": "m", "query": q, "documents": DOCS})
    assert done.status_code == 200 and deployment.calls() == before
    assert [(r["index"], r["relevance_score"]) for r in done.json()["results"]] == [
        (row["decision"]["index"], row["decision"]["score"]) for row in page.json()["rows"]
    ]


# -- auth and tenancy --------------------------------------------------------------------------


def test_keys_are_required_and_map_to_tenant_chain_and_devices(deployment: Deployment) -> None:
    body = {"model": "m", "query": query("auth"), "documents": DOCS}
    missing = deployment.post("/v2/rerank", body, key=None)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json() == {"message": "no api key supplied: send Authorization: Bearer <key>"}
    wrong = deployment.http.post(
        "/v2/rerank", content=json.dumps(body), headers={"Authorization": "Bearer rq_not-a-key-we-know"}
    )
    assert wrong.status_code == 401 and wrong.json() == {"message": "invalid api token"}
    tei = deployment.http.post("/rerank", content=json.dumps({"query": "q", "texts": ["a"]}))
    assert tei.status_code == 401 and tei.content == b""  # TEI's --api-key check answers a bare 401
    streams = deployment.http.get("/v1/streams/s_" + "0" * 32)
    assert streams.status_code == 401 and streams.json()["error"]["type"] == "unauthenticated"

    forbidden = deployment.post("/gpu/v2/rerank", body, key="other")
    assert forbidden.status_code == 403 and "gpu" in forbidden.json()["message"]

    opened = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a", "text": "t"}]}, key="pinned")
    assert opened.status_code == 201, opened.text
    stream_id = opened.json()["stream_id"]
    spec = deployment.client.store.load_spec(stream_id)
    assert (spec.tenant, spec.chain) == ("acme", "fast")
    refused = deployment.post(
        "/v1/streams", {"query": "q", "candidates": [{"id": "a", "text": "t"}], "chain": "other"}, key="pinned"
    )
    assert refused.status_code == 403 and refused.json()["error"]["field"] == "chain"
    # A key bound to no profile may choose among the configured ones, and only those.
    candidates = [{"id": "a", "text": "t"}]
    chosen = deployment.post("/v1/streams", {"query": "q", "candidates": candidates, "chain": "FAST"}, key="acme")
    assert chosen.status_code == 201, chosen.text
    unknown = deployment.post("/v1/streams", {"query": "q", "candidates": candidates, "chain": "nope"}, key="acme")
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "chain", unknown.text
    assert "RERANKQ_CHAIN_NOPE" in unknown.json()["error"]["message"]
    # Another tenant cannot read it, nor learn that it exists.
    assert deployment.get(f"/v1/streams/{stream_id}", key="other").status_code == 404
    assert deployment.get(f"/v1/streams/{stream_id}", key="acme").status_code == 200
    assert deployment.http.get("/health").status_code == 200 and deployment.http.get("/ready").status_code == 200


def test_no_key_reaches_the_log(deployment: Deployment) -> None:
    deployment.post("/v2/rerank", {"model": "m", "query": query("log"), "documents": DOCS})
    deployment.http.post("/v2/rerank", content=b"{}", headers={"Authorization": "Bearer rq_wrong-secret-value"})
    text = deployment.gateway.log()
    assert "POST /v2/rerank" in text  # the log is on, at DEBUG with the access log
    for key in [*deployment.keys.values(), "rq_wrong-secret-value"]:
        assert key not in text


# -- the stream API ----------------------------------------------------------------------------


def test_stream_api_opens_pages_reports_and_streams_commits(deployment: Deployment) -> None:
    candidates = [{"id": f"c{i}", "text": f"payment note {i}"} for i in range(30)]
    opened = deployment.post(
        "/v1/streams",
        {
            "query": "payment 502",
            "candidates": candidates,
            "window_size": 10,
            "first_windows": 3,
            "idempotency_key": "job-1",
        },
    )
    assert opened.status_code == 201, opened.text
    stream_id = opened.json()["stream_id"]
    again = deployment.post(
        "/v1/streams",
        {
            "query": "payment 502",
            "candidates": candidates,
            "window_size": 10,
            "first_windows": 3,
            "idempotency_key": "job-1",
        },
    )
    assert again.json()["stream_id"] == stream_id
    page = deployment.get(f"/v1/streams/{stream_id}/page", offset=5, limit=20, wait=30).json()
    pulled = deployment.client.pull(stream_id, 5, 20, timeout=0)
    assert page == json.loads(json.dumps(_plain(pulled)))
    assert page["total"] == 30 and page["complete"] and len(page["rows"]) == 20
    status = deployment.get(f"/v1/streams/{stream_id}").json()
    assert status == json.loads(json.dumps(_plain(deployment.client.status(stream_id))))

    events = sse_events(deployment.get(f"/v1/streams/{stream_id}/events").text)
    assert [e["event"] for e in events] == ["commit", "commit", "commit", "complete"]
    assert sorted(json.loads(e["data"])["window"] for e in events[:3]) == [0, 1, 2]
    assert json.loads(events[0]["data"])["served_by"] == SERVED_BY
    resumed = deployment.http.get(
        f"/v1/streams/{stream_id}/events",
        headers={"Authorization": f"Bearer {deployment.keys['acme']}", "Last-Event-ID": events[0]["id"]},
    )
    assert [e["event"] for e in sse_events(resumed.text)] == ["commit", "commit", "complete"]


def test_stream_api_runs_a_cascade_and_its_pages_say_which_stage_decided(deployment: Deployment) -> None:
    candidates = [{"id": f"c{i}", "text": f"invoice note {i}"} for i in range(30)]
    opened = deployment.post(
        "/v1/streams",
        {"query": "invoice", "candidates": candidates, "window_size": 10, "stages": "fast:30,fast:4"},
    )
    assert opened.status_code == 201, opened.text
    stream_id = opened.json()["stream_id"]
    page = deployment.get(f"/v1/streams/{stream_id}/page", offset=0, limit=30, wait=30).json()
    assert page == json.loads(json.dumps(_plain(deployment.client.pull(stream_id, 0, 30, timeout=0))))
    assert page["complete"] and page["total"] == 30
    assert [row.get("stage", 1) for row in page["rows"]] == [2] * 4 + [1] * 26
    assert [(s["stage"], s["read"]) for s in page["stages"]] == [(1, 30), (2, 4)]
    events = sse_events(deployment.get(f"/v1/streams/{stream_id}/events").text)
    assert [e["event"] for e in events] == ["commit"] * 4 + ["complete"]  # three windows, then the second stage's
    assert json.loads(events[-1]["data"])["windows"] == 4


def test_a_page_admits_deeper_windows_like_pull(deployment: Deployment) -> None:
    candidates = [{"id": f"c{i}", "text": f"checkout note {i}"} for i in range(30)]
    stream_id = deployment.post(
        "/v1/streams", {"query": "checkout", "candidates": candidates, "window_size": 10}
    ).json()["stream_id"]
    page = deployment.get(f"/v1/streams/{stream_id}/page", offset=0, limit=25, wait=30).json()
    assert len(page["rows"]) == 25 and page["total"] == 30


def test_delete_cancels_a_stream_once_for_its_own_tenant_only(deployment: Deployment) -> None:
    candidates = [{"id": f"c{i}", "text": f"refund note {i}"} for i in range(30)]
    stream_id = deployment.post(
        "/v1/streams", {"query": "refund", "candidates": candidates, "window_size": 10, "first_windows": 1}
    ).json()["stream_id"]
    headers = {"Authorization": f"Bearer {deployment.keys['other']}"}
    assert deployment.http.delete(f"/v1/streams/{stream_id}", headers=headers).status_code == 404
    assert deployment.http.delete(f"/v1/streams/{stream_id}").status_code == 401
    headers = {"Authorization": f"Bearer {deployment.keys['acme']}"}
    unknown = deployment.http.delete("/v1/streams/s_" + "0" * 32, headers=headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found"

    cancelled = deployment.http.delete(f"/v1/streams/{stream_id}", headers=headers)
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert body["stream_id"] == stream_id and body["n_windows"] == 3
    assert {1, 2} <= set(body["cancelled_windows"])  # never admitted: only the first was sent
    again = deployment.http.delete(f"/v1/streams/{stream_id}", headers=headers)
    assert again.status_code == 200 and again.json()["cancelled_windows"] == []

    page = deployment.get(f"/v1/streams/{stream_id}/page", offset=0, limit=30).json()
    assert page["complete"] and page["total"] == 30
    assert {row["decision"]["kind"] for row in page["rows"] if row["window"] >= 1} == {"cancelled"}
    events = sse_events(deployment.get(f"/v1/streams/{stream_id}/events").text)
    assert events[-1]["event"] == "complete"


def test_stream_api_errors_name_the_field(deployment: Deployment) -> None:
    bad = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a", "text": "t"}, {"text": "no id"}]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "candidates[1].id"
    boosts = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a"}], "boosts": {"recency_alpha": 5}})
    assert boosts.status_code == 422 and boosts.json()["error"]["field"] == "boosts.recency_alpha"
    unknown = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a"}], "windowsize": 3})
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "windowsize"
    first = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a"}], "idempotency_key": "k-conf"})
    assert first.status_code == 201
    conflict = deployment.post("/v1/streams", {"query": "q2", "candidates": [{"id": "a"}], "idempotency_key": "k-conf"})
    assert conflict.status_code == 409 and conflict.json()["error"]["field"] == "idempotency_key"
    assert deployment.get("/v1/streams/s_" + "0" * 32).status_code == 404
    assert deployment.get("/v1/streams/not-an-id/page").status_code == 404
    offset = deployment.get(f"/v1/streams/{first.json()['stream_id']}/page", offset=-1)
    assert offset.status_code == 422 and offset.json()["error"]["field"] == "offset"
    assert deployment.http.post("/v1/streams", content=b"{").status_code == 401  # auth before parsing


@pytest.mark.parametrize("name", sorted(BAD))
def test_stream_api_refuses_each_bad_option_as_open_does(deployment: Deployment, name: str) -> None:
    value, _, field = BAD[name]
    refused = deployment.post("/v1/streams", {"query": "q", "candidates": [{"id": "a", "text": "t"}], name: value})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["field"] == field


def test_stream_api_takes_every_option(deployment: Deployment) -> None:
    options = {
        "window_size": 5,
        "first_windows": 2,
        "device": "cpu",
        "min_score": 0.0,
        "min_final_score": 0.0,
        "tenant": "acme",
        "boosts": {"recency_alpha": 0.3},
        "reference_time": "2024-03-01T12:00:00Z",
        "query_range": {"start": "2024-01-01T00:00:00Z", "end": "2024-02-01T00:00:00Z"},
        "ttl_s": 600,
        "idempotency_key": "every-" + uuid.uuid4().hex[:8],
        "budget": "high",
        "keep": 1,
        "allow_shallow": True,
        "max_rerank_candidates": 30,
        "max_candidates_per_source": 0,
        "strategy_boosts": "graph:high",
        "document_budget": 500,
        "lane": "batch",
        "instruction": "find the runbook for the outage",
        "long_documents": "passages",
        "passage_tokens": 64,
        "passage_stride": 32,
        "passage_cut": "tokens",
        "passage_aggregate": "sum_top_k",
        "passage_top_k": 2,
        "max_passages": 4,
        "first_stage_weight": 0.25,
        "stages": [{"chain": "fast"}, {"chain": "fast", "keep": 3}],
    }
    # Every option, as the table of bad values has every option; chain comes as the first stage's,
    # as a cascade must give it.
    assert set(options) | {"chain"} == set(BAD)
    candidates = [{"id": f"c{i}", "text": f"payment note {i}"} for i in range(12)]
    opened = deployment.post("/v1/streams", {"query": "payment 502", "candidates": candidates, **options})
    assert opened.status_code == 201, opened.text
    stream_id = opened.json()["stream_id"]
    spec = deployment.client.store.load_spec(stream_id)
    assert (spec.window_size, spec.chain, spec.tenant, spec.ttl_s, spec.document_budget, spec.instruction) == (
        5,
        "fast",
        "acme",
        600,
        500,
        "find the runbook for the outage",
    )
    assert spec.boosts.recency_alpha == 0.3 and spec.strategy_boosts == {"graph": "high"}
    assert (
        spec.long_documents,
        spec.passage_tokens,
        spec.passage_stride,
        spec.passage_cut,
        spec.passage_aggregate,
        spec.passage_top_k,
        spec.max_passages,
    ) == ("passages", 64, 32, "tokens", "sum_top_k", 2, 4)
    assert spec.first_stage_weight == 0.25
    assert [(stage.chain, stage.keep, stage.window_size) for stage in spec.later_stages] == [("fast", 3, 3)]
    assert deployment.client.status(stream_id).windows[1].state != "not_admitted"  # first_windows: 2
    other = deployment.post("/v1/streams", {"query": "q", "candidates": candidates, "tenant": "other"})
    assert other.status_code == 403 and other.json()["error"]["field"] == "tenant"
    # Scored to the end here, its second stage included, so no window of it commits under the
    # counters of a later test of this module.
    assert deployment.client.pull(stream_id, 0, 12, timeout=120).complete


@pytest.mark.parametrize("route", ["/v2/rerank", "/v1/rerank", "/rerank"])
def test_an_instruction_reaches_the_stream_and_is_part_of_a_repeat(deployment: Deployment, route: str) -> None:
    q = query("instruction")

    def body(**extra: object) -> dict[str, object]:
        base: dict[str, object] = (
            {"query": q, "texts": DOCS} if route == "/rerank" else {"model": "m", "query": q, "documents": DOCS}
        )
        return {**base, **extra}

    first = deployment.post(route, body(instruction="find the outage runbook"))
    assert first.status_code == 200, first.text
    stream_id = first.headers["x-rerankq-stream-id"]
    assert deployment.client.store.load_spec(stream_id).instruction == "find the outage runbook"
    before = deployment.calls()
    again = deployment.post(route, body(instruction="find the outage runbook"))
    assert again.headers["x-rerankq-stream-id"] == stream_id and deployment.calls() == before
    other = deployment.post(route, body(instruction="find office facilities"))
    assert other.status_code == 200 and other.headers["x-rerankq-stream-id"] != stream_id
    plain = deployment.post(route, body())
    assert plain.headers["x-rerankq-stream-id"] not in (stream_id, other.headers["x-rerankq-stream-id"])
    assert deployment.client.store.load_spec(plain.headers["x-rerankq-stream-id"]).instruction is None
    blank = deployment.post(route, body(instruction="  "))
    assert blank.status_code in (400, 422) and "instruction" in blank.text


def test_openapi_describes_every_route(deployment: Deployment) -> None:
    document = deployment.http.get("/openapi.json").json()
    for path in (
        "/v2/rerank",
        "/v1/rerank",
        "/rerank",
        "/{device}/v2/rerank",
        "/v1/streams",
        "/v1/streams/{stream_id}",
        "/v1/streams/{stream_id}/page",
        "/v1/streams/{stream_id}/events",
        "/info",
        "/health",
        "/ready",
    ):
        assert path in document["paths"]
    assert "delete" in document["paths"]["/v1/streams/{stream_id}"]
    assert deployment.post("/tpu/v2/rerank", {}).status_code == 404  # only device queues are a route prefix
    schemas = document["components"]["schemas"]
    assert set(schemas["CohereV2Request"]["required"]) == {"model", "query", "documents"}
    assert set(schemas["TeiRequest"]["required"]) == {"query", "texts"}
    # What /info answers is what the document says it answers.
    info = deployment.http.get("/info", headers={"Authorization": f"Bearer {deployment.keys['acme']}"}).json()
    assert set(info) == set(schemas["TeiInfo"]["properties"])
    assert "relevant_spans" in schemas["CohereV2Request"]["properties"]


# -- dogfood: rerankq's own providers call the gateway ----------------------------------------


def test_rerankq_cohere_and_tei_providers_parse_the_gateway_unmodified(deployment: Deployment, redis_server) -> None:
    key = deployment.keys["acme"]
    member = {"URL": deployment.gateway.url, "API_KEY": key, "MODEL": "rerank-v3.5"}
    env = queue_env(
        redis_server.url,
        "b" + uuid.uuid4().hex[:10],
        RERANKQ_CHAIN_V2="0",
        RERANKQ_CHAIN_V1="1",
        RERANKQ_CHAIN_TEI="2",
        RERANKQ_CHAIN_TEIRAW="3",
        RERANKQ_PAIR_CACHE="false",
        **{f"RERANKQ_RERANKER_{k}": v for k, v in {**member, "PROVIDER": "cohere"}.items()},
        **{f"RERANKQ_RERANKER_1_{k}": v for k, v in {**member, "PROVIDER": "cohere", "API_VERSION": "v1"}.items()},
        **{f"RERANKQ_RERANKER_2_{k}": v for k, v in {**member, "PROVIDER": "tei"}.items()},
        **{f"RERANKQ_RERANKER_3_{k}": v for k, v in {**member, "PROVIDER": "tei", "SCALE": "logit"}.items()},
    )
    worker = WorkerProcess.rerankq(env, deployment.tmp / "dogfood-worker.log", "--device", "cpu", cwd=ROOT).start()
    q = query("dogfood")
    candidates = [{"id": f"d{i}", "text": text} for i, text in enumerate(DOCS)]
    before = deployment.calls()[f"provider_calls:{SERVED_BY}"]
    try:
        with RerankClient(load_settings(env)) as client:
            for n, (profile, served_by) in enumerate(
                [("v2", "0:cohere"), ("v1", "1:cohere"), ("tei", "2:tei"), ("teiraw", "3:tei")]
            ):
                stream = client.open(f"{q} {n}", candidates, chain=profile)
                page = client.pull(stream, 0, len(DOCS), timeout=60)
                status = client.status(stream)
                assert page.complete and [w.failovers for w in status.windows] == [[]], status
                for row in page.rows:
                    assert row.served_by == served_by and row.kind == "ranked"
                    assert row.score == pytest.approx(_score(f"{q} {n}", DOCS[row.decision.index]), abs=1e-9)
    finally:
        worker.stop()
    # Each member's window went through the gateway into this deployment's queue.
    assert deployment.calls()[f"provider_calls:{SERVED_BY}"] >= before + 4


# -- backpressure -------------------------------------------------------------------------------


def test_backlog_over_the_bound_answers_429_with_retry_after(redis_server, tmp_path: Path) -> None:
    env = queue_env(
        redis_server.url,
        "p" + uuid.uuid4().hex[:10],
        RERANKQ_GATEWAY_MAX_BACKLOG="2",
        RERANKQ_GATEWAY_MAX_RETRY_AFTER_S="9",
        RERANKQ_GATEWAY_DRAIN_SAMPLE_S="0.1",
        RERANKQ_RERANKER_PROVIDER=FAST,
    )
    gateway = GatewayProcess(env, tmp_path / "gateway.log", "--insecure-no-auth").start()
    backlog = redis.Redis.from_url(redis_server.url)
    answered = {"model": "m", "query": query("answered"), "documents": DOCS}
    try:
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            worker = WorkerProcess.rerankq(env, tmp_path / "worker.log", "--device", "cpu", cwd=ROOT).start()
            try:
                # The worker records the queues it consumes a moment after it is ready; until then
                # the gateway rightly answers "no live worker" (429).
                first = http.post("/v2/rerank", json=answered)
                deadline = time.monotonic() + patient(2 * consumers.CACHE_S)
                while first.status_code == 429 and time.monotonic() < deadline:
                    time.sleep(0.5)
                    first = http.post("/v2/rerank", json=answered)
            finally:
                worker.stop()
            assert first.status_code == 200
            backlog.lpush(env["RERANKQ_CPU_QUEUE"], *[b"waiting"] * 5)  # no worker now: nothing drains it
            deadline = time.monotonic() + patient(10)
            while True:
                # A new job each time: one already in flight would be waited on, as nothing is sent for it.
                cohere = http.post(
                    "/v2/rerank",
                    json={"model": "m", "query": query("busy"), "documents": ["a", "b"]},
                    headers={"X-Rerankq-Timeout": "0.2"},
                )
                # Until the gateway's depth sample sees the backlog, the stopped worker's queue is
                # refused as unserved (also a 429); the backlog's refusal comes first once it is seen.
                # Its Retry-After reads the queue's measured drain rate, which still remembers the
                # stopped worker's draining for a few samples: a queue that no longer drains is
                # answered the longest wait once that has faded.
                crowded = cohere.status_code == 429 and "cpu queue holds" in cohere.text
                if (crowded and cohere.headers["retry-after"] == "9") or time.monotonic() > deadline:
                    break
            assert cohere.status_code == 429 and cohere.headers["retry-after"] == "9"
            assert "cpu queue holds" in cohere.json()["message"] and "over the bound of 2" in cohere.json()["message"]
            tei = http.post("/rerank", json={"query": "q", "texts": ["a"]})
            assert tei.status_code == 429 and tei.json()["error_type"] == "Overloaded"
            assert tei.headers["retry-after"] == "9"
            stream = http.post("/v1/streams", json={"query": "q", "candidates": [{"id": "a"}]})
            assert stream.status_code == 429 and stream.json()["error"]["type"] == "overloaded"
            # Another device's queue is not held back by this one: it is refused for its own reason.
            gpu = http.post(
                "/gpu/v2/rerank",
                json={"model": "m", "query": "q", "documents": ["a"]},
                headers={"X-Rerankq-Timeout": "0.2"},
            )
            assert gpu.status_code == 429 and "no live worker consumes queue" in gpu.json()["message"]
            # What was answered before is answered still: nothing needs sending.
            again = http.post("/v2/rerank", json=answered)
            assert again.status_code == 200 and again.json()["results"] == first.json()["results"]
    finally:
        backlog.delete(env["RERANKQ_CPU_QUEUE"], env["RERANKQ_GPU_QUEUE"])
        backlog.close()
        gateway.stop()


def test_retry_after_follows_the_measured_drain_rate(redis_server) -> None:
    settings = load_settings(queue_env(redis_server.url, "r" + uuid.uuid4().hex[:10]))
    gateway = load_gateway_settings({}, max_backlog=10, max_retry_after_s=600)
    queue = settings.queues.cpu_queue
    raw = redis.Redis.from_url(redis_server.url)

    async def run() -> tuple[float, int]:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        backlog = Backlog(client, CountingDispatcher(settings), settings, gateway)
        assert backlog.retry_after_s(queue, 100) == 600  # nothing measured yet: the ceiling
        raw.lpush(queue, *[b"m"] * 100)
        await backlog.sample()
        started = time.monotonic()
        for _ in range(20):  # a worker taking 20 messages
            raw.rpop(queue)
        await asyncio.sleep(0.5)
        await backlog.sample()
        elapsed = time.monotonic() - started
        rate = backlog.rate[queue]
        assert rate is not None and 20 / (elapsed + 0.1) <= rate <= 20 / 0.5
        with pytest.raises(Problem) as refused:
            backlog.check("cpu")
        await client.aclose()
        return rate, refused.value.retry_after_s or 0

    try:
        rate, retry_after = asyncio.run(run())
    finally:
        raw.delete(queue)
        raw.close()
    assert retry_after == math.ceil((80 - 10) / rate)


def test_the_backlog_sampler_stops_even_when_its_cancellation_is_lost(redis_server) -> None:
    """The gateway's shutdown waits for its sampler: stopped at any moment of its first sample
    (when redis-py is still connecting, and may swallow a cancellation), it ends within its
    sample interval, 100 times out of 100."""
    settings = load_settings(queue_env(redis_server.url, "r" + uuid.uuid4().hex[:10]))
    gateway = load_gateway_settings({}, drain_sample_s=0.05)

    async def run() -> int:
        ended = 0
        for attempt in range(100):
            client = redis.asyncio.Redis.from_url(redis_server.url)  # a fresh connection each time
            backlog = Backlog(client, CountingDispatcher(settings), settings, gateway)
            sampler = asyncio.create_task(backlog.sample_forever())
            await asyncio.sleep((attempt % 20) * 0.0001)
            backlog.stop()
            sampler.cancel()
            done, _ = await asyncio.wait({sampler}, timeout=5)
            ended += len(done)
            if not done:
                sampler.cancel()  # leave nothing behind when it fails
            await client.aclose()
        return ended

    assert asyncio.run(run()) == 100


# -- the process --------------------------------------------------------------------------------


def test_refuses_to_start_without_keys_unless_told(redis_server) -> None:
    env = queue_env(redis_server.url, "n" + uuid.uuid4().hex[:10])
    run = subprocess.run(
        [sys.executable, "-m", "producer.gateway", "--port", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "RERANKQ_GATEWAY_KEYS_FILE" in run.stderr and "--insecure-no-auth" in run.stderr


def test_the_gateway_imports_no_torch_and_no_worker_module() -> None:
    code = (
        "import sys, producer.gateway.app, producer.gateway.main; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.split('.')[0] == 'worker'))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stderr


def _plain(value: object) -> object:
    import msgspec

    return msgspec.to_builtins(value)
