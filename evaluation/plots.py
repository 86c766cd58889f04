"""The report as pictures (PNG, matplotlib's headless Agg backend): quality against rerank
depth, quality against latency, and the per-query spread of nDCG@10."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: One colour per served member, in report order; the input run is always grey.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
INPUT_COLOUR = "#555555"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display needed; set before pyplot is imported
    import matplotlib.pyplot as plt

    return plt


def write_plots(report: Mapping[str, Any], directory: Path) -> list[Path]:
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    served = [m for m in report["members"] if m["status"] == "served"]
    depths = report["depths"]
    baseline = report["input_run"]["mean"]["nDCG@10"]
    n_queries = report["collection"]["queries_evaluated"]
    paths = []

    fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=120)
    ax.axhline(baseline, color=INPUT_COLOUR, linestyle="--", label=f"input run ({baseline:.3f})")
    for colour, member in zip(COLOURS, served):
        values = [member["depths"][str(d)]["mean"]["nDCG@10"] for d in depths]
        keeps_input = all(abs(v - baseline) < 5e-4 for v in values)
        ax.plot(
            depths,
            values,
            marker="o",
            color=colour,
            label=member["label"] + (" (keeps the input order)" if keeps_input else ""),
        )
        if keeps_input:
            continue  # its numbers are the input run's, on the dashed line
        for d, v in zip(depths, values):
            ax.annotate(
                f"{v:.3f}", (d, v), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8, color=colour
            )
    over = report["over_fetch"]
    ax.axvline(
        over["depth"],
        color="#999999",
        linestyle=":",
        label=f"over-fetch rule for k={over['keep']}: max(25, 4k) = {over['depth']}",
    )
    ax.set_xscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.margins(x=0.06, y=0.12)  # room for the value labels
    ax.set_xlabel("documents reranked (top d of the input run)")
    ax.set_ylabel("nDCG@10")
    ax.set_title(f"Quality vs rerank depth ({n_queries} queries)")
    ax.grid(True, alpha=0.3)
    _legend_below(fig, ax)
    paths.append(_save(fig, plt, directory / "quality_vs_depth.png"))

    fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=120)
    ax.axhline(baseline, color=INPUT_COLOUR, linestyle="--", label=f"input run ({baseline:.3f}, no reranking)")
    for colour, member in zip(COLOURS, served):
        points = [
            (member["depths"][str(d)]["latency"]["total_ms"].get("p50"), member["depths"][str(d)]["mean"]["nDCG@10"], d)
            for d in depths
        ]
        points = [p for p in points if p[0] is not None]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=member["label"])
        xs = [p[0] for p in points]
        if max(xs) < 2 * min(xs):
            # Points this close would print over each other: one label for the lot.
            x, y, _ = points[-1]
            ax.annotate(
                f"d={points[0][2]}..{points[-1][2]}",
                (x, y),
                textcoords="offset points",
                xytext=(6, 6),
                fontsize=8,
                color=colour,
            )
            continue
        for x, y, d in points:
            ax.annotate(f"d={d}", (x, y), textcoords="offset points", xytext=(5, -12), fontsize=8, color=colour)
    cascade = report.get("cascade")
    if cascade and "p50" in cascade["cascade"]["latency"]["total_ms"]:
        page = cascade["cascade"]
        ax.scatter(
            [page["latency"]["total_ms"]["p50"]],
            [page["mean"]["nDCG@10"]],
            marker="*",
            s=220,
            color="#000000",
            zorder=4,
            label=f"cascade {cascade['stages']} (member:keep per stage)",
        )
        ax.annotate(
            f"{page['mean']['nDCG@10']:.3f}",
            (page["latency"]["total_ms"]["p50"], page["mean"]["nDCG@10"]),
            textcoords="offset points",
            xytext=(9, 4),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.margins(x=0.1, y=0.12)
    ax.set_xlabel("latency per query, p50 (ms, log scale; open to a complete pull)")
    ax.set_ylabel("nDCG@10")
    ax.set_title("Quality vs latency (each point: one rerank depth" + (", the star: the cascade)" if cascade else ")"))
    ax.grid(True, alpha=0.3, which="both")
    _legend_below(fig, ax)
    paths.append(_save(fig, plt, directory / "quality_vs_latency.png"))

    full = str(report["full_depth"])
    labels = ["input run", *(m["label"] for m in served)]
    series = [
        list(report["input_run"]["per_query"]["nDCG@10"].values()),
        *(list(m["depths"][full]["per_query"]["nDCG@10"].values()) for m in served),
    ]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    # No fliers: every query is drawn as a point over the box anyway.
    ax.boxplot(series, tick_labels=labels, showmeans=True, showfliers=False, widths=0.5)
    for i, (values, colour) in enumerate(zip(series, (INPUT_COLOUR, *COLOURS)), start=1):
        offsets = [i + ((k % 7) - 3) * 0.03 for k in range(len(values))]
        ax.scatter(offsets, values, s=10, alpha=0.6, color=colour, zorder=3)
    ax.set_ylabel("nDCG@10 per query")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"Per-query nDCG@10, reranking the top {full} (triangle: mean)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    paths.append(_save(fig, plt, directory / "per_query_ndcg10.png"))
    calibrated = [(colour, m) for colour, m in zip(COLOURS, served) if "calibration" in m]
    if calibrated:
        paths.append(_reliability(plt, calibrated, directory / "reliability.png", full))
    if report.get("verdict", {}).get("rows"):
        paths.append(_depth_by_kept(plt, report["verdict"], served, directory / "depth_by_kept.png"))
    return paths


def _depth_by_kept(plt: Any, verdict: Mapping[str, Any], served: list[Mapping[str, Any]], path: Path) -> Path:
    """Recall of the documents kept against the reranking depth: one line per member and number
    kept, so the depth past which keeping more or reranking deeper stops paying shows."""
    fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=120)
    styles = ("-", "--", ":")
    for colour, member in zip(COLOURS, served):
        rows = sorted((r for r in verdict["rows"] if r["member"] == member["label"]), key=lambda r: r["depth"])
        for style, kept in zip(styles, verdict["kept"]):
            ax.plot(
                [r["depth"] for r in rows],
                [r["kept"][str(kept)]["recall"] for r in rows],
                marker="o",
                linestyle=style,
                color=colour,
                label=f"{member['label']}, {kept} kept",
            )
        if member["label"] in verdict["knees"]:
            ax.axvline(verdict["knees"][member["label"]], color=colour, alpha=0.3, linewidth=4)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xlabel("documents reranked (top d of the input run; shaded: the knee)")
    ax.set_ylabel("recall of the documents kept")
    ax.set_title("Depth x documents kept")
    ax.grid(True, alpha=0.3)
    _legend_below(fig, ax)
    return _save(fig, plt, path)


def _reliability(plt: Any, members: list[tuple[str, Mapping[str, Any]]], path: Path, full: str) -> Path:
    """Predicted against observed relevance per score bin: the member's own scores dashed,
    calibrated ones solid; the diagonal is a score that means what it says."""
    fig, ax = plt.subplots(figsize=(6.4, 6.4), dpi=120)
    ax.plot([0, 1], [0, 1], color=INPUT_COLOUR, linestyle=":", label="perfectly calibrated")
    for colour, member in members:
        calibration = member["calibration"]
        for key, style, name in (("raw", "--", "raw"), ("served", "-", "calibrated")):
            summary = calibration[key]
            if summary is None:
                continue
            points = summary["bins"]
            ax.plot(
                [b["predicted"] for b in points],
                [b["observed"] for b in points],
                linestyle=style,
                marker="o",
                color=colour,
                label=f"{member['label']} {name} (ECE {summary['ece']:.3f})",
            )
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("predicted: mean score in the bin (10 bins)")
    ax.set_ylabel("observed: share of relevant documents in the bin")
    ax.set_title(f"Reliability, reranking the top {full}")
    ax.grid(True, alpha=0.3)
    _legend_below(fig, ax)
    return _save(fig, plt, path)


def _legend_below(fig: Any, ax: Any) -> None:
    """The legend under the axes, where it hides no point and no label."""
    handles, labels = ax.get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.savefig(path)
    plt.close(fig)
    return path
