"""The first-stage weight of a member, fitted on judgements by cross-validation over queries.

For each weight on a grid from 0 (the member alone) to 1 (the first stage alone), every query's
reranked documents are ordered by the blend the worker applies (``worker.scoring.blend``: the
member's calibrated score and the first stage's score of the document: its fusion score where
the stream's candidates carry one, else its place) and its nDCG@10 measured by ir-measures. The
queries are dealt into folds; each fold's weight is the one with the best mean on the other
folds, and what it scores on its own fold is held out. The fitted weight is the best on all
queries, unless the blend, held out, does not beat the first stage held out: then it is 1.0,
all first stage, and the fit says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from evaluation.measures import evaluate
from evaluation.runner import QueryRun
from worker.scoring.blend import blended, first_stage_scores
from worker.scoring.calibration import BlendFit

#: Weights tried: 0, 0.05, ..., 1.
GRID = tuple(round(i / 20, 2) for i in range(21))
FOLDS = 5
MEASURE = "nDCG@10"

#: A query's stream as the worker saw it: each candidate's fusion score in fusion order (None
#: where it had none). The evaluation opens a query as one window, so the first stage's scores
#: are the worker's over that one window.
Stream = Sequence[float | None]


#: How a stream's first stage is read as scores: the worker's way by default (a benchmark
#: compares others).
Reading = Callable[[Stream], list[float]]


def worker_reading(stream: Stream) -> list[float]:
    return first_stage_scores(stream, indexes=range(len(stream)), n_candidates=len(stream))


def ranking(
    query: QueryRun,
    weight: float,
    stream: Stream,
    calibrate: Callable[[float], float],
    read: Reading = worker_reading,
) -> list[str]:
    """The query's reranked documents in the blend's order (ties in first-stage order)."""
    first_stage = read(stream)
    keyed = [
        (
            blended(calibrate(p.raw), first_stage[p.first_stage_rank], weight),
            p.first_stage_rank,
            p.docid,
        )
        for p in query.scored
    ]
    return [docid for *_, docid in sorted(keyed, key=lambda k: (-k[0], k[1]))]


def per_query_ndcg(
    queries: Sequence[QueryRun],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    streams: Mapping[str, Stream],
    calibrate: Callable[[float], float],
    relevant_grade: int,
    read: Reading = worker_reading,
) -> dict[float, dict[str, float]]:
    """nDCG@10 of every query at every weight of the grid; ``streams``: each query's stream
    (its candidates' fusion scores, in order), which the first stage's scores are read from."""
    scored = [q for q in queries if q.scored]
    out = {}
    for weight in GRID:
        rankings = {q.qid: ranking(q, weight, streams[q.qid], calibrate, read) for q in scored}
        out[weight] = evaluate(qrels, rankings, relevant_grade=relevant_grade).per_query[MEASURE]
    return out


def _best(table: Mapping[float, Mapping[str, float]], qids: Sequence[str]) -> float:
    # Ties go to the smaller weight: the member is what the user asked to be ranked by.
    return max(GRID, key=lambda w: (round(sum(table[w][q] for q in qids) / len(qids), 9), -w))


def fit_weight(table: Mapping[float, Mapping[str, float]], *, folds: int = FOLDS) -> tuple[float, BlendFit]:
    qids = sorted(table[GRID[0]])
    if len(qids) < 2:
        raise ValueError(f"a first-stage weight needs at least two judged queries, got {len(qids)}")
    folds = min(folds, len(qids))
    held_out: dict[str, dict[str, float]] = {"member": {}, "first_stage": {}, "blend": {}}
    for k in range(folds):
        test = qids[k::folds]
        train = [q for q in qids if q not in set(test)]
        chosen = _best(table, train)
        for q in test:
            held_out["blend"][q] = table[chosen][q]
            held_out["member"][q] = table[0.0][q]
            held_out["first_stage"][q] = table[1.0][q]
    means = {name: sum(values.values()) / len(values) for name, values in held_out.items()}
    weight = _best(table, qids)
    if means["blend"] < means["first_stage"]:
        weight = 1.0
    fit = BlendFit(
        folds=folds,
        queries=len(qids),
        member=round(means["member"], 4),
        first_stage=round(means["first_stage"], 4),
        blend=round(means["blend"], 4),
    )
    return weight, fit


def verdict(label: str, weight: float, fit: BlendFit) -> str:
    """One line a person reads: what the weight says about this member on this collection."""
    figures = (
        f"held out over {fit.queries} queries in {fit.folds} folds, nDCG@10: member {fit.member:.3f}, "
        f"first stage {fit.first_stage:.3f}, blend {fit.blend:.3f}"
    )
    if weight >= 1.0:
        return (
            f"{label}: first_stage_weight 1.0, all first stage: the member does not beat the first stage on "
            f"held-out queries ({figures}); reranking with it does not earn its latency here"
        )
    return f"{label}: first_stage_weight {weight:g} ({figures})"
