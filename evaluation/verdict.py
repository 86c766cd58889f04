"""Whether reranking earns its latency: reranking depth x documents kept, the knee, one sentence.

For each member and depth, and each number of documents kept (what a pipeline hands on, to an
LLM's context say): recall and precision at that cutoff (ir-measures' ``R@k`` and ``P@k``, a
document relevant from ``relevant_grade``), the tokens of the documents kept (their whole text,
in the packaged all-MiniLM-L6-v2 tokenizer, the one passages fall back to: a reader's cost),
the p50 latency, and the queries better / same / worse than the input on nDCG@10. The knee is
the smallest depth within ``KNEE_TOLERANCE`` of the member's best nDCG@10. The sentence names
the member with the best nDCG@10 at its knee and says whether that beats the input run by more
than the tolerance, on more queries than it loses.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from evaluation.measures import Scores, at_cutoffs
from evaluation.runner import MemberRun

KEPT = (3, 6, 12)
KNEE_TOLERANCE = 0.01


def token_counter() -> Callable[[str], int]:
    from worker.scoring.passages import fallback_cutter

    offsets = fallback_cutter().offsets
    return lambda text: len(offsets(text))


def kept_tokens(
    rankings: Mapping[str, Sequence[str]], texts: Mapping[str, str], count: Callable[[str], int], k: int
) -> float:
    """The mean, over queries, of the tokens of the top ``k`` documents' texts."""
    return statistics.fmean(sum(count(texts[d]) for d in ranking[:k]) for ranking in rankings.values())


def knee(ndcg_by_depth: Mapping[int, float]) -> int:
    best = max(ndcg_by_depth.values())
    return min(d for d, v in ndcg_by_depth.items() if v >= best - KNEE_TOLERANCE)


def judge(
    *,
    runs: Mapping[tuple[str, int], MemberRun],
    scores: Mapping[tuple[str, int], Scores],
    input_scores: Scores,
    qrels: Mapping[str, Mapping[str, int]],
    texts: Mapping[str, str],
    labels: Sequence[str],
    depths: Sequence[int],
    relevant_grade: int,
    policy: Mapping[str, str],
) -> dict[str, Any]:
    """The table's rows, each member's knee, and the sentence. ``policy``: what the streams were
    opened with (long documents, blend), named in the sentence."""
    count = token_counter()
    cache: dict[str, int] = {}

    def cached(text: str) -> int:
        if text not in cache:
            cache[text] = count(text)
        return cache[text]

    rows, knees = [], {}
    input_ndcg = input_scores.per_query["nDCG@10"]
    for label in labels:
        by_depth = {d: scores[(label, d)].mean["nDCG@10"] for d in depths if (label, d) in scores}
        if not by_depth:
            continue
        knees[label] = knee(by_depth)
        for depth in by_depth:
            run = runs[(label, depth)]
            rankings = {q.qid: q.ranking for q in run.queries}
            cut = at_cutoffs(qrels, rankings, KEPT, relevant_grade=relevant_grade)
            mine = scores[(label, depth)].per_query["nDCG@10"]
            totals = [q.total_ms for q in run.queries]
            rows.append(
                {
                    "member": label,
                    "depth": depth,
                    "ndcg10": by_depth[depth],
                    "kept": {
                        str(k): {
                            "recall": cut[f"R@{k}"],
                            "precision": cut[f"P@{k}"],
                            "tokens": kept_tokens(rankings, texts, cached, k),
                        }
                        for k in KEPT
                    },
                    "latency_p50_ms": statistics.median(totals) if totals else None,
                    "vs_input": {
                        "better": sum(mine[q] > input_ndcg[q] + 1e-9 for q in mine),
                        "same": sum(abs(mine[q] - input_ndcg[q]) <= 1e-9 for q in mine),
                        "worse": sum(mine[q] < input_ndcg[q] - 1e-9 for q in mine),
                    },
                }
            )
    return {
        "kept": list(KEPT),
        "knee_tolerance": KNEE_TOLERANCE,
        "rows": rows,
        "knees": knees,
        "sentence": sentence(rows, knees, input_scores.mean["nDCG@10"], policy),
    }


def sentence(
    rows: Sequence[Mapping[str, Any]], knees: Mapping[str, int], input_ndcg: float, policy: Mapping[str, str]
) -> str:
    at_knee = [r for r in rows if knees.get(r["member"]) == r["depth"]]
    if not at_knee:
        return "No member served: nothing to judge."
    best = max(at_knee, key=lambda r: (r["ndcg10"], -r["depth"]))
    gain = best["ndcg10"] - input_ndcg
    versus = best["vs_input"]
    how = f"long documents {policy.get('long_documents', 'excerpt')}, {policy.get('blend', 'no first-stage blend')}"
    latency = best["latency_p50_ms"]
    cost = f"{latency:.0f} ms per query (p50)" if latency is not None else "an unmeasured latency"
    figures = (
        f"{best['member']} at depth {best['depth']} ({how}): nDCG@10 {best['ndcg10']:.3f} against the input's "
        f"{input_ndcg:.3f} ({gain:+.3f}; {versus['better']} queries better, {versus['same']} the same, "
        f"{versus['worse']} worse), for {cost}"
    )
    if gain > KNEE_TOLERANCE and versus["better"] > versus["worse"]:
        return f"Reranking earns its latency on this collection: {figures}."
    return (
        f"Reranking does not earn its latency on this collection: the best is {figures}; keep the input "
        "order, or fit a first-stage weight (rerankq calibrate) so the fleet never ranks worse than it."
    )
