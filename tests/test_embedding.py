"""The embedding member: the packaged bi-encoder, its engine, its scale, served through real
workers, its embeddings kept for MMR, and the default chain falling back to it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import pytest

from devservers.tiny_model import BI_ENCODER_PROMPTS, build_prompted_bi_encoder
from kernel.settings import MemberSettings
from kernel.wire import encode, pack_embeddings, window_embeddings_decoder
from producer import RerankClient, load_settings
from worker.chain.checks import check_scores
from worker.providers.base import ProviderStartError, UnusableResponse
from worker.scoring.decide import normalise

QUERY = "how do I recover checkout after the payment gateway returns 502 errors"
RELEVANT = [
    "When the payment gateway returns 502 Bad Gateway on checkout, check the upstream health page, then fail "
    "over to the secondary gateway region.",
    "The 502s on checkout were caused by an expired TLS certificate on the payment gateway's load balancer; "
    "rotating the certificate restored checkout.",
]
UNRELATED = [
    "The third-floor coffee machine is descaled every Monday morning.",
    "Employees are entitled to sixteen weeks of paid parental leave.",
    "Colours and spacing come from the design token package.",
    "Laptops must use full-disk encryption and lock after five minutes.",
    "Mobile releases ship every two weeks; a hotfix needs sign-off from the release captain.",
    "Vendor invoices are paid on net-30 terms; the payment run happens every Thursday.",
]
# Unrelated first, so fusion order is wrong and only a real model puts the relevant ones on top.
DOCUMENTS = UNRELATED + RELEVANT
EMBEDDING_ONLY = {"RERANKQ_RERANKER_PROVIDER": "embedding", "RERANKQ_RERANKER_MODEL": ""}


@pytest.fixture(scope="module")
def packaged_engine():
    from worker.engine.embedding import shared_embedding_engine
    from worker.providers.embedding import packaged_model

    path, _ = packaged_model()
    return shared_embedding_engine(path, device="cpu", settings=load_settings({}, precision="fp32"))


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_the_engine_gives_sentence_transformers_cosines_however_it_batches(packaged_engine):
    model = packaged_engine.sentence_transformer
    reference = model.encode([QUERY, *DOCUMENTS], convert_to_tensor=True, normalize_embeddings=True)
    expected = (reference[1:] @ reference[0]).tolist()
    pairs = [(QUERY, d) for d in DOCUMENTS]

    wide = packaged_engine.score_pairs(pairs)
    packaged_engine.token_budget, budget = 48, packaged_engine.token_budget
    try:
        narrow = packaged_engine.score_and_embed(pairs)
        batches = packaged_engine.batches(packaged_engine.tokenize([QUERY, *DOCUMENTS]))
    finally:
        packaged_engine.token_budget = budget

    assert max(abs(a - b) for a, b in zip(wide, expected)) < 1e-5
    assert max(abs(a - b) for a, (b, _) in zip(wide, narrow)) < 1e-5
    assert len(batches) > 1 and all(b.padded_tokens <= 48 or len(b.indices) == 1 for b in batches)
    # The returned embedding is the document's own normalised vector.
    assert max(abs(a - b) for a, b in zip(narrow[-1][1], reference[-1].tolist())) < 1e-5
    top_two = sorted(range(len(wide)), key=lambda i: -wide[i])[:2]
    assert {DOCUMENTS[i] for i in top_two} == set(RELEVANT)


def test_cosine_is_clipped_at_zero_never_rescaled_and_checked_for_range():
    assert normalise(0.42, "cosine") == 0.42
    assert normalise(-0.3, "cosine") == 0.0
    assert normalise(1.0, "cosine") == 1.0
    check_scores([-1.0, 0.2, 1.0], 3, scale="cosine")
    with pytest.raises(UnusableResponse) as err:
        check_scores([0.1, 1.5], 2, scale="cosine")
    assert err.value.reason == "out_of_scale"


def test_a_scale_set_on_an_embedding_member_is_refused_with_the_variable_to_unset():
    from worker.providers.embedding import EmbeddingProvider

    with pytest.raises(ProviderStartError) as err:
        EmbeddingProvider(MemberSettings(provider="embedding", scale="logit"), load_settings({}))
    assert err.value.reason == "scale" and err.value.remedy is not None
    assert err.value.remedy.render("RERANKQ_RERANKER_1_SCALE") == "unset RERANKQ_RERANKER_1_SCALE"


def test_packed_embeddings_round_trip_and_refuse_a_wrong_size():
    packed = pack_embeddings(2, "0:embedding", [50, 52], [[0.5, -0.25, 1.0], [0.0, 0.125, -1.0]])
    assert packed.unpack() == {50: [0.5, -0.25, 1.0], 52: [0.0, 0.125, -1.0]}
    assert window_embeddings_decoder.decode(encode(packed)).unpack() == packed.unpack()
    short = msgspec.structs.replace(packed, vectors=packed.vectors[:-4])
    with pytest.raises(ValueError):
        window_embeddings_decoder.decode(encode(short)).unpack()


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_the_embedding_member_serves_through_a_worker_and_keeps_embeddings_for_mmr(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient], packaged_engine
) -> None:
    start_worker(env=EMBEDDING_ONLY)
    client = make_client()
    # The best answer twice, under two ids and worded a little apart: what MMR is for.
    duplicate = RELEVANT[1].replace("; rotating", ". Rotating")
    items = [{"id": f"u{i}", "text": t} for i, t in enumerate(UNRELATED)]
    items += [
        {"id": "gw", "text": RELEVANT[0]},
        {"id": "tls", "text": RELEVANT[1]},
        {"id": "tls-copy", "text": duplicate},
    ]
    stream = client.open(QUERY, items, window_size=len(items))
    page = client.pull(stream, 0, len(items), timeout=120)

    assert page.complete and {r.served_by for r in page.rows} == {"0:embedding"}
    assert {r.id for r in page.rows[:3]} == {"gw", "tls", "tls-copy"}
    assert all(0.0 <= r.score <= 1.0 for r in page.rows)
    # The decision's score is the cosine the bi-encoder gives (clipped at 0), nothing rescaled.
    expected = dict(zip(["gw", "tls"], packaged_engine.score_pairs([(QUERY, RELEVANT[0]), (QUERY, RELEVANT[1])])))
    for row in page.rows:
        if row.id in expected:
            assert row.score == pytest.approx(max(0.0, expected[row.id]), abs=1e-4)

    kept = client.store.load_embeddings(stream, [0])
    assert sorted(kept) == list(range(len(items))) and {len(v) for v in kept.values()} == {384}
    # The two copies score highest, so plain selection keeps both; MMR over the kept
    # embeddings sees they say one thing and takes the other relevant document instead.
    plain = client.select(stream, 2, depth=len(items))
    assert {r.id for r in plain.rows} == {"tls", "tls-copy"}
    diverse = client.select(stream, 2, depth=len(items), mmr_lambda=0.5)
    assert len({r.id for r in diverse.rows} & {"tls", "tls-copy"}) == 1 and "gw" in {r.id for r in diverse.rows}

    # A second stream over the same pairs is answered by the pair cache, not the model:
    # its embeddings are kept all the same.
    again = client.open(QUERY, items, window_size=len(items))
    assert client.pull(again, 0, len(items), timeout=120).complete
    assert client.store.counters().get("pair_cache_hits", 0) >= len(items)
    kept_again = client.store.load_embeddings(again, [0])
    assert max(abs(a - b) for i in kept for a, b in zip(kept[i], kept_again[i])) < 1e-5


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_with_no_chain_configured_an_offline_worker_reranks_with_the_packaged_model(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient]
) -> None:
    # No RERANKQ_RERANKER_* at all (any one of them configures a chain): the default chain.
    # HF_HUB_OFFLINE (base_env) keeps the cross-encoder from loading, as on a machine with no network.
    start_worker(drop=("RERANKQ_RERANKER_PROVIDER", "RERANKQ_RERANKER_MODEL", "RERANKQ_RERANKER_BACKEND"))
    client = make_client()
    sample = json.loads(resources.files("producer").joinpath("sample/sample.json").read_text())
    stream = client.open(sample["query"], sample["candidates"][:10], window_size=10)
    page = client.pull(stream, 0, 10, timeout=120)

    status = client.status(stream).windows[0]
    assert status.served_by == "1:embedding"
    assert status.failovers and status.failovers[0].startswith("0:local: ")
    # The sample's first window holds two payment-gateway documents among office notes.
    assert {r.id for r in page.rows[:2]} == {"doc-00", "doc-07"}


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_coalesced_windows_get_their_own_scores_and_embeddings(packaged_engine):
    """A threads-pool worker coalesces windows of many streams into one engine call."""
    from concurrent.futures import ThreadPoolExecutor

    from worker.providers.base import ScoreRequest
    from worker.providers.embedding import EmbeddingProvider

    settings = load_settings({}, precision="fp32", coalesce=True, coalesce_delay_ms=200)
    provider = EmbeddingProvider(MemberSettings(provider="embedding"), settings)
    assert provider.coalescer is not None and provider.engine is packaged_engine
    windows = [(QUERY, DOCUMENTS), ("who approves leave requests", UNRELATED[:4])]

    def run(window: tuple[str, list[str]]) -> tuple[list[float | None], list[list[float]]]:
        query, documents = window
        scores = provider.score(ScoreRequest(query=query, documents=documents), deadline=time.monotonic() + 120)
        return scores, provider.embed(list(documents))

    flushes = provider.coalescer.flushes
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, windows))
    assert provider.coalescer.flushes == flushes + 1  # both windows in one forward call
    for (query, documents), (scores, vectors) in zip(windows, results):
        alone = packaged_engine.score_and_embed([(query, d) for d in documents])
        assert max(abs(s - a) for s, (a, _) in zip(scores, alone)) < 1e-5
        assert max(abs(x - y) for v, (_, w) in zip(vectors, alone) for x, y in zip(v, w)) < 1e-5


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_a_gpu_worker_whose_only_model_is_the_bi_encoder_refuses_to_start_without_cuda(base_env):
    import subprocess
    import sys

    import torch
    from conftest import ROOT

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the worker would rightly start")
    env = {**base_env, **EMBEDDING_ONLY, "RERANKQ_RERANKER_1_PROVIDER": "rrf"}
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "--device", "gpu"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "no CUDA device" in proc.stderr and " ready." not in proc.stderr


# --- a bi-encoder that ships query/document prompts (e5-, bge-, gte-, nomic-style) -------------

INSTRUCTION = "Instruct: find the runbook that fixes a checkout outage\nQuery: "


@pytest.fixture(scope="module")
def prompted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_prompted_bi_encoder(tmp_path_factory.mktemp("prompted") / "model")


@pytest.fixture(scope="module")
def prompted_engine(prompted_dir: Path):
    from worker.engine.embedding import EmbeddingEngine
    from worker.engine.loading import load_sentence_transformer

    return EmbeddingEngine(
        load_sentence_transformer(str(prompted_dir), device="cpu"), settings=load_settings({}, precision="fp32")
    )


def library_cosines(model: Any, query: str, documents: list[str], *, prompt: str | None = None) -> list[float]:
    q = model.encode_query([query], prompt=prompt, convert_to_tensor=True, normalize_embeddings=True)
    d = model.encode_document(documents, convert_to_tensor=True, normalize_embeddings=True)
    return (d @ q[0]).tolist()


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder
def test_a_bi_encoder_with_prompts_scores_as_encode_query_and_encode_document(prompted_engine):
    model = prompted_engine.sentence_transformer
    assert model.prompts["query"] == BI_ENCODER_PROMPTS["query"]
    documents = [*DOCUMENTS, QUERY]  # the last document has the query's own text
    pairs = [(QUERY, d) for d in documents]

    expected = library_cosines(model, QUERY, documents)
    scores = prompted_engine.score_pairs(pairs)
    assert max(abs(a - b) for a, b in zip(scores, expected)) < 1e-5
    # The prompts change the numbers: scoring the bare texts would be off.
    bare = model.encode([QUERY, *documents], convert_to_tensor=True, normalize_embeddings=True)
    assert max(abs(a - b) for a, b in zip(scores, (bare[1:] @ bare[0]).tolist())) > 0.01
    # A document with the query's text is embedded as a document ("passage: ..."), not reused as the query.
    assert scores[-1] == pytest.approx(expected[-1], abs=1e-5) and scores[-1] < 0.999

    # An instruction takes the query prompt's place, as encode_query(prompt=...) does.
    instructed = prompted_engine.score_pairs(pairs, prompt=INSTRUCTION)
    expected_instructed = library_cosines(model, QUERY, documents, prompt=INSTRUCTION)
    assert max(abs(a - b) for a, b in zip(instructed, expected_instructed)) < 1e-5
    assert max(abs(a - b) for a, b in zip(instructed, scores)) > 0.01


@pytest.mark.slow  # loads the packaged MiniLM bi-encoder in a real worker
def test_a_worker_serves_a_prompted_bi_encoder_with_the_streams_instruction(
    prompted_dir: Path, prompted_engine, start_worker: Callable[..., Any], make_client: Callable[..., RerankClient]
) -> None:
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "embedding",
            "RERANKQ_RERANKER_MODEL": str(prompted_dir),
            "RERANKQ_PAIR_CACHE": "false",
        }
    )
    client = make_client()
    items = [{"id": f"d{i}", "text": t} for i, t in enumerate(DOCUMENTS)]
    model = prompted_engine.sentence_transformer
    for instruction in (None, INSTRUCTION):
        stream = client.open(QUERY, items, window_size=len(items), instruction=instruction)
        page = client.pull(stream, 0, len(items), timeout=120)
        expected = dict(zip((i["id"] for i in items), library_cosines(model, QUERY, DOCUMENTS, prompt=instruction)))
        assert page.complete and {r.served_by for r in page.rows} == {"0:embedding"}
        assert client.status(stream).windows[0].instruction_ignored_by is None  # the query prompt carried it
        for row in page.rows:
            assert row.score == pytest.approx(max(0.0, expected[row.id]), abs=1e-4)
