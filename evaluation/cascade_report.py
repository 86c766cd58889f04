"""The report's cascade section (``rerankq eval --stages``): the ranking after each stage, the
cascade's page, and each member alone at the cascade's depth and at its own keep, with what
each cost; the table printed from it and one sentence per later stage on whether it earns its
cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evaluation.cascade import CascadeRun, stage_latency
from evaluation.measures import Scores
from evaluation.report import against, scored, table
from evaluation.runner import MemberRun, latency, percentiles
from evaluation.verdict import KNEE_TOLERANCE


def _versus(baseline: Scores, scores: Scores) -> dict[str, int]:
    return against(baseline.per_query["nDCG@10"], scores.per_query["nDCG@10"])


def cascade_section(
    *,
    run: CascadeRun,
    stage_scores: Sequence[Scores],
    cascade_scores: Scores,
    input_scores: Scores,
    alone: Sequence[tuple[str, int, MemberRun, Scores]],
) -> dict[str, Any]:
    """``stage_scores``: the ranking after each stage, first to last; ``alone``: (member label,
    depth, its run, its scores) for each member of the cascade alone at the depths measured."""
    n = len(run.queries)
    total_ms, scoring_ms = stage_latency(run)
    after = []
    previous = input_scores
    for k, (plan, scores) in enumerate(zip(run.plan, stage_scores)):
        outcomes = [q.stages[k] for q in run.queries]
        after.append(
            {
                "stage": k + 1,
                "member": plan.label,
                "keep": plan.keep,
                **scored(scores, input_scores),
                "ndcg10_vs_previous": _versus(previous, scores),
                "scoring_ms": scoring_ms[k],
                "provider_calls": run.provider_calls[k],
                "provider_calls_per_query": run.provider_calls[k] / n if n else 0.0,
                "windows": sum(o.windows for o in outcomes),
                "read_per_query": sum(o.read for o in outcomes) / n if n else 0.0,
                "fell_back": sum(o.fell_back for o in outcomes),
                "reasons": sorted({r for o in outcomes for r in o.reasons}),
                "served_by": sorted({s for o in outcomes for s in o.served_by}),
            }
        )
        previous = scores
    total_calls = sum(run.provider_calls)
    page = {
        **scored(cascade_scores, input_scores),
        "latency": {
            "total_ms": total_ms,
            "scoring_ms": percentiles(
                [sum(s.scoring_ms or 0.0 for s in q.stages) for q in run.queries if q.stages[0].scoring_ms is not None]
            ),
        },
        "provider_calls": total_calls,
        "provider_calls_per_query": total_calls / n if n else 0.0,
    }
    members_alone = [
        {
            "member": label,
            "depth": depth,
            "mean": scores.mean,
            "ndcg10_vs_input_run": _versus(input_scores, scores),
            "latency": latency(member_run),
            "provider_calls_per_query": member_run.provider_calls / len(member_run.queries)
            if member_run.queries
            else 0.0,
        }
        for label, depth, member_run, scores in alone
    ]
    section = {
        "stages": ",".join(f"{p.member}:{p.keep}" for p in run.plan),
        "depth": run.depth,
        "queries": n,
        "after_stage": after,
        "cascade": page,
        "alone": members_alone,
    }
    section["sentence"] = sentence(section)
    return section


def sentence(section: Mapping[str, Any]) -> str:
    """Per later stage: what it moved nDCG@10 by, for what scoring time and calls, and whether that
    earns its cost (more than the verdict's tolerance, on more queries than it loses); then the
    last member alone at the cascade's depth beside the cascade."""
    stages = section["after_stage"]
    parts = []
    for before, stage in zip(stages, stages[1:]):
        gain = stage["mean"]["nDCG@10"] - before["mean"]["nDCG@10"]
        versus = stage["ndcg10_vs_previous"]
        earns = gain > KNEE_TOLERANCE and versus["better"] > versus["worse"]
        cost = stage["scoring_ms"].get("p50")
        parts.append(
            f"Stage {stage['stage']} ({stage['member']} over the best {stage['keep']}) takes nDCG@10 from "
            f"{before['mean']['nDCG@10']:.3f} to {stage['mean']['nDCG@10']:.3f} ({gain:+.3f}; {versus['better']} "
            f"queries better, {versus['same']} the same, {versus['worse']} worse) for "
            + (f"{_ms(cost)} of scoring per query (p50)" if cost is not None else "an unmeasured scoring time")
            + f" and {stage['provider_calls_per_query']:.2f} provider calls per query: "
            + ("it earns its cost." if earns else "it does not earn its cost.")
        )
    last = stages[-1]["member"]
    deep = [a for a in section["alone"] if a["member"] == last and a["depth"] == section["depth"]]
    if deep:
        alone, page = deep[0], section["cascade"]
        parts.append(
            f"{last} alone over the top {section['depth']}: nDCG@10 {alone['mean']['nDCG@10']:.3f} at "
            f"{_p50(alone['latency']['total_ms'])} per query (p50); the cascade: {page['mean']['nDCG@10']:.3f} at "
            f"{_p50(page['latency']['total_ms'])}."
        )
    return " ".join(parts)


def _p50(values: Mapping[str, float]) -> str:
    return _ms(values["p50"]) if "p50" in values else "an unmeasured latency"


def _ms(value: float) -> str:
    """Whole milliseconds, or tenths under ten (a test provider's window takes one)."""
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def render_cascade(section: Mapping[str, Any], input_run: Mapping[str, Any]) -> str:
    def ms(values: Mapping[str, float], key: str) -> str:
        return f"{values[key]:.1f}" if key in values else "-"

    def plus(versus: Mapping[str, int] | None) -> str:
        return f"{versus['better']}/{versus['same']}/{versus['worse']}" if versus else ""

    rows = [["input run", "", f"{input_run['mean']['nDCG@10']:.3f}", "", "", "-", "-", "-", "-", "", ""]]
    for stage in section["after_stage"]:
        rows.append(
            [
                f"after stage {stage['stage']}: {stage['member']}",
                f"top {stage['keep']}" if stage["stage"] == 1 else f"best {stage['keep']}",
                f"{stage['mean']['nDCG@10']:.3f}",
                plus(stage["ndcg10_vs_input_run"]),
                plus(stage["ndcg10_vs_previous"]),
                "-",
                "-",
                ms(stage["scoring_ms"], "p50"),
                ms(stage["scoring_ms"], "p95"),
                f"{stage['provider_calls_per_query']:.2f}",
                str(stage["fell_back"]),
            ]
        )
    page = section["cascade"]
    rows.append(
        [
            "the cascade (its pages)",
            "",
            f"{page['mean']['nDCG@10']:.3f}",
            plus(page["ndcg10_vs_input_run"]),
            "",
            ms(page["latency"]["total_ms"], "p50"),
            ms(page["latency"]["total_ms"], "p95"),
            ms(page["latency"]["scoring_ms"], "p50"),
            ms(page["latency"]["scoring_ms"], "p95"),
            f"{page['provider_calls_per_query']:.2f}",
            "",
        ]
    )
    for alone in section["alone"]:
        lat = alone["latency"]
        rows.append(
            [
                f"alone: {alone['member']}",
                f"top {alone['depth']}",
                f"{alone['mean']['nDCG@10']:.3f}",
                plus(alone["ndcg10_vs_input_run"]),
                "",
                ms(lat["total_ms"], "p50"),
                ms(lat["total_ms"], "p95"),
                ms(lat["scoring_ms"], "p50"),
                ms(lat["scoring_ms"], "p95"),
                f"{alone['provider_calls_per_query']:.2f}",
                "",
            ]
        )
    title = (
        f"Cascade {section['stages']} ({section['queries']} queries): nDCG@10 of the ranking after each stage (its "
        "rows, then the earlier stages' rest), of the cascade's pages, and of each member alone; latency per query "
        "in ms (scoring: a stage's windows, worker start to commit)"
    )
    header = [
        "",
        "reads",
        "nDCG@10",
        "vs input +/=/-",
        "vs previous +/=/-",
        "total p50",
        "total p95",
        "scoring p50",
        "scoring p95",
        "calls/query",
        "fell back",
    ]
    return table(title, header, rows) + "\n\n" + str(section["sentence"])
