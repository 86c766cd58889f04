"""The first stage blended in, measured where it was not fitted: on each collection the queries
are cut in two halves; the calibration map and the first-stage weight are fitted on one half by
the code ``rerankq calibrate`` runs (``evaluation.calibration.fit_map``,
``evaluation.blend_fit``), and nDCG@10 measured on the other half, then the halves swap.

The member is the packaged bi-encoder, scored in this process as ``ops.bench.passage_quality``
scores it: on the long collection each document's best passage as the worker cuts it
(``passage_cut="structure"``), on the shipped (short) collection each document whole. Rows per
held-out half: BM25 (the input), the member alone, the member blended at the weight fitted on
the other half. The first stage is read several ways, side by side (``READINGS``): by the
candidate's place alone (no fusion score sent), by its fusion score as the worker reads it
(BM25's, as the evaluation's streams send it; ``worker.scoring.blend``), and by other readings
of the same scores.

    python -m ops.bench.blend_quality --json /tmp/blend_quality.json
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ops.bench.common import ROOT, print_table, write_json
from ops.bench.passage_quality import (
    DEPTH,
    WORKER_AGGREGATES,
    BestScores,
    Encoder,
    document_scores,
    load,
    load_encoder,
    splitter,
)
from worker.scoring.blend import LAST_PLACE

Reading = Callable[[Sequence[float | None]], list[float]]
COLLECTIONS = {"long": ROOT / "worker" / "collection" / "long", "short": ROOT / "worker" / "collection"}


def query_runs(collection: Any, scores: BestScores, qids: list[str]) -> list[Any]:
    """The member's rows as ``rerankq calibrate`` reads them from a window's decisions."""
    from evaluation.runner import QueryRun, ScoredPair

    runs = []
    for qid in qids:
        judged = collection.qrels.get(qid, {})
        scored = [
            ScoredPair(docid=d, score=s, raw=s, calibrated=False, grade=judged.get(d), first_stage_rank=rank)
            for rank, (d, s) in enumerate(scores[qid].items())
        ]
        runs.append(
            QueryRun(qid=qid, ranking=[], total_ms=0, queue_ms=None, scoring_ms=None, served_by="m", scored=scored)
        )
    return runs


def _min_max(stream: Sequence[float | None]) -> list[float]:
    values = [float(v or 0.0) for v in stream]
    low, high = min(values), max(values)
    return [LAST_PLACE + (1 - LAST_PLACE) * (v - low) / ((high - low) or 1.0) for v in values]


def _over_max(stream: Sequence[float | None]) -> list[float]:
    values = [float(v or 0.0) for v in stream]
    return [v / (max(values) or 1.0) for v in values]


def _z_logistic(stream: Sequence[float | None]) -> list[float]:
    values = [float(v or 0.0) for v in stream]
    mean = statistics.fmean(values)
    sd = statistics.pstdev(values) or 1.0
    return [1 / (1 + math.exp(-(v - mean) / sd)) for v in values]


#: How the first stage is read, side by side: (name, the streams carry BM25's scores, the
#: reading; None: the worker's). ``place``: the candidates sent without fusion scores; the
#: shipped one: ``worker.scoring.blend``; the rest: other readings of the same scores, measured
#: the same way.
READINGS: tuple[tuple[str, bool, Reading | None], ...] = (
    ("place (no fusion score)", False, None),
    ("fusion score, min-max", True, _min_max),
    ("fusion score / its max", True, _over_max),
    ("fusion score, logistic of z", True, _z_logistic),
    ("fusion score, shipped", True, None),
)


def streams(collection: Any, with_scores: bool) -> dict[str, list[float | None]]:
    """Each query's stream as a worker sees it: its candidates' fusion scores, in order."""
    return {qid: [r.score if with_scores else None for r in ranked[:DEPTH]] for qid, ranked in collection.run.items()}


def held_out(
    collection: Any, scores: BestScores, train: list[str], test: list[str], reading: tuple[str, bool, Reading | None]
) -> dict[str, Any]:
    from evaluation.blend_fit import fit_weight, per_query_ndcg, ranking, worker_reading
    from evaluation.calibration import fit_map, judged_pairs
    from evaluation.measures import evaluate
    from worker.scoring.calibration import interpolate

    fitted = fit_map(
        judged_pairs(query_runs(collection, scores, train), relevant_grade=1, unjudged="irrelevant"), label="m"
    )

    def calibrate(score: float) -> float:
        return interpolate(fitted.scores, fitted.probabilities, score)

    _, with_scores, read = reading
    read = read or worker_reading
    sent = streams(collection, with_scores)
    table = per_query_ndcg(
        query_runs(collection, scores, train),
        collection.qrels,
        streams=sent,
        calibrate=calibrate,
        relevant_grade=1,
        read=read,
    )
    weight, fit = fit_weight(table)
    tests = query_runs(collection, scores, test)

    def measured(w: float) -> float:
        rankings = {q.qid: ranking(q, w, sent[q.qid], calibrate, read) for q in tests}
        return evaluate(collection.qrels, rankings).mean["nDCG@10"]

    bm25 = evaluate(collection.qrels, {q: [r.docid for r in collection.run[q][:DEPTH]] for q in test}).mean["nDCG@10"]
    return {"weight": weight, "bm25": bm25, "member": measured(0.0), "blend": measured(weight), "fit": fit}


def measure(name: str, encoder: Encoder, aggregate: str) -> list[dict[str, Any]]:
    collection = load(COLLECTIONS[name])
    cut = splitter(collection, encoder, "structure", 1.0, False)
    scores, _ = document_scores(collection, encoder, cut, aggregate)
    encoder.save()
    qids = sorted(collection.evaluated)
    halves = (qids[0::2], qids[1::2])
    rows = []
    for reading in READINGS:
        for k, (train, test) in enumerate((halves, halves[::-1])):
            result = held_out(collection, scores, train, test, reading)
            held = f"half {k + 1} ({len(test)} queries)"
            rows.append(
                {"collection": name, "aggregate": aggregate, "first stage": reading[0], "held out": held, **result}
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.blend_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--collections", nargs="+", choices=sorted(COLLECTIONS), default=["long", "short"])
    parser.add_argument(
        "--aggregates",
        nargs="+",
        choices=WORKER_AGGREGATES,
        default=["max"],
        help="passage_aggregate of the member's rows (the stream default: max)",
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_grad_enabled(False)
    encoder = load_encoder()
    rows = [row for how in args.aggregates for name in args.collections for row in measure(name, encoder, how)]
    header = [
        "collection",
        "aggregate",
        "first stage",
        "held out",
        "bm25",
        "member",
        "blend",
        "weight",
        "blend - bm25",
        "blend - member",
    ]
    table = [
        [
            r["collection"],
            r["aggregate"],
            r["first stage"],
            r["held out"],
            r["bm25"],
            r["member"],
            r["blend"],
            r["weight"],
            f"{r['blend'] - r['bm25']:+.3f}",
            f"{r['blend'] - r['member']:+.3f}",
        ]
        for r in rows
    ]
    print_table(f"nDCG@10 on held-out queries, BM25 top {DEPTH}, weight fitted on the other half", header, table)
    write_json(args.json, {"rows": [{k: v for k, v in r.items() if k != "fit"} for r in rows]})


if __name__ == "__main__":
    main()
