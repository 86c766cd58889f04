"""The scoring bench's int8 recipes side by side (``ops/bench/scoring.py``'s int8 rows).

One row per recipe, backend and precision of the unquantised rest, from the same alternated
run: its ranking on the windows ``auto`` holds an int8 export to (the probe and the shipped
collection's held-out windows: the worst window's Spearman against torch fp32, the mean, how
many windows fall below the bar, the largest score difference), auto's verdict, and its speed
as the median of per-round ratios against ``CrossEncoder.predict`` and against the bf16 row
(OpenVINO bf16, what ``auto`` adopts here when no int8 is at parity).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ops.bench.common import median_of_ratios, print_table
from worker.engine.parity import MIN_SPEARMAN

#: The row an int8 export must beat (``Subject.backend_key``).
BF16_ROW = "openvino/bf16"


def int8_rows(
    subjects: Sequence[Any], results: dict[str, dict[str, Any]], parity: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each quantised subject's figures, by backend key; the first subject of each key."""
    bf16 = next((s for s in subjects if s.backend_key == BF16_ROW), None)
    rows: dict[str, dict[str, Any]] = {}
    for subject in subjects:
        key = subject.backend_key
        if not subject.quantized or key in rows or subject.name not in parity:
            continue
        held = parity[subject.name]
        rhos = held["spearman"]
        rows[key] = {
            "subject": subject.name,
            "recipe": subject.choice.quantization,
            "backend": subject.choice.name,
            "rest": subject.rest_precision,
            "windows": held["windows"],
            "spearman_min": min(rhos),
            "spearman_mean": statistics.fmean(rhos),
            "windows_below": sum(r < MIN_SPEARMAN for r in rhos),
            "max_abs_diff": held["max_abs_diff"],
            "refused_by_auto": held["refusal"],
            "ratio_predict": results[subject.name]["ratio"],
            "ratio_bf16": median_of_ratios(subject.rates, bf16.rates) if bf16 is not None else None,
        }
    return rows


def print_int8_table(rows: dict[str, dict[str, Any]]) -> None:
    if not rows:
        return
    windows = next(iter(rows.values()))["windows"]
    print_table(
        f"int8 recipes: ranking on the {windows} windows auto holds an int8 export to (the probe and the shipped "
        f"collection's held-out windows) against torch fp32, and speed against predict and the {BF16_ROW} row "
        "(medians of per-round ratios)",
        ["recipe", "backend", "rest", "spearman min", "mean", f"< {MIN_SPEARMAN}", "max |diff|", "x predict", "x bf16"],
        [
            [
                r["recipe"],
                r["backend"],
                r["rest"],
                f"{r['spearman_min']:.4f}",
                f"{r['spearman_mean']:.4f}",
                f"{r['windows_below']}/{r['windows']}",
                f"{r['max_abs_diff']:.3f}",
                f"{r['ratio_predict']:.2f}",
                "-" if r["ratio_bf16"] is None else f"{r['ratio_bf16']:.2f}",
            ]
            for r in rows.values()
        ],
    )
    for key, r in rows.items():
        verdict = r["refused_by_auto"] or "at parity by auto's bars"
        print(f"{key}: {verdict}")


def auto_against_bf16(engine: Any, subjects: Sequence[Any]) -> float | None:
    """The default engine's pairs/s over the bf16 row's, per round (None without a bf16 row)."""
    bf16 = next((s for s in subjects if s.backend_key == BF16_ROW), None)
    return median_of_ratios(engine.rates, bf16.rates) if bf16 is not None else None
