"""The evaluation's report: one dict (what ``--json`` writes), and the tables printed from it."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from evaluation.measures import NAMES, Scores
from evaluation.runner import MemberRun, latency
from producer.budget import required_depth

#: The cutoff the depth sweep relates to the over-fetch rule (keep 10 from max(25, 4 * 10)).
KEEP = 10


def distribution(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"min": ordered[0], "p25": quartiles[0], "median": quartiles[1], "p75": quartiles[2], "max": ordered[-1]}


def against(baseline: Mapping[str, float], values: Mapping[str, float]) -> dict[str, int]:
    """Per query: better, the same, or worse than the baseline (to 1e-9)."""
    better = sum(1 for q, v in values.items() if v > baseline[q] + 1e-9)
    worse = sum(1 for q, v in values.items() if v < baseline[q] - 1e-9)
    return {"better": better, "same": len(values) - better - worse, "worse": worse}


def scored(scores: Scores, baseline: Scores | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mean": scores.mean,
        "per_query": scores.per_query,
        "ndcg10_distribution": distribution(list(scores.per_query["nDCG@10"].values())),
    }
    if baseline is not None:
        out["ndcg10_vs_input_run"] = against(baseline.per_query["nDCG@10"], scores.per_query["nDCG@10"])
    return out


def calibration_of(run: MemberRun, relevant_grade: int) -> dict[str, Any] | None:
    """ECE (10 bins) and the reliability points of the member's own scores and, where its rows
    were calibrated, of the calibrated ones; an unjudged document is not relevant (trec_eval's rule)."""
    from evaluation.reliability import summary

    pairs = [p for q in run.queries for p in q.scored]
    if not pairs:
        return None  # a passthrough member: its seeded scores are fusion ranks, not relevance
    relevant = [p.grade is not None and p.grade >= relevant_grade for p in pairs]
    calibrated = all(p.calibrated for p in pairs)
    return {
        "pairs": len(pairs),
        "positives": sum(relevant),
        "calibrated": calibrated,
        "partly_calibrated": not calibrated and any(p.calibrated for p in pairs),
        "raw": summary([p.raw for p in pairs], relevant),
        "served": summary([p.score for p in pairs], relevant) if calibrated else None,
    }


def build_report(
    *,
    collection: Mapping[str, Any],
    relevant_grade: int,
    depths: Sequence[int],
    input_scores: Scores,
    members: Sequence[Mapping[str, Any]],
    runs: Mapping[tuple[str, int], MemberRun],
    scores: Mapping[tuple[str, int], Scores],
    stack: Mapping[str, Any],
    verdict: Mapping[str, Any] | None = None,
    cascade: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``members``: each member's label and provider, and its reason when it could not serve;
    ``cascade``: the section ``evaluation.cascade_report`` builds, with ``--stages``."""
    report_members = []
    for member in members:
        label = member["label"]
        entry: dict[str, Any] = {"label": label, "provider": member["provider"]}
        if member.get("reason"):
            entry.update(status="unavailable", reason=member["reason"])
        else:
            entry["status"] = "served"
            entry["depths"] = {}
            for depth in depths:
                run = runs[(label, depth)]
                entry["depths"][str(depth)] = {
                    **scored(scores[(label, depth)], input_scores),
                    "latency": latency(run),
                    "provider_calls": run.provider_calls,
                    "provider_calls_per_query": run.provider_calls / len(run.queries) if run.queries else 0.0,
                    "failed_queries": {q.qid: q.failed for q in run.failed},
                    "served_by": sorted({q.served_by for q in run.queries if q.served_by}),
                }
            calibration = calibration_of(runs[(label, max(depths))], relevant_grade)
            if calibration is not None:
                entry["calibration"] = calibration
        report_members.append(entry)
    report: dict[str, Any] = {
        "collection": dict(collection),
        "relevant_grade": relevant_grade,
        "measures": list(NAMES),
        "depths": list(depths),
        "full_depth": max(depths),
        "over_fetch": {"keep": KEEP, "depth": required_depth(KEEP)},
        "input_run": scored(input_scores, None),
        "members": report_members,
        "stack": dict(stack),
        "verdict": dict(verdict or {}),
    }
    if cascade is not None:
        report["cascade"] = dict(cascade)
    return report


# -- the terminal ---------------------------------------------------------------------------


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([title, line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _served(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in report["members"] if m["status"] == "served"]


def render(report: Mapping[str, Any]) -> str:
    full = str(report["full_depth"])
    n_queries = report["collection"]["queries_evaluated"]
    grade = report["relevant_grade"]
    blocks = []

    rows = [["input run", *(f"{report['input_run']['mean'][m]:.3f}" for m in NAMES), _spread(report["input_run"]), ""]]
    for member in report["members"]:
        if member["status"] != "served":
            rows.append([member["label"], *(["-"] * len(NAMES)), "", f"unavailable: {member['reason']}"])
            continue
        at = member["depths"][full]
        versus = at["ndcg10_vs_input_run"]
        rows.append(
            [
                member["label"],
                *(f"{at['mean'][m]:.3f}" for m in NAMES),
                _spread(at),
                f"{versus['better']}/{versus['same']}/{versus['worse']}",
            ]
        )
    blocks.append(
        table(
            f"Reranking the top {full} of the input run ({n_queries} queries; P, R and MRR count grade >= {grade} "
            "as relevant)",
            ["", *NAMES, "nDCG@10 per query min/med/max", "vs input +/=/-"],
            rows,
        )
    )

    depths = [str(d) for d in report["depths"]]
    sweep = [["input run", *([f"{report['input_run']['mean']['nDCG@10']:.3f}"] * len(depths))]]
    for member in _served(report):
        sweep.append([member["label"], *(f"{member['depths'][d]['mean']['nDCG@10']:.3f}" for d in depths)])
    over = report["over_fetch"]
    blocks.append(
        table(
            f"Depth sweep: nDCG@10 when reranking the top d of the input run (the over-fetch rule reranks "
            f"max(25, 4k) = {over['depth']} to keep k = {over['keep']})",
            ["", *(f"d={d}" for d in depths)],
            sweep,
        )
    )

    timing = []
    for member in _served(report):
        for d in depths:
            at = member["depths"][d]
            lat = at["latency"]
            timing.append(
                [
                    member["label"],
                    d,
                    *(_ms(lat[part], p) for part in ("total_ms", "queue_ms", "scoring_ms") for p in ("p50", "p95")),
                    f"{at['provider_calls_per_query']:.2f}",
                    str(len(at["failed_queries"])),
                ]
            )
    blocks.append(
        table(
            "Latency per query, ms (one query at a time; queue = message sent to the worker starting it, "
            "scoring = worker start to commit)",
            [
                "",
                "depth",
                "total p50",
                "total p95",
                "queue p50",
                "queue p95",
                "scoring p50",
                "scoring p95",
                "calls/query",
                "failed",
            ],
            timing,
        )
    )
    calibrated = [m for m in _served(report) if "calibration" in m]
    if calibrated:
        blocks.append(
            table(
                f"Calibration: ECE (10 bins) of the scores as probabilities of relevance, reranking the top {full} "
                f"(grade >= {grade} relevant, unjudged not)",
                ["", "pairs", "relevant", "ECE raw", "ECE calibrated"],
                [
                    [
                        m["label"],
                        str(m["calibration"]["pairs"]),
                        str(m["calibration"]["positives"]),
                        f"{m['calibration']['raw']['ece']:.3f}",
                        f"{m['calibration']['served']['ece']:.3f}"
                        if m["calibration"]["served"]
                        else ("partly calibrated" if m["calibration"]["partly_calibrated"] else "not calibrated"),
                    ]
                    for m in calibrated
                ],
            )
        )
    if report.get("verdict", {}).get("rows"):
        blocks.append(_verdict(report["verdict"]))
    if "cascade" in report:
        # Imported here: the cascade's section builds on this module's tables.
        from evaluation.cascade_report import render_cascade

        blocks.append(render_cascade(report["cascade"], report["input_run"]))
    stack = report["stack"]
    blocks.append(
        f"{'private redis-server and worker' if stack.get('private') else 'configured Redis and workers'}"
        f"; pair-score cache {'off' if stack.get('pair_cache') is False else 'as configured'}"
        f"; precision {stack.get('precision')}; torch threads {stack.get('torch_threads')}; "
        f"{stack.get('cpu_count')} CPUs, load average {stack.get('load_average_1m_at_start')} at the start "
        f"and {stack.get('load_average_1m')} at the end (latency is this machine's, as busy as that)"
    )
    return "\n\n".join(blocks)


def _verdict(verdict: Mapping[str, Any]) -> str:
    kept = [str(k) for k in verdict["kept"]]
    header = [
        "",
        "depth",
        "nDCG@10",
        *(f"{name}@{k}" for k in kept for name in ("R", "P", "tokens")),
        "p50 ms",
        "vs input +/=/-",
    ]
    rows = []
    for row in verdict["rows"]:
        knee = verdict["knees"].get(row["member"]) == row["depth"]
        at = row["kept"]
        versus = row["vs_input"]
        rows.append(
            [
                row["member"],
                f"{row['depth']}{' (knee)' if knee else ''}",
                f"{row['ndcg10']:.3f}",
                *(
                    v
                    for k in kept
                    for v in (f"{at[k]['recall']:.3f}", f"{at[k]['precision']:.3f}", f"{at[k]['tokens']:.0f}")
                ),
                "-" if row["latency_p50_ms"] is None else f"{row['latency_p50_ms']:.0f}",
                f"{versus['better']}/{versus['same']}/{versus['worse']}",
            ]
        )
    title = (
        "Does reranking earn its latency? Reranking depth x documents kept (recall, precision, tokens of the kept "
        f"documents); the knee is the smallest depth within {verdict['knee_tolerance']} of the member's best nDCG@10"
    )
    return table(title, header, rows) + "\n\n" + str(verdict["sentence"])


def _spread(entry: Mapping[str, Any]) -> str:
    d = entry["ndcg10_distribution"]
    return f"{d['min']:.2f}/{d['median']:.2f}/{d['max']:.2f}" if d else "-"


def _ms(values: Mapping[str, float], key: str) -> str:
    return f"{values[key]:.1f}" if key in values else "-"
