"""Blank documents: one rule at every door (``open``, ``POST /v1/streams``, Cohere v1 and v2,
TEI's ``/rerank``, ``rerankq submit``).

RAG frameworks pass empty chunks along, and the real services score an empty text (TEI's
router tokenises ``(query, "")``; Cohere documents no minimum length), so rerankq accepts it
too: a text with nothing to read (empty, white space, control or format characters) scores
minus infinity, sinks to the bottom of its window, is never dropped, and is never sent to a
provider. A real worker, a real TEI-shaped member counting what it is sent (the pair cache
off, so every pair reaches it) and a real gateway.
"""

from __future__ import annotations

import json
import math
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cli_helpers import RERANKQ, read_jsonl
from gateway_helpers import GatewayProcess, queue_env, write_keys
from rerank_servers import RerankServer

from kernel.errors import ValidationError
from producer import RerankClient, load_settings
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
QUERY = "recover checkout after the outage"
REAL = ["checkout failed after the certificate expired", "\x1b[31mERROR\x1b[0m checkout recovered after a restart"]
#: Nothing to read in any of them: white space (U+2028 line separator, U+3000 ideographic
#: space), format characters (zero-width space, BOM, soft hyphen) and control characters.
BLANKS = ["", " ", "\t\n", "\u2028", "\u3000", "\u200b", "\ufeff", "\u00ad", "\u0000", "\x1b", " \u200b\ufeff\n"]


@dataclass
class Deployment:
    env: dict[str, str]
    member: RerankServer
    gateway: GatewayProcess
    key: str

    def texts_sent(self) -> list[str]:
        return [text for seen in self.member.requests for text in seen.body.get("texts", [])]

    def post(self, path: str, body: object) -> httpx.Response:
        return httpx.post(
            self.gateway.url + path, json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=60
        )


@pytest.fixture(scope="module")
def deployment(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("blank")
    member = RerankServer("tei").start()
    env = queue_env(
        redis_server.url,
        "b" + uuid.uuid4().hex[:10],
        RERANKQ_RERANKER_PROVIDER="tei",
        RERANKQ_RERANKER_URL=member.url,
        RERANKQ_RERANKER_1_PROVIDER="rrf",
        RERANKQ_PAIR_CACHE="false",
    )
    keys = write_keys(tmp / "keys.json", [{"name": "a", "tenant": "tenant-a"}])
    worker = WorkerProcess.rerankq(env, tmp / "worker.log", "--device", "cpu", cwd=ROOT).start()
    gateway = GatewayProcess({**env, "RERANKQ_GATEWAY_KEYS_FILE": str(tmp / "keys.json")}, tmp / "gateway.log")
    try:
        yield Deployment(env, member, gateway.start(), keys["a"])
    finally:
        gateway.stop()
        worker.stop()
        member.stop()


def test_open_scores_blank_texts_last_and_sends_none_of_them(deployment: Deployment) -> None:
    texts = [REAL[0], *BLANKS, REAL[1]]
    with RerankClient(load_settings(deployment.env)) as client:
        before = len(deployment.texts_sent())
        stream = client.open(QUERY, [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)], window_size=len(texts))
        page = client.pull(stream, 0, len(texts), timeout=60)
    assert page.complete and page.total == len(texts)  # kept, never dropped
    assert sorted(deployment.texts_sent()[before:]) == sorted(REAL)  # only what has text was sent
    assert {r.id for r in page.rows[:2]} == {"c0", f"c{len(texts) - 1}"}
    assert [r.id for r in page.rows[2:]] == [f"c{i}" for i in range(1, len(texts) - 1)]  # in fusion order
    for row in page.rows[2:]:
        assert row.kind == "ranked" and row.score == -math.inf and row.final_score == -math.inf


def test_a_window_of_only_blank_texts_commits_without_a_provider_call(deployment: Deployment) -> None:
    with RerankClient(load_settings(deployment.env)) as client:
        before = deployment.member.count
        stream = client.open(QUERY, [{"id": f"b{i}", "text": t} for i, t in enumerate(BLANKS)], allow_shallow=True)
        page = client.pull(stream, 0, len(BLANKS), timeout=60)
    assert page.complete and [r.id for r in page.rows] == [f"b{i}" for i in range(len(BLANKS))]
    assert all(r.kind == "ranked" and r.score == -math.inf for r in page.rows)
    assert deployment.member.count == before


@pytest.mark.parametrize(
    "route",
    ["/v2/rerank", "/v1/rerank", "/v1/rerank objects", "/rerank", "/rerank raw_scores", "/v1/streams"],
)
def test_every_gateway_route_scores_a_blank_document_last(deployment: Deployment, route: str) -> None:
    query = f"{QUERY} {uuid.uuid4().hex[:6]}"  # a fresh job: the gateway's retained answers are keyed on it
    documents = [REAL[0], "", REAL[1], "\u200b", " \n"]
    blank = {1, 3, 4}
    if route == "/v2/rerank":
        answer = deployment.post(route, {"model": "m", "query": query, "documents": documents})
        assert answer.status_code == 200, answer.text
        results = [(r["index"], r["relevance_score"]) for r in answer.json()["results"]]
    elif route == "/v1/rerank":
        answer = deployment.post(route, {"query": query, "documents": documents})
        assert answer.status_code == 200, answer.text
        results = [(r["index"], r["relevance_score"]) for r in answer.json()["results"]]
    elif route == "/v1/rerank objects":
        # haystack's content=None, llama-index's empty node: an object whose text is empty or absent.
        objects = [{"text": REAL[0]}, {"text": None}, {"text": REAL[1]}, {}, {"text": " \n", "id": "x"}]
        answer = deployment.post("/v1/rerank", {"query": query, "documents": objects, "return_documents": True})
        assert answer.status_code == 200, answer.text
        results = [(r["index"], r["relevance_score"]) for r in answer.json()["results"]]
        assert [r["document"] for r in answer.json()["results"]][-1] in objects  # as sent
    elif route.startswith("/rerank"):
        raw = route.endswith("raw_scores")
        answer = deployment.post("/rerank", {"query": query, "texts": documents, "raw_scores": raw})
        assert answer.status_code == 200, answer.text
        results = [(r["index"], r["score"]) for r in answer.json()]
    else:
        candidates = [{"id": f"d{i}", "text": t} for i, t in enumerate(documents)]
        opened = deployment.post(route, {"query": query, "candidates": candidates, "allow_shallow": True})
        assert opened.status_code == 201, opened.text
        page = httpx.get(
            f"{deployment.gateway.url}/v1/streams/{opened.json()['stream_id']}/page?offset=0&limit=10&wait=30",
            headers={"Authorization": f"Bearer {deployment.key}"},
            timeout=60,
        ).json()
        assert page["complete"], page
        results = [(int(r["decision"]["id"][1:]), r["decision"]["score"]) for r in page["rows"]]
    assert len(results) == len(documents)  # every document answered
    assert {i for i, _ in results[-3:]} == blank, results  # the blank ones last
    if route != "/v1/streams":
        # A number every client can read: the lowest score its API has (0, or TEI's raw logit of it).
        low = min(s for i, s in results if i not in blank)
        assert all(isinstance(s, float) and math.isfinite(s) and s <= low for i, s in results if i in blank)


@pytest.mark.parametrize("query", ["", " ", "\u200b", "\ufeff\u3000"])
def test_a_blank_query_is_refused_at_every_door(deployment: Deployment, query: str) -> None:
    with RerankClient(load_settings(deployment.env)) as client, pytest.raises(ValidationError) as refused:
        client.open(query, [{"id": "a", "text": REAL[0]}], allow_shallow=True)
    assert refused.value.field == "query"
    for path, body, status in [
        ("/v2/rerank", {"model": "m", "query": query, "documents": REAL}, 400),
        ("/rerank", {"query": query, "texts": REAL}, 422),
        ("/v1/streams", {"query": query, "candidates": [{"id": "a", "text": REAL[0]}]}, 422),
    ]:
        answer = deployment.post(path, body)
        assert answer.status_code == status and "query" in answer.text, (path, answer.text)


def test_submit_scores_blank_texts_last(deployment: Deployment, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    candidates = [{"id": "real0", "text": REAL[0]}, {"id": "empty", "text": ""}, {"id": "zw", "text": "\u200b"}]
    candidates.append({"id": "real1", "text": REAL[1]})
    jobs.write_text(json.dumps({"id": "j1", "query": QUERY, "candidates": candidates}) + "\n")
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [str(RERANKQ), "submit", str(jobs), "--out", str(out), "--allow-shallow"],
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = read_jsonl(out)
    assert [row["id"] for row in line["rows"]][-2:] == ["empty", "zw"]
