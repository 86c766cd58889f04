"""The first-stage weight ``rerankq calibrate`` fits: recovered on synthetic collections where
the first stage and the member each carry a known part of the signal (by the candidates' place,
and by their fusion scores), and 1.0 (all first stage) where the member carries none."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from evaluation.blend_fit import fit_weight, per_query_ndcg, verdict
from evaluation.runner import QueryRun, ScoredPair
from worker.scoring.blend import blended, first_stage_score, first_stage_scores

DOCS = 40


def places(_: random.Random) -> list[float | None]:
    """A stream sent without fusion scores: the first stage is read by place."""
    return [None] * DOCS


def skewed_scores(rng: random.Random) -> list[float | None]:
    """BM25-like fusion scores, in fusion order: a few strong ones far above a long flat tail,
    so the first stage's scores are nothing like evenly spaced places."""
    return sorted((10.0 * math.exp(-rng.expovariate(1.0) * 3) for _ in range(DOCS)), reverse=True)


def as_documented(stream: Sequence[float | None]) -> list[float]:
    """The first stage's scores as docs/scoring.md says a stream of one window is read, written
    out here so the fit is held to the documented reading, not to whatever the code computes:
    places evenly from 1.0 to 0.1 without fusion scores; with them, the logistic of each
    score's z-score, spread min-max over [0.1, 1.0]."""
    if any(f is None for f in stream):
        return [1.0 - 0.9 * i / (len(stream) - 1) for i in range(len(stream))]
    values = [float(f) for f in stream if f is not None]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    squashed = [1 / (1 + math.exp(-(v - mean) / sd)) for v in values]
    low, high = min(squashed), max(squashed)
    return [0.1 + 0.9 * (v - low) / (high - low) for v in squashed]


def synthetic(
    true_weight: float, *, queries: int = 60, seed: int = 7, fusion=places
) -> tuple[list[QueryRun], dict[str, dict[str, int]], dict[str, Sequence[float | None]]]:
    """Queries whose relevant documents are the top 5 of ``(1 - w) * member + w * first stage``
    for ``w = true_weight``: the member's scores are random, the first stage is each query's
    stream (``fusion``: its candidates' fusion scores, or none: places) as the worker reads it,
    and relevance is exactly their blend at that weight."""
    rng = random.Random(seed)
    runs, qrels, streams = [], {}, {}
    for q in range(queries):
        qid = f"q{q}"
        member = [rng.random() for _ in range(DOCS)]
        streams[qid] = fusion(rng)
        first_stage = as_documented(streams[qid])
        truth = [blended(member[i], first_stage[i], true_weight) for i in range(DOCS)]
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
    return runs, qrels, streams


def fitted(true_weight: float, fusion=places) -> tuple[float, object]:
    runs, qrels, streams = synthetic(true_weight, fusion=fusion)
    table = per_query_ndcg(runs, qrels, streams=streams, calibrate=lambda s: s, relevant_grade=1)
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


@pytest.mark.parametrize("true_weight", [0.2, 0.5])
def test_the_weight_is_recovered_where_the_first_stage_carries_its_signal_in_its_fusion_scores(
    true_weight: float,
) -> None:
    weight, fit = fitted(true_weight, fusion=skewed_scores)
    assert weight == pytest.approx(true_weight, abs=0.05)
    # Relevance is exactly the blend of the member and the fusion scores as documented: held
    # out, the fitted blend finds every relevant document of every query first (read by place,
    # it would miss some: 0.990 at 0.2).
    assert fit.blend == pytest.approx(1.0, abs=1e-9)
    assert fit.blend > max(fit.member, fit.first_stage)


def test_fusion_scores_are_read_only_in_their_lists_order_and_places_stand_in_otherwise() -> None:
    skewed = skewed_scores(random.Random(3))
    read = first_stage_scores(skewed, indexes=range(DOCS), n_candidates=DOCS)
    assert read[0] == pytest.approx(1.0) and read[-1] == pytest.approx(0.1)
    assert read != pytest.approx([first_stage_score(i, DOCS) for i in range(DOCS)])
    # A window of a longer stream keeps its places' range on the stream's scale.
    window = first_stage_scores(skewed[:10], indexes=range(10, 20), n_candidates=100)
    assert window[0] == pytest.approx(first_stage_score(10, 100))
    assert window[-1] == pytest.approx(first_stage_score(19, 100))
    # A later stage of a cascade reads the earlier stage's best, in that stage's order: the
    # fusion scores are read in the stream's order (their indexes), the range from its places.
    shuffled = first_stage_scores([skewed[5], skewed[0], skewed[9]], indexes=[5, 0, 9], n_candidates=100)
    assert shuffled[1] == pytest.approx(first_stage_score(0, 100))
    assert shuffled[2] == pytest.approx(first_stage_score(9, 100))
    assert shuffled[2] < shuffled[0] < shuffled[1]
    by_place = [first_stage_score(i, DOCS) for i in range(DOCS)]
    # Distances (increasing down the list), scores out of their list's order (one arm's), one
    # missing, one not finite, all equal: read by place.
    swapped = [*skewed[:5], skewed[6], skewed[5], *skewed[7:]]
    for unreadable in (skewed[::-1], swapped, [None, *skewed[1:]], [math.nan, *skewed[1:]], [2.0] * DOCS):
        assert first_stage_scores(unreadable, indexes=range(DOCS), n_candidates=DOCS) == pytest.approx(by_place)


def test_one_query_is_too_few_to_fit_on() -> None:
    runs, qrels, streams = synthetic(0.3, queries=1)
    table = per_query_ndcg(runs, qrels, streams=streams, calibrate=lambda s: s, relevant_grade=1)
    with pytest.raises(ValueError, match="at least two judged queries"):
        fit_weight(table)
