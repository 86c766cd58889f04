"""The README's run command: a private Redis, a worker, a sample job, readable results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def demo(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **extra_env})
    return subprocess.run(
        [sys.executable, "-m", "rerankq.demo"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def run_demo(extra_env: dict[str, str]) -> str:
    done = demo(extra_env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def page_ids(out: str, member: str) -> list[list[str]]:
    """The ids of each printed page's rows served by ``member``, page by page."""
    pages: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("page "):
            pages.append([])
        elif pages and line.strip()[:1].isdigit() and f" {member} " in line:
            pages[-1].append(line.split()[6])
    return pages


def test_demo_scores_with_a_model_on_disk(tiny_model_dir):
    # The torch backend: what auto measures at a first start (exports, parity) is the packaged
    # model's case below and test_backends'; this one is about a model named on disk.
    out = run_demo({"RERANKQ_RERANKER_MODEL": str(tiny_model_dir), "RERANKQ_RERANKER_BACKEND": "torch"})
    assert "started a private redis-server" in out
    assert "page 1" in out and "deeper: the third window" in out
    assert [len(ids) for ids in page_ids(out, "0:local")] == [5, 5]
    assert "window 2 [20, 30): committed" in out and "window 3 [30, 40): not_admitted" in out
    assert "served by: 0:local" in out


@pytest.mark.parametrize(
    "extra_env",
    [{}, {"RERANKQ_RERANKER_MODEL": "/nonexistent/model"}],
    ids=["no chain configured", "a cross-encoder that is not there"],
)
def test_demo_offline_reranks_with_the_packaged_model_and_says_so(extra_env, tmp_path):
    out = run_demo({**extra_env, "TMPDIR": str(tmp_path)})
    first, deeper = page_ids(out, "1:embedding")
    # Each window's payment-gateway documents come first (the sample interleaves them with
    # office, HR and finance notes in fusion order).
    assert first[:2] in (["doc-00", "doc-07"], ["doc-07", "doc-00"])
    assert sorted(deeper[:3]) == ["doc-24", "doc-25", "doc-29"]
    assert "served by: 1:embedding" in out and "all-MiniLM-L6-v2" in out
    assert "RERANKQ_RERANKER_MODEL" in out

    # One failure, one wording: every window passed member 0 over for the same reason.
    assert len([line for line in out.splitlines() if "passed over member 0" in line]) == 1, out
    assert ". .venv/bin/activate" in out and 'redis-server --port 6390 --save "" --daemonize yes' in out
    assert not list(tmp_path.glob("rerankq-demo-*"))  # the folder it made for the worker's log is gone


def test_demo_whose_worker_cannot_score_says_why(tmp_path):
    missing = tmp_path / "models" / "nope"
    done = demo({"RERANKQ_RERANKER_MODEL": str(missing), "RERANKQ_RERANKER_1_PROVIDER": "rrf", "TMPDIR": str(tmp_path)})
    assert done.returncode != 0
    [why] = [line for line in done.stdout.splitlines() if line.startswith("The worker did not start. Why:")]
    assert "no chain member that scores can start" in why and str(missing) in why
    assert not list(tmp_path.glob("rerankq-demo-*"))
