"""Cascades through real workers: a cheap chain scores every window, a precise one re-reads its
best rows, each pair scored at most once per stage, and nothing lost between stages.

Two real rerank servers on loopback stand for the two models: ``fast`` scores a document by its
text, ``precise`` by its text and a salt (another model's opinion), so the test knows each
stage's order from ``expected_score`` alone and counts what each server was sent.
"""

from __future__ import annotations

import re

import pytest
from conftest import make_candidates
from delivery_helpers import commits_per_window, patient, wait_for
from rerank_servers import RerankServer, expected_score

from kernel.cost import candidate_cost
from kernel.errors import ValidationError
from kernel.settings import load_settings
from kernel.store import Store, connect
from kernel.wire import Candidate, StreamSpec
from producer import RerankClient
from worker.chain import Chain
from worker.windows import WindowScorer

SALT = "a precise model"
N, WINDOW = 40, 10


def chain_env(fast: RerankServer, precise: RerankServer, **extra: str) -> dict[str, str]:
    return {
        "RERANKQ_RERANKER_PROVIDER": "tei",
        "RERANKQ_RERANKER_URL": fast.url,
        "RERANKQ_RERANKER_MAX_RETRIES": "0",
        "RERANKQ_RERANKER_1_PROVIDER": "tei",
        "RERANKQ_RERANKER_1_URL": precise.url,
        "RERANKQ_RERANKER_1_MAX_RETRIES": "0",
        "RERANKQ_CHAIN_FAST": "0",
        "RERANKQ_CHAIN_PRECISE": "1",
        **extra,
    }


@pytest.fixture
def servers(server):
    fast, precise = server("tei"), server("tei")
    precise.salt = SALT
    return fast, precise


def candidates() -> list[dict[str, str]]:
    return make_candidates(N, text="checkout 502 runbook, part {i}")


def first_stage_order(texts: list[str]) -> list[int]:
    """Fusion order cut into windows, each window by the fast model's score: the first stage's rows."""
    order = []
    for start in range(0, len(texts), WINDOW):
        window = range(start, min(start + WINDOW, len(texts)))
        order += sorted(window, key=lambda i: -expected_score(texts[i]))
    return order


def sent_texts(server: RerankServer) -> list[str]:
    return [text for seen in server.requests for text in seen.body["texts"]]


def open_cascade(client: RerankClient, **later: object) -> str:
    stage = {"chain": "precise", "keep": 12, **later}
    return client.open("checkout 502", candidates(), window_size=WINDOW, stages=[{"chain": "fast"}, stage])


def test_the_second_stage_reads_the_first_stages_best_once_and_a_deeper_pull_pays_nothing(
    servers, start_worker, make_client
):
    fast, precise = servers
    env = chain_env(fast, precise)
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    stream = open_cascade(client)
    texts = [c["text"] for c in candidates()]

    top = client.pull(stream, 0, 12, timeout=patient(30))
    best12 = first_stage_order(texts)[:12]
    assert sorted(sent_texts(precise)) == sorted(texts[i] for i in best12)  # exactly the first stage's top 12
    assert [r.decision.index for r in top.rows] == sorted(best12, key=lambda i: -expected_score(texts[i], SALT))
    assert {(r.stage, r.served_by) for r in top.rows} == {(2, "1:tei")}
    assert [(s.stage, s.read, s.windows, s.committed) for s in top.stages] == [(1, N, 4, 2), (2, 12, 1, 1)]

    page = client.pull(stream, 0, N, timeout=patient(30))  # deeper: the first stage's windows 2 and 3
    assert page.complete and page.total == N
    rest = [r.decision.index for r in page.rows[12:]]
    assert rest == first_stage_order(texts)[12:]  # the rest in the first stage's order
    assert {(r.stage, r.served_by) for r in page.rows[12:]} == {(1, "0:tei")}
    assert sorted(sent_texts(fast)) == sorted(texts)  # every pair once per stage, none twice
    assert len(sent_texts(precise)) == 12

    calls = fast.count, precise.count
    for offset, limit in ((0, 12), (5, 20), (0, N)):
        again = client.pull(stream, offset, limit, timeout=1)
        assert again.rows == page.rows[offset : offset + limit]
    assert (fast.count, precise.count) == calls  # what was decided is read, never scored again
    assert set(commits_per_window(client.store.client, client, stream).values()) == {1}


@pytest.mark.parametrize("budget", ["max_pairs", "max_tokens"])
def test_a_budget_stops_the_second_stage_where_it_says(servers, start_worker, make_client, budget):
    fast, precise = servers
    env = chain_env(fast, precise)
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    texts = [c["text"] for c in candidates()]
    order = first_stage_order(texts)
    # Five pairs, or the tokens of the first stage's best five and not of its sixth.
    spec = StreamSpec(query="checkout 502", window_size=WINDOW)
    costs = [candidate_cost(spec, Candidate(id=f"c{i}", text=texts[i])) for i in order[:5]]
    stream = open_cascade(client, **{budget: 5 if budget == "max_pairs" else sum(costs)})

    page = client.pull(stream, 0, 12, timeout=patient(30))
    assert sorted(sent_texts(precise)) == sorted(texts[i] for i in order[:5])
    assert [r.decision.index for r in page.rows[:5]] == sorted(order[:5], key=lambda i: -expected_score(texts[i], SALT))
    assert [r.decision.index for r in page.rows[5:]] == order[5:12]  # past the budget: the first stage's order
    assert [r.stage for r in page.rows] == [2] * 5 + [1] * 7
    assert (page.stages[1].read, page.stages[1].stopped) == (5, budget)


def test_a_failing_second_stage_leaves_the_first_stages_order_and_says_why(servers, start_worker, make_client):
    fast, precise = servers
    precise.mode = "500"
    env = chain_env(fast, precise)
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    stream = open_cascade(client)
    texts = [c["text"] for c in candidates()]

    page = client.pull(stream, 0, 20, timeout=patient(30), raise_on_failed=True)
    assert [r.decision.index for r in page.rows] == first_stage_order(texts)[:20]
    assert {(r.stage, r.kind, r.served_by) for r in page.rows} == {(1, "ranked", "0:tei")}
    second = page.stages[1]
    assert (second.read, second.committed, second.fell_back) == (12, 1, 12)
    assert any("http_500" in reason or "500" in reason for reason in second.reasons), second.reasons
    status = client.status(stream)
    assert [w.failed for w in status.windows if w.stage == 2] == [12]


def test_a_stage_window_begun_past_its_time_budget_keeps_the_earlier_order(servers, start_worker, make_client):
    fast, precise = servers
    precise.plan = ["hang"]  # the first of the stage's windows holds the only worker process
    precise.hang_s = 3.0
    env = chain_env(fast, precise, RERANKQ_RERANKER_1_TIMEOUT_S="10")
    start_worker(env=env, args=["--device", "cpu", "--processes", "1"], drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    stream = open_cascade(client, window_size=6, max_seconds=1)
    texts = [c["text"] for c in candidates()]

    page = client.pull(stream, 0, 12, timeout=patient(30))
    order = first_stage_order(texts)
    assert [r.decision.index for r in page.rows[:6]] == sorted(order[:6], key=lambda i: -expected_score(texts[i], SALT))
    assert [r.decision.index for r in page.rows[6:]] == order[6:12]
    assert [r.stage for r in page.rows] == [2] * 6 + [1] * 6
    second = page.stages[1]
    assert second.fell_back == 6 and any("max_seconds" in r for r in second.reasons), second
    assert precise.count == 1  # the late window was never sent


def test_a_crash_between_the_stages_loses_nothing(servers, start_worker, make_client, base_env):
    """The first stage is committed by a worker that dies before it sends the second stage's
    messages (the scorer runs here, in process, without the send); a real worker's sweep then
    finds the second stage's window, admitted once, and it is scored once."""
    fast, precise = servers
    env = chain_env(fast, precise, RERANKQ_REDELIVER_AFTER_S="4", RERANKQ_SWEEP_INTERVAL_S="1")
    client = make_client(env)
    stream = open_cascade(client)
    settings = load_settings({**base_env, **env})
    store = Store(connect(settings.store.redis_url), settings.store.namespace)
    dying = WindowScorer(settings, store, Chain.from_settings(settings))  # commits, never sends
    for window in (0, 1):
        assert dying.process(stream, window, delivery=f"dying-{window}") == "committed"
    snapshot = store.snapshot(stream)
    assert snapshot.handed[2].windows == 1 and precise.count == 0

    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    page = client.pull(stream, 0, 12, timeout=patient(30))
    texts = [c["text"] for c in candidates()]
    assert [r.stage for r in page.rows] == [2] * 12
    assert sorted(sent_texts(precise)) == sorted(texts[i] for i in first_stage_order(texts)[:12])
    second_window = snapshot.stage_windows()[1].first
    assert store.attempts(stream)[second_window] == 1
    assert commits_per_window(store.client, client, stream)[second_window] == 1
    assert store.snapshot(stream).handed[2].members == snapshot.handed[2].members  # handed once


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"chain": "fast", "stages": [{"chain": "fast"}, {"chain": "precise", "keep": 5}]}, "chain"),
        ({"stages": [{"chain": "fast"}, {"chain": "precise"}]}, "stages[1].keep"),
        ({"stages": [{"chain": "fast", "keep": 10}, {"chain": "precise", "keep": 20}]}, "stages[1].keep"),
        ({"stages": [{"chain": "fast", "max_pairs": 3}, {"chain": "precise", "keep": 5}]}, "stages[0].max_pairs"),
        ({"stages": [{"chain": "fast"}, {"chain": "nope", "keep": 5}]}, "stages[1].chain"),
        (
            {"stages": [{"chain": "fast"}, {"chain": "precise", "keep": 5, "window_size": 100000}]},
            "stages[1].window_size",
        ),
        ({"stages": "fast,precise:x"}, "stages[1]"),
        ({"stages": [{"chain": "fast"}] * 5}, "stages"),
    ],
)
def test_a_cascade_that_cannot_run_is_refused_at_open_naming_the_field(make_client, servers, options, field):
    client = make_client(chain_env(*servers))
    with pytest.raises(ValidationError) as refused:
        client.open("checkout 502", candidates(), **options)
    assert refused.value.field == field


def test_the_text_form_and_the_first_stages_keep(make_client, servers, start_worker):
    fast, precise = servers
    env = chain_env(fast, precise)
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    stream = client.open("checkout 502", candidates(), window_size=WINDOW, stages="fast:20,precise:4")
    page = client.pull(stream, 0, 50, timeout=patient(30))
    assert page.complete and page.total == 20  # the first stage read the fused list's best 20
    assert [r.stage for r in page.rows] == [2] * 4 + [1] * 16
    wait_for(lambda: fast.count == 2, 5, "the first stage's two windows")


def test_a_cancel_between_the_stages_cancels_the_handed_window_and_reads_complete(servers, make_client, base_env):
    fast, precise = servers
    env = chain_env(fast, precise)
    client = make_client(env)
    stream = open_cascade(client)
    settings = load_settings({**base_env, **env})
    store = Store(connect(settings.store.redis_url), settings.store.namespace)
    scorer = WindowScorer(settings, store, Chain.from_settings(settings))
    for window in (0, 1):
        scorer.process(stream, window, delivery=f"w{window}")  # the second stage is handed its window

    outcome = client.cancel(stream)
    texts = [c["text"] for c in candidates()]
    second_window = store.snapshot(stream).stage_windows()[1].first
    assert outcome.cancelled_windows == [2, 3, second_window]
    page = client.pull(stream, 0, N, timeout=1)
    assert page.complete and page.total == N
    assert [r.decision.index for r in page.rows[:20]] == first_stage_order(texts)[:20]  # the first stage's order
    assert [r.kind for r in page.rows] == ["ranked"] * 20 + ["cancelled"] * 20
    assert scorer.process(stream, second_window, delivery="late") == "already_committed"
    assert precise.count == 0


def test_a_listwise_member_as_the_last_stage_reorders_the_first_stages_best(server, start_worker, make_client):
    fast, chat = server("tei"), server("chat")

    def reverse(body: dict) -> str:  # a model that answers the passages it is shown in reverse
        shown = max(int(n) for n in re.findall(r"\[(\d+)\]", body["messages"][-1]["content"]))
        return " > ".join(f"[{n}]" for n in range(shown, 0, -1))

    chat.chat_model = reverse
    env = {
        **chain_env(fast, chat),
        "RERANKQ_RERANKER_1_PROVIDER": "listwise",
        "RERANKQ_RERANKER_1_MODEL": "castorini/rank_zephyr_7b_v1_full",
    }
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    stream = open_cascade(client, keep=8)
    texts = [c["text"] for c in candidates()]

    page = client.pull(stream, 0, 12, timeout=patient(30))
    order = first_stage_order(texts)
    assert [r.decision.index for r in page.rows] == order[:8][::-1] + order[8:12]
    assert [(r.stage, r.served_by) for r in page.rows[:8]] == [(2, "1:listwise")] * 8
    assert [r.score for r in page.rows[:8]] == pytest.approx([1 - 0.9 * k / 7 for k in range(8)])
    assert chat.count == 1
