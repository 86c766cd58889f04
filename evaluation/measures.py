"""The measures, computed by ir-measures (trec_eval's code, through pytrec-eval-terrier).

ir-measures was chosen over ranx: both give trec_eval's definitions, but ranx brings numba,
pandas, ir-datasets and seaborn and compiles its measures at first use, where ir-measures
needs only the pytrec_eval binding (a wheel) and names measures the way papers do
(``nDCG@10``, ``P@5``, ``R@20``, ``RR@10``).

Definitions (trec_eval's): nDCG@k with the grade as the gain and a log2(rank + 1)
discount; P@k, R@k and RR@k (MRR when averaged) count a document relevant when its grade is
at least ``relevant_grade`` (1, the TREC default); an unjudged document is not relevant. A
ranking is handed over as scores ``n - rank``, so trec_eval's own ordering (score, then
document id) is the ranking's and ties never reorder it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CUTOFFS = (1, 5, 10, 20)
#: The measures reported, by name, in the order tables show them.
NAMES = ("nDCG@10", *(f"P@{k}" for k in CUTOFFS), *(f"R@{k}" for k in CUTOFFS), "MRR@10")


def _measures(relevant_grade: int) -> dict[str, Any]:
    from ir_measures import RR, P, R, nDCG

    out: dict[str, Any] = {"nDCG@10": nDCG @ 10}
    for k in CUTOFFS:
        out[f"P@{k}"] = P(rel=relevant_grade) @ k
        out[f"R@{k}"] = R(rel=relevant_grade) @ k
    out["MRR@10"] = RR(rel=relevant_grade) @ 10
    return out


@dataclass(frozen=True)
class Scores:
    """Each measure's mean over the queries, and its value per query."""

    mean: dict[str, float]
    per_query: dict[str, dict[str, float]]  # measure -> qid -> value


def evaluate(
    qrels: Mapping[str, Mapping[str, int]], rankings: Mapping[str, Sequence[str]], *, relevant_grade: int = 1
) -> Scores:
    """Every measure for these rankings (qid -> document ids, best first), over their queries.

    Every ranked query must be judged and rank something: trec_eval leaves a query with an
    empty ranking out of its means instead of counting it as 0.
    """
    import ir_measures

    unjudged = [qid for qid in rankings if qid not in qrels]
    if unjudged:
        raise ValueError(f"rankings for queries without judgements: {unjudged[:5]}")
    empty = [qid for qid, docs in rankings.items() if not docs]
    if empty:
        raise ValueError(f"empty rankings: {empty[:5]}")
    measures = _measures(relevant_grade)
    by_measure = {m: name for name, m in measures.items()}
    run = {qid: {docid: float(len(docs) - i) for i, docid in enumerate(docs)} for qid, docs in rankings.items()}
    judged = {qid: dict(qrels[qid]) for qid in rankings}
    per_query: dict[str, dict[str, float]] = {name: {} for name in measures}
    for metric in ir_measures.iter_calc(list(measures.values()), judged, run):
        per_query[by_measure[metric.measure]][metric.query_id] = float(metric.value)
    aggregate = ir_measures.calc_aggregate(list(measures.values()), judged, run)
    return Scores(mean={name: float(aggregate[m]) for name, m in measures.items()}, per_query=per_query)


def at_cutoffs(
    qrels: Mapping[str, Mapping[str, int]],
    rankings: Mapping[str, Sequence[str]],
    cutoffs: Sequence[int],
    *,
    relevant_grade: int = 1,
) -> dict[str, float]:
    """``P@k`` and ``R@k`` for each of ``cutoffs``, means over the rankings' queries."""
    import ir_measures
    from ir_measures import P, R

    measures = {f"{name}@{k}": m(rel=relevant_grade) @ k for k in cutoffs for name, m in (("P", P), ("R", R))}
    by_measure = {m: name for name, m in measures.items()}
    run = {qid: {docid: float(len(docs) - i) for i, docid in enumerate(docs)} for qid, docs in rankings.items()}
    judged = {qid: dict(qrels[qid]) for qid in rankings}
    aggregate = ir_measures.calc_aggregate(list(measures.values()), judged, run)
    return {by_measure[m]: float(v) for m, v in aggregate.items()}
