"""The GPU check's summary: one line per row from the steps' JSON, and a non-zero exit that
names every row it could not report (a step failed, skipped, or wrote no figures).

    python -m ops.bench.gpu_report OUT_DIR
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _scoring(s: dict[str, Any]) -> str:
    return (
        f"engine {s['engine_pairs_per_s']:.0f} pairs/s ({s['engine_precision']}), predict "
        f"{s['baseline_pairs_per_s']:.0f}, {s['ratio']:.2f}x, spearman min {s['spearman_min']:.4f}"
    )


def _causal(c: dict[str, Any]) -> str:
    c = c["causal"]
    rows = ", ".join(f"{name} {f['pairs_per_s']:.1f} pairs/s ({f['ratio']:.2f}x)" for name, f in c["subjects"].items())
    return f"{c['layers']} layers, {c['precision']}: {rows}"


def _coalesce(c: dict[str, Any]) -> str:
    return f"{c['coalescing_gain']:.2f}x ({c['windows_per_flush']:.1f} windows per forward call)"


def _workers(w: dict[str, Any]) -> str:
    return (
        f"plain worker {w['plain_pairs_per_s']:.0f} pairs/s, coalescing worker {w['coalescing_pairs_per_s']:.0f}; "
        f"same order {w['same_order']}, max |diff| {w['max_abs_diff']:.2g}"
    )


def _memory(m: dict[str, Any]) -> str:
    return f"{m['peak_mb']:.0f} MB ({m['source']}, {m['precision']})"


#: Each row: its title, the step whose JSON it reads, how it is told.
ROWS: list[tuple[str, str, Callable[[dict[str, Any]], str]]] = [
    ("engine at parity vs predict", "scoring-minilm", _scoring),
    ("causal reranker vs predict", "causal", _causal),
    ("coalescing across streams", "coalesce", _coalesce),
    ("queue throughput, two GPU workers", "worker-check", _workers),
    ("peak memory", "memory", _memory),
]


def report(out: Path) -> list[str]:
    """Print every row it can; return the titles of those it cannot."""
    missing = []
    for title, step, tell in ROWS:
        path = out / f"{step}.json"
        try:
            line = tell(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            missing.append(f"{title} ({step}: {type(exc).__name__}: {exc})")
            continue
        print(f"{title}: {line}")
    return missing


def main() -> None:
    missing = report(Path(sys.argv[1]))
    for row in missing:
        print(f"gpu_check: NOT MEASURED: {row}", file=sys.stderr)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
