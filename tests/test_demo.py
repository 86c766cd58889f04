"""The README's run command: a private Redis, a worker, a sample job, readable results."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT


def run_demo(extra_env: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **extra_env})
    done = subprocess.run([sys.executable, "-m", "worker.demo"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_demo_scores_with_a_model_on_disk(tiny_model_dir):
    out = run_demo({"RERANKQ_RERANKER_MODEL": str(tiny_model_dir)})
    assert "started a private redis-server" in out
    assert "page 1" in out and "deeper than the first window" in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit() and "0:local" in line]
    assert len(rows) == 15  # 5 rows of page 1, 10 of the deeper page
    assert "window 1 [10, 20): committed" in out and "window 2 [20, 30): not_admitted" in out


def test_demo_without_a_model_finishes_on_rrf_and_says_how_to_fix_it():
    out = run_demo({"RERANKQ_RERANKER_MODEL": "/nonexistent/model"})
    assert "1:rrf" in out
    assert "RERANKQ_RERANKER_MODEL" in out
