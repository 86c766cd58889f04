"""What real clients meet at the gateway (issue 35): the ``cohere`` SDK, unmodified, pointed at
a real gateway over a real worker and Redis; plain HTTP where a client's own request is the point.

A queue no live worker consumes is answered at once, in a shape the client reads as "not now";
v1-era fields on v2 are accepted where they change nothing; TEI's ``GET /info`` answers; an
``Authorization`` header without ``Bearer`` is told the scheme is wrong.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from gateway_helpers import GatewayProcess, queue_env, write_keys

from worker.embedded.worker_process import WorkerProcess

cohere = pytest.importorskip("cohere", reason="the cohere SDK is in the dev extra")

ROOT = Path(__file__).resolve().parent.parent
FAST = "tests.delivery_providers:FastProvider"
DOCS = [
    "the cat sat on the mat",
    "checkout returned 502 after the certificate expired",
    "how to recover checkout after 502s",
    "a payment gateway runbook",
]


@dataclass
class Served:
    env: dict[str, str]
    key: str
    gateway: GatewayProcess
    http: httpx.Client

    def post(self, path: str, body: object, **headers: str) -> httpx.Response:
        headers.setdefault("Authorization", f"Bearer {self.key}")
        return self.http.post(path, content=json.dumps(body), headers=headers)


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A cpu worker, and a gateway whose calls wait the whole default timeout: nothing serves gpu."""
    tmp = tmp_path_factory.mktemp("clients")
    env = queue_env(redis_server.url, "c" + uuid.uuid4().hex[:10], RERANKQ_RERANKER_PROVIDER=FAST)
    keys = write_keys(tmp / "keys.json", [{"name": "acme", "tenant": "acme", "devices": ["cpu", "gpu"]}])
    worker = WorkerProcess.rerankq(env, tmp / "worker.log", "--device", "cpu", cwd=ROOT).start()
    gateway = GatewayProcess(
        {**env, "RERANKQ_GATEWAY_KEYS_FILE": str(tmp / "keys.json"), "RERANKQ_GATEWAY_TIMEOUT_S": "300"},
        tmp / "gateway.log",
    ).start()
    http = httpx.Client(base_url=gateway.url, timeout=60)
    try:
        yield Served(env, keys["acme"], gateway, http)
    finally:
        http.close()
        gateway.stop()
        worker.stop()


def query(tag: str) -> str:
    return f"payment gateway 502 {tag} {uuid.uuid4().hex[:6]}"


# -- no live worker ---------------------------------------------------------------------------


def test_no_live_worker_is_answered_at_once_as_429_with_retry_after_and_nothing_is_queued(served: Served) -> None:
    # max_retries=0: the SDK would otherwise wait out Retry-After twice; what it is told is the point.
    co = cohere.ClientV2(api_key=served.key, base_url=served.gateway.url + "/gpu", timeout=60, max_retries=0)
    with pytest.raises(cohere.errors.TooManyRequestsError) as caught:
        co.rerank(model="m", query=query("nobody"), documents=DOCS)
    assert caught.value.headers["retry-after"] == "10"
    assert "no live worker consumes queue" in caught.value.body["message"]
    assert "not now" in caught.value.body["message"]
    # Not after the 300 s timeout with a stream id to fetch: nothing was opened or sent.
    assert "x-rerankq-stream-id" not in caught.value.headers
    broker = redis.Redis.from_url(served.env["RERANKQ_REDIS_URL"])
    try:
        assert broker.llen(served.env["RERANKQ_GPU_QUEUE"]) == 0
    finally:
        broker.close()

    v1 = served.post("/gpu/v1/rerank", {"query": "q", "documents": DOCS})
    assert v1.status_code == 429 and v1.headers["retry-after"] == "10" and set(v1.json()) == {"message"}
    tei = served.post("/gpu/rerank", {"query": "q", "texts": DOCS})
    assert tei.status_code == 503 and tei.headers["retry-after"] == "10"
    assert tei.json()["error_type"] == "Unhealthy" and "no live worker" in tei.json()["error"]


def test_a_served_queue_is_answered_by_the_same_client(served: Served) -> None:
    co = cohere.ClientV2(api_key=served.key, base_url=served.gateway.url, timeout=60, max_retries=0)
    answer = co.rerank(model="m", query=query("served"), documents=DOCS)
    assert sorted(r.index for r in answer.results) == list(range(len(DOCS)))


# -- v1-era fields on v2 ----------------------------------------------------------------------


def test_v2_ignores_v1_fields_that_change_nothing_with_a_warning(served: Served) -> None:
    q = query("v1-era")
    co = cohere.ClientV2(api_key=served.key, base_url=served.gateway.url, timeout=60, max_retries=0)
    plain = co.rerank(model="m", query=q, documents=DOCS, top_n=3)
    # What rerankers sends to /v2/rerank, through the SDK's own way to add body fields.
    extra = co.rerank(
        model="m",
        query=q,
        documents=DOCS,
        top_n=3,
        request_options={"additional_body_parameters": {"return_documents": True, "rank_fields": ["text"]}},
    )
    assert [(r.index, r.relevance_score) for r in extra.results] == [
        (r.index, r.relevance_score) for r in plain.results
    ]
    raw = served.post("/v2/rerank", {"model": "m", "query": q, "documents": DOCS, "return_documents": True})
    assert raw.status_code == 200
    assert raw.headers["warning"].startswith('299 rerankq "return_documents is a v1 field, ignored')
    assert "warning" not in served.post("/v2/rerank", {"model": "m", "query": q, "documents": DOCS}).headers


def test_v2_refuses_a_v1_field_that_would_change_the_answer(served: Served) -> None:
    refused = served.post("/v2/rerank", {"model": "m", "query": "q", "documents": DOCS, "max_chunks_per_doc": 2})
    assert refused.status_code == 400
    assert refused.json()["message"].startswith("invalid request: max_chunks_per_doc: a v1 field")


# -- passages: the winning span, and what was not read ---------------------------------------

PARAGRAPHS = [
    f"Paragraph {i}: the {w} team keeps its notes in the shared wiki, reviewed each quarter."
    for i, w in enumerate("design finance payments mobile support security data legal research sales".split())
]


def best_passage(q: str, text: str, **options: object) -> tuple[int, int, float, list[object]]:
    """What the worker's own cut and the served provider's score make of one document."""
    from delivery_providers import _score

    from kernel.wire import Candidate, StreamSpec
    from worker.scoring.passages import fallback_cutter, split

    spec = StreamSpec(query=q, window_size=1, long_documents="passages", **options)  # type: ignore[arg-type]
    passages = split(Candidate(id="x", text=text), q, fallback_cutter(), spec)
    score, best = max((_score(q, p.text), -i) for i, p in enumerate(passages))
    return passages[-best].start, passages[-best].end, score, list(passages)


def test_v2_relevant_spans_answer_each_documents_winning_passage_through_the_sdk(served: Served) -> None:
    q = query("spans")
    long_document = "\n\n".join(PARAGRAPHS * 12)  # past one 512-token passage: several are scored
    documents = [DOCS[0], long_document]
    co = cohere.ClientV2(api_key=served.key, base_url=served.gateway.url, timeout=60, max_retries=0)
    spans = cohere.RerankRelevantSpans(mode="enabled", threshold=0.0)
    answer = co.rerank(model="m", query=q, documents=documents, relevant_spans=spans)
    by_index = {r.index: r for r in answer.results}
    for index, text in enumerate(documents):
        start, end, score, passages = best_passage(q, text)
        (span,) = by_index[index].relevant_spans
        assert (span.start, span.end) == (start, end) and span.score == pytest.approx(score)
        # The document's score is its best passage's (MaxP).
        assert by_index[index].relevance_score == pytest.approx(score)
    assert len(best_passage(q, long_document)[3]) > 1
    # Cut where the document breaks: the winning span is whole paragraphs.
    (span,) = by_index[1].relevant_spans
    assert set(long_document[span.start : span.end].split("\n\n")) <= set(PARAGRAPHS)
    # Over the threshold only, and not at all unless asked for.
    above = co.rerank(
        model="m",
        query=q,
        documents=documents,
        relevant_spans=cohere.RerankRelevantSpans(mode="enabled", threshold=1.0),
    )
    assert all(r.relevant_spans is None for r in above.results)
    plain = served.post("/v2/rerank", {"model": "m", "query": q, "documents": documents})
    assert all("relevant_spans" not in r for r in plain.json()["results"])
    off = served.post(
        "/v2/rerank", {"model": "m", "query": q, "documents": documents, "relevant_spans": {"mode": "disabled"}}
    )
    assert off.json()["results"] == plain.json()["results"]
    refused = served.post(
        "/v2/rerank",
        {"model": "m", "query": q, "documents": documents, "relevant_spans": {"mode": "enabled", "threshold": 2}},
    )
    assert refused.status_code == 400 and "relevant_spans.threshold" in refused.json()["message"]


def test_v1_max_chunks_per_doc_covers_the_document_or_the_answer_says_what_was_not_read(served: Served) -> None:
    q = query("chunks")
    short_paragraphs = "\n\n".join(PARAGRAPHS * 6)  # sixty paragraphs, about 1,300 tokens
    co = cohere.Client(api_key=served.key, base_url=served.gateway.url, timeout=60, max_retries=0)
    # Ten chunks cover it: its passages take in their neighbours until ten reach its end.
    covered = co.rerank(model="m", query=q, documents=[short_paragraphs], max_chunks_per_doc=10)
    assert covered.meta.warnings is None
    *_, passages = best_passage(q, short_paragraphs, max_passages=10)
    assert len(passages) <= 10 and passages[-1].end == len(short_paragraphs)  # type: ignore[attr-defined]
    # One chunk cannot: the answer says how much of which document was read.
    partial = co.rerank(model="m", query=q, documents=[DOCS[0], short_paragraphs], max_chunks_per_doc=1)
    (warning,) = partial.meta.warnings
    read = best_passage(q, short_paragraphs, max_passages=1)[1]
    assert "1 of 2 documents were read only in part" in warning
    assert f"1: {read} of {len(short_paragraphs)}" in warning and "max_chunks_per_doc=1" in warning


# -- TEI's /info, and the authorization scheme ------------------------------------------------


def test_tei_info_answers_what_teis_router_answers(served: Served) -> None:
    info = served.http.get("/info", headers={"Authorization": f"Bearer {served.key}"})
    assert info.status_code == 200
    body = info.json()
    assert set(body) == {
        "model_id",
        "model_sha",
        "model_dtype",
        "model_type",
        "max_concurrent_requests",
        "max_input_length",
        "max_batch_tokens",
        "max_batch_requests",
        "max_client_batch_size",
        "auto_truncate",
        "tokenization_workers",
        "version",
        "sha",
        "docker_label",
    }
    assert set(body["model_type"]) == {"reranker"}
    assert body["max_client_batch_size"] >= 1 and body["auto_truncate"] is True
    assert served.http.get("/info").status_code == 401


def test_a_key_without_bearer_is_told_the_scheme_is_wrong(served: Served) -> None:
    # llama-index-tei-rerank sends its auth_token as the whole header, without a scheme.
    bare = served.post("/v2/rerank", {"model": "m", "query": "q", "documents": DOCS}, Authorization=served.key)
    assert bare.status_code == 401
    assert "wrong authorization scheme" in bare.json()["message"]
    assert served.key not in bare.text
    other = served.post("/v1/rerank", {"query": "q", "documents": DOCS}, Authorization=f"Token {served.key}")
    assert other.status_code == 401 and "wrong authorization scheme" in other.json()["message"]
    missing = served.post("/v1/rerank", {"query": "q", "documents": DOCS}, Authorization="")
    assert missing.status_code == 401 and "no api key supplied" in missing.json()["message"]
