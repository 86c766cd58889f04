"""Running the ``rerankq`` script as a user does, and the inputs the command-line tests feed it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from delivery_providers import _score

#: The console script ``make install`` puts beside the interpreter.
RERANKQ = Path(sys.executable).with_name("rerankq")


def rerankq(
    args: list[str], env: dict[str, str], *, timeout: float = 120, cwd: Path | None = None, no_torch: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``rerankq ARGS``; with ``no_torch`` (a directory of poisoned modules) first on the path,
    an import of torch, or of anything else only the worker extra installs, fails the command."""
    assert RERANKQ.exists(), f"{RERANKQ} missing: run make install"
    if no_torch is not None:
        env = {**env, "PYTHONPATH": f"{no_torch}:{env.get('PYTHONPATH', '')}"}
    return subprocess.run([str(RERANKQ), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def poisoned_modules(directory: Path) -> Path:
    """The worker extra's packages, each raising on import: what a pipeline-only install lacks."""
    for name in ("torch", "sentence_transformers", "transformers", "httpx", "numpy", "psutil"):
        package = directory / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return directory


def fast_env(base_env: dict[str, str], **extra: str) -> dict[str, str]:
    """A worker on the torch-free test provider (starts in a second or two)."""
    env = {
        **base_env,
        "RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:FastProvider",
        "RERANKQ_RERANKER_MODEL": "",
    }
    env.update(extra)
    return env


def write_jsonl(path: Path, jobs: list[dict[str, Any]], *, raw_lines: dict[int, str] | None = None) -> Path:
    """One job a line; ``raw_lines`` puts text of its own at some 0-based positions instead."""
    lines = [json.dumps(job) for job in jobs]
    for position, text in (raw_lines or {}).items():
        lines.insert(position, text)
    path.write_text("\n".join(lines) + "\n")
    return path


def make_jobs(n: int, *, candidates: int = 25, prefix: str = "job") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}{j}",
            "query": f"how to recover payments after outage {j}",
            "candidates": [
                {"id": f"d{j}-{i}", "text": f"note {i} about outage {j} and payment retries"} for i in range(candidates)
            ],
        }
        for j in range(n)
    ]


def expected_order(query: str, texts: dict[str, str], window_size: int) -> list[str]:
    """The FastProvider's order: each window by its score (no dates or proofs: boosts are neutral)."""
    ids = list(texts)
    order: list[str] = []
    for start in range(0, len(ids), window_size):
        window = ids[start : start + window_size]
        order += sorted(window, key=lambda i: -_score(query, texts[i]))
    return order


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
