"""The evaluation harness on a tiny collection whose answers are worked out by hand: the
measures ir-measures gives, and the whole harness through a private Redis and worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from math import log2
from pathlib import Path

import pytest
from conftest import ROOT

from evaluation.measures import evaluate
from evaluation.trec import InputError, read_qrels, read_run

# q1: five retrieved, the grade-3 and grade-2 answers third and fifth, a grade-1 one
# fourth and another grade-1 one never retrieved. q2: four retrieved, answers first and last.
QRELS = """\
q1 0 d1 0
q1 0 d2 0
q1 0 d3 3
q1 0 d4 1
q1 0 d5 2
q1 0 dX 1
q2 0 e1 2
q2 0 e2 0
q2 0 e4 3
"""
RUN = "".join(
    f"{q} Q0 {d} {r} {10 - r}.0 bm25\n"
    for q, docs in (("q1", "d1 d2 d3 d4 d5"), ("q2", "e1 e2 e3 e4"))
    for r, d in enumerate(docs.split(), start=1)
)
QUERIES = "q1\thow do I restart the payment gateway\nq2\twhat fixes a stuck deploy\n"
DOCUMENTS = {
    "d1": "An overview of the payment gateway.",
    "d2": "Payment gateway pricing tiers.",
    "d3": "Fix: restart the gateway pods one region at a time.",
    "d4": "Where the gateway writes its logs.",
    "d5": "Fix: drain the gateway, then restart it.",
    "dX": "Restart checklist for the gateway.",
    "e1": "Fix a stuck deploy by cancelling the rollout.",
    "e2": "Deploy calendar for the quarter.",
    "e3": "Who approves a deploy.",
    "e4": "The fix for a stuck deploy: clear the lock file.",
}

# By hand: gain = grade, discount log2(rank + 1); ideal order of q1's grades 3, 2, 1, 1 and q2's 3, 2.
IDCG_Q1 = 3 + 2 / log2(3) + 1 / log2(4) + 1 / log2(5)
IDCG_Q2 = 3 + 2 / log2(3)
INPUT = {  # the run as given: q1 d1 d2 d3 d4 d5, q2 e1 e2 e3 e4
    "q1": {
        "nDCG@10": (3 / log2(4) + 1 / log2(5) + 2 / log2(6)) / IDCG_Q1,
        "P@1": 0.0,
        "P@5": 3 / 5,
        "P@10": 3 / 10,
        "P@20": 3 / 20,
        "R@1": 0.0,
        "R@5": 3 / 4,
        "R@10": 3 / 4,
        "R@20": 3 / 4,
        "MRR@10": 1 / 3,
    },
    "q2": {
        "nDCG@10": (2 + 3 / log2(5)) / IDCG_Q2,
        "P@1": 1.0,
        "P@5": 2 / 5,
        "P@10": 2 / 10,
        "P@20": 2 / 20,
        "R@1": 1 / 2,
        "R@5": 1.0,
        "R@10": 1.0,
        "R@20": 1.0,
        "MRR@10": 1.0,
    },
}
RERANKED = {  # the keyword provider over everything: q1 d3 d5 d1 d2 d4, q2 e1 e4 e2 e3
    "q1": {
        "nDCG@10": (3 + 2 / log2(3) + 1 / log2(6)) / IDCG_Q1,
        "P@1": 1.0,
        "P@5": 3 / 5,
        "R@1": 1 / 4,
        "R@5": 3 / 4,
        "MRR@10": 1.0,
    },
    "q2": {"nDCG@10": (2 + 3 / log2(3)) / IDCG_Q2, "P@1": 1.0, "P@5": 2 / 5, "R@1": 1 / 2, "R@5": 1.0, "MRR@10": 1.0},
}


@pytest.fixture
def tiny_collection(tmp_path: Path) -> dict[str, Path]:
    files = {
        "qrels": tmp_path / "qrels.txt",
        "run": tmp_path / "run.txt",
        "queries": tmp_path / "queries.tsv",
        "documents": tmp_path / "documents.jsonl",
    }
    files["qrels"].write_text(QRELS)
    files["run"].write_text(RUN)
    files["queries"].write_text(QUERIES)
    files["documents"].write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in DOCUMENTS.items()))
    return files


def test_ir_measures_agrees_with_the_values_worked_out_by_hand(tiny_collection):
    qrels = read_qrels(tiny_collection["qrels"])
    rankings = {q: [r.docid for r in ranked] for q, ranked in read_run(tiny_collection["run"]).items()}
    scores = evaluate(qrels, rankings)
    for qid, expected in INPUT.items():
        for measure, value in expected.items():
            assert scores.per_query[measure][qid] == pytest.approx(value, abs=1e-9), (qid, measure)
    for measure in INPUT["q1"]:
        assert scores.mean[measure] == pytest.approx((INPUT["q1"][measure] + INPUT["q2"][measure]) / 2, abs=1e-9)
    # A stricter relevance bar: only grades 2 and 3 count for P, R and MRR.
    strict = evaluate(qrels, rankings, relevant_grade=2)
    assert strict.per_query["R@5"]["q1"] == pytest.approx(2 / 2) and strict.per_query["MRR@10"]["q1"] == 1 / 3


def test_a_malformed_line_is_named_by_file_and_line(tmp_path: Path):
    bad = tmp_path / "qrels.txt"
    bad.write_text("q1 0 d1 1\nq1 0 d2 relevant\n")
    with pytest.raises(InputError, match=r"qrels.txt:2: the grade must be an integer"):
        read_qrels(bad)


def run_harness(files: dict[str, Path], extra: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **env_extra})
    args = [f"--{k}={v}" for k, v in files.items()]
    return subprocess.run(
        [sys.executable, "-m", "evaluation", *args, *extra],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_harness_reranks_through_a_private_queue_and_reports_each_member_and_depth(tiny_collection, tmp_path):
    chain = {
        "RERANKQ_RERANKER_PROVIDER": "tests.evaluation_providers:KeywordProvider",
        "RERANKQ_RERANKER_1_PROVIDER": "rrf",
    }
    plots = tmp_path / "plots"
    done = run_harness(
        tiny_collection, ["--depths=2,5", "--json", str(tmp_path / "eval.json"), "--plots", str(plots)], chain
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    keyword, rrf = report["members"]
    assert keyword["label"] == "0:tests.evaluation_providers:KeywordProvider" and rrf["label"] == "1:rrf"

    # The input run, and the passthrough member (which keeps it), score as worked out by hand.
    for entry in (report["input_run"], rrf["depths"]["5"], rrf["depths"]["2"]):
        for measure in INPUT["q1"]:
            for qid in ("q1", "q2"):
                assert entry["per_query"][measure][qid] == pytest.approx(INPUT[qid][measure], abs=1e-9)
    # Reranking everything puts the fixes first.
    full = keyword["depths"]["5"]
    for qid, expected in RERANKED.items():
        for measure, value in expected.items():
            assert full["per_query"][measure][qid] == pytest.approx(value, abs=1e-9), (qid, measure)
    assert full["ndcg10_vs_input_run"] == {"better": 2, "same": 0, "worse": 0}
    assert full["served_by"] == ["0:tests.evaluation_providers:KeywordProvider"]
    assert full["provider_calls_per_query"] == 1.0 and full["failed_queries"] == {}
    # Reranking the top 2 only: neither query has a fix among its first two, so nothing moves.
    shallow = keyword["depths"]["2"]
    assert shallow["mean"]["nDCG@10"] == pytest.approx(report["input_run"]["mean"]["nDCG@10"], abs=1e-12)
    # Latency is measured, the queue's wait apart from the scoring.
    latency = full["latency"]
    assert 0 < latency["scoring_ms"]["p50"] <= latency["total_ms"]["p50"]
    assert latency["queue_ms"]["p50"] >= 0 and latency["total_ms"]["p95"] >= latency["total_ms"]["p50"]

    assert "Depth sweep" in done.stdout and "0.904" in done.stdout  # (0.8953 + 0.9134) / 2
    # The verdict: depth x kept, the knee, one sentence. Depth 5 is the keyword member's best,
    # and depth 2 moves nothing: the knee is 5, and reranking there earns its latency.
    verdict = report["verdict"]
    assert verdict["knees"]["0:tests.evaluation_providers:KeywordProvider"] == 5
    at = {(r["member"], r["depth"]): r for r in verdict["rows"]}
    full_row = at[("0:tests.evaluation_providers:KeywordProvider", 5)]
    # Kept 3 of q1 d3 d5 d1 (two of its four relevant) and of q2 e1 e4 e2 (both of its two).
    assert full_row["kept"]["3"]["recall"] == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert full_row["kept"]["3"]["precision"] == pytest.approx(2 / 3)
    assert full_row["kept"]["3"]["tokens"] > 0
    assert full_row["kept"]["12"]["tokens"] >= full_row["kept"]["3"]["tokens"]
    assert full_row["vs_input"] == {"better": 2, "same": 0, "worse": 0}
    assert verdict["sentence"].startswith("Reranking earns its latency on this collection: 0:tests")
    assert "at depth 5 (long documents excerpt, no first-stage blend)" in verdict["sentence"]
    assert "Does reranking earn its latency?" in done.stdout and verdict["sentence"] in done.stdout
    for name in ("quality_vs_depth.png", "quality_vs_latency.png", "per_query_ndcg10.png", "depth_by_kept.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_member_that_cannot_start_is_reported_not_fatal(tiny_collection, tmp_path):
    chain = {
        "RERANKQ_RERANKER_PROVIDER": "local",
        "RERANKQ_RERANKER_MODEL": "/nonexistent/model",
        "RERANKQ_RERANKER_1_PROVIDER": "rrf",
    }
    done = run_harness(tiny_collection, ["--depths=5", "--json", "-"], chain)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    local, rrf = report["members"]
    assert local["status"] == "unavailable" and "0:local" in local["reason"]
    assert rrf["status"] == "served"


def test_bad_input_exits_2_naming_the_file(tiny_collection):
    tiny_collection["run"].write_text(RUN + "q2 Q0 nowhere 5 1.0 bm25\n")
    done = run_harness(tiny_collection, [], {})
    assert done.returncode == 2
    assert "query q2 ranks document nowhere" in done.stderr


# -- a cascade: rerankq eval --stages ---------------------------------------------------------

CASCADE_CHAIN = {
    "RERANKQ_RERANKER_PROVIDER": "tests.evaluation_providers:KeywordProvider",
    "RERANKQ_RERANKER_1_PROVIDER": "tests.evaluation_providers:ShortestFirstProvider",
}
KEYWORD = "0:tests.evaluation_providers:KeywordProvider"
SHORTEST = "1:tests.evaluation_providers:ShortestFirstProvider"
# By hand, stage 2 (the shortest first) re-reading the keyword member's best 2: q1's d3 d5
# become d5 d3 (40 characters before 51), q2's e1 e4 stay (45 before 48).
AFTER_SHORTEST = {"q1": (2 + 3 / log2(3) + 1 / log2(6)) / IDCG_Q1, "q2": RERANKED["q2"]["nDCG@10"]}
# The shortest first alone: over the top 5, q1 d2 d4 d1 d5 d3 and q2 e3 e2 e1 e4; over the top 2,
# q1 d2 d1 (both grade 0: the input's value) and q2 e2 e1.
SHORTEST_ALONE = {
    5: {"q1": (1 / log2(3) + 2 / log2(5) + 3 / log2(6)) / IDCG_Q1, "q2": (2 / log2(4) + 3 / log2(5)) / IDCG_Q2},
    2: {"q1": INPUT["q1"]["nDCG@10"], "q2": (2 / log2(3) + 3 / log2(5)) / IDCG_Q2},
}


def mean_of(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


@pytest.mark.parametrize(
    ("stages", "extra", "says"),
    [
        ("0:5", [], "between 2 and 4 stages"),
        ("0:5,1:x", [], "'1:x' is not member:keep"),
        ("0:5,one:2", [], "'one:2' is not member:keep"),
        ("0:2,1:5", [], "stage 2 keeps 5, more than stage 1 (2)"),
        ("0:5,1:0", [], "stage 2 keeps 0"),
        ("0:5,0:2", [], "a member named twice"),
        ("0:5,1:2", ["--depths=5"], "not with --depths"),
        ("0:5,1:2", ["--members=0"], "not with --members"),
        ("0:5,7:2", [], "the chain has members 0..1"),
    ],
)
def test_a_stages_option_that_cannot_run_is_refused_naming_the_flag(tiny_collection, stages, extra, says):
    done = run_harness(tiny_collection, [f"--stages={stages}", *extra], CASCADE_CHAIN)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--stages" in done.stderr and says in done.stderr, done.stderr
    assert done.stdout == ""  # refused before any query was run


def test_a_cascade_reports_each_stage_and_its_members_alone_through_a_real_worker(tiny_collection, tmp_path):
    done = run_harness(tiny_collection, ["--stages=0:5,1:2", "--json", str(tmp_path / "eval.json")], CASCADE_CHAIN)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    cascade = report["cascade"]
    assert cascade["stages"] == "0:5,1:2" and cascade["depth"] == 5 and cascade["queries"] == 2
    first, second = cascade["after_stage"]
    assert (first["member"], first["keep"], second["member"], second["keep"]) == (KEYWORD, 5, SHORTEST, 2)

    # The ranking after each stage, and the cascade's pages, as worked out by hand.
    for qid in ("q1", "q2"):
        assert first["per_query"]["nDCG@10"][qid] == pytest.approx(RERANKED[qid]["nDCG@10"], abs=1e-9)
        assert second["per_query"]["nDCG@10"][qid] == pytest.approx(AFTER_SHORTEST[qid], abs=1e-9)
        assert cascade["cascade"]["per_query"]["nDCG@10"][qid] == pytest.approx(AFTER_SHORTEST[qid], abs=1e-9)
    assert second["ndcg10_vs_previous"] == {"better": 0, "same": 1, "worse": 1}
    assert first["served_by"] == [KEYWORD] and second["served_by"] == [SHORTEST]
    assert first["fell_back"] == second["fell_back"] == 0

    # Each pair scored once per stage: a window a query for each stage, one provider call each
    # (the first stage reads q1's 5 and q2's 4).
    assert (first["windows"], first["read_per_query"], first["provider_calls"]) == (2, 4.5, 2)
    assert (second["windows"], second["read_per_query"], second["provider_calls"]) == (2, 2, 2)
    assert cascade["cascade"]["provider_calls"] == 4

    # Latency: the total per query, and each stage's own scoring from its windows.
    total, scoring = cascade["cascade"]["latency"]["total_ms"], cascade["cascade"]["latency"]["scoring_ms"]
    assert 0 < scoring["p50"] <= total["p50"] <= total["p95"]
    assert first["scoring_ms"]["p50"] > 0 and second["scoring_ms"]["p50"] > 0

    # Beside it, each member alone at the cascade's depth and at its own keep.
    alone = {(a["member"], a["depth"]): a for a in cascade["alone"]}
    assert set(alone) == {(KEYWORD, 5), (SHORTEST, 5), (SHORTEST, 2)}
    assert alone[(KEYWORD, 5)]["mean"]["nDCG@10"] == pytest.approx(
        mean_of({q: RERANKED[q]["nDCG@10"] for q in ("q1", "q2")}), abs=1e-9
    )
    for depth, expected in SHORTEST_ALONE.items():
        assert alone[(SHORTEST, depth)]["mean"]["nDCG@10"] == pytest.approx(mean_of(expected), abs=1e-9)
        assert alone[(SHORTEST, depth)]["provider_calls_per_query"] == 1.0
    assert report["depths"] == [2, 5]  # the members' own tables, at the stages' keeps

    assert cascade["sentence"].startswith(f"Stage 2 ({SHORTEST} over the best 2) takes nDCG@10 from 0.904 to 0.869")
    assert "it does not earn its cost" in cascade["sentence"]
    assert "Cascade 0:5,1:2 (2 queries)" in done.stdout and cascade["sentence"] in done.stdout
    assert f"after stage 2: {SHORTEST}" in done.stdout and f"alone: {SHORTEST}" in done.stdout


@pytest.mark.slow
def test_a_cascade_whose_second_member_cannot_start_keeps_the_first_stages_order(tiny_collection, tmp_path):
    chain = {
        "RERANKQ_RERANKER_PROVIDER": "tests.evaluation_providers:KeywordProvider",
        "RERANKQ_RERANKER_1_PROVIDER": "local",
        "RERANKQ_RERANKER_1_MODEL": "/nonexistent/model",
    }
    done = run_harness(tiny_collection, ["--stages=0:5,1:2", "--json", "-"], chain)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    first, second = report["cascade"]["after_stage"]
    assert second["fell_back"] == 4 and any("1:local" in r for r in second["reasons"]), second["reasons"]
    for qid in ("q1", "q2"):
        assert second["per_query"]["nDCG@10"][qid] == pytest.approx(RERANKED[qid]["nDCG@10"], abs=1e-9)
        assert report["cascade"]["cascade"]["per_query"]["nDCG@10"][qid] == pytest.approx(
            RERANKED[qid]["nDCG@10"], abs=1e-9
        )
    assert [(a["member"], a["depth"]) for a in report["cascade"]["alone"]] == [(KEYWORD, 5)]  # 1:local unavailable
