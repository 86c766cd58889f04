"""The first-stage weight ``rerankq calibrate`` fits: recovered on synthetic collections where
the first stage and the member each carry a known part of the signal, and 1.0 (all first
stage) where the member carries none."""

from __future__ import annotations

import random

import pytest

from evaluation.blend_fit import fit_weight, per_query_ndcg, verdict
from evaluation.runner import QueryRun, ScoredPair
from worker.scoring.blend import blended, first_stage_score

DOCS = 40


def synthetic(
    true_weight: float, *, queries: int = 60, seed: int = 7
) -> tuple[list[QueryRun], dict[str, dict[str, int]]]:
    """Queries whose relevant documents are the top 5 of ``(1 - w) * member + w * first stage``
    for ``w = true_weight``: the member's scores are random, the first stage's order is random,
    and relevance is exactly their blend at that weight."""
    rng = random.Random(seed)
    runs, qrels = [], {}
    for q in range(queries):
        qid = f"q{q}"
        member = [rng.random() for _ in range(DOCS)]
        truth = [blended(member[i], first_stage_score(i, DOCS), true_weight) for i in range(DOCS)]
        relevant = sorted(range(DOCS), key=lambda i: -truth[i])[:5]
        qrels[qid] = {f"{qid}d{i}": (2 if i in relevant else 0) for i in range(DOCS)}
        scored = [
            ScoredPair(
                docid=f"{qid}d{i}", score=member[i], raw=member[i], calibrated=False, grade=None, first_stage_rank=i
            )
            for i in range(DOCS)
        ]
        runs.append(
            QueryRun(qid=qid, ranking=[], total_ms=0, queue_ms=None, scoring_ms=None, served_by="m", scored=scored)
        )
    return runs, qrels


def fitted(true_weight: float) -> tuple[float, object]:
    runs, qrels = synthetic(true_weight)
    table = per_query_ndcg(
        runs, qrels, n_candidates={r.qid: DOCS for r in runs}, calibrate=lambda s: s, relevant_grade=1
    )
    return fit_weight(table)


@pytest.mark.parametrize("true_weight", [0.0, 0.3, 0.5])
def test_the_weight_is_recovered_where_both_carry_known_signal(true_weight: float) -> None:
    weight, fit = fitted(true_weight)
    assert weight == pytest.approx(true_weight, abs=0.1)
    # Held out, the blend beats each side alone wherever both carry signal.
    assert fit.blend >= max(fit.member, fit.first_stage) - 1e-9
    if true_weight:
        assert fit.blend > fit.member


def test_a_member_with_no_signal_gets_all_first_stage_and_the_verdict_says_so() -> None:
    weight, fit = fitted(1.0)
    assert weight == 1.0 and fit.first_stage == pytest.approx(1.0)
    said = verdict("0:local", weight, fit)
    assert "all first stage" in said and "does not earn its latency" in said


def test_one_query_is_too_few_to_fit_on() -> None:
    runs, qrels = synthetic(0.3, queries=1)
    table = per_query_ndcg(runs, qrels, n_candidates={"q0": DOCS}, calibrate=lambda s: s, relevant_grade=1)
    with pytest.raises(ValueError, match="at least two judged queries"):
        fit_weight(table)
