"""ops/bench/gpu_check.sh with its device forced to the CPU: every step's code path runs and
every row is reported; a step that cannot run fails the check, naming the row it lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devservers.tiny_model import build_tiny_cross_encoder

ROOT = Path(__file__).resolve().parents[1]
#: Five steps, each a process importing torch: 77 s on a quiet 2-core VM, past 300 s with the
#: suite and two busy loops beside it (2026-12-06). The deadline is for a hung check, not a slow one.
CHECK_DEADLINE_S = 1200
ROWS = (
    "engine at parity vs predict",
    "causal reranker vs predict",
    "coalescing across streams",
    "queue throughput, two GPU workers",
    "peak memory",
)


def gpu_check(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    model = build_tiny_cross_encoder(tmp_path / "model")
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_MODEL": str(model), "PYTHON": sys.executable, **extra}
    return subprocess.run(
        ["bash", str(ROOT / "ops/bench/gpu_check.sh"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECK_DEADLINE_S,
    )


def failed_steps(done: subprocess.CompletedProcess[str], out: Path) -> str:
    """The check's complaint and the log of each step it names: the reason is in the step's own output."""
    report = [done.stderr[-3000:]]
    for line in done.stderr.splitlines():
        if line.startswith("gpu_check: step "):  # "gpu_check: step NAME FAILED (exit N)"
            log = out / f"{line.split()[2]}.log"
            if log.exists():
                report.append(f"--- {log.name} ---\n{log.read_text(errors='replace')[-4000:]}")
    return "\n".join(report)


@pytest.mark.slow  # every bench step, two real workers
@pytest.mark.timeout(CHECK_DEADLINE_S + 60)
def test_the_gpu_check_reports_every_row_with_its_device_forced_to_the_cpu(tmp_path: Path) -> None:
    done = gpu_check(tmp_path)
    assert done.returncode == 0, failed_steps(done, tmp_path / "out")
    reported = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert all(row in reported for row in ROWS)


@pytest.mark.slow  # two bench steps
def test_the_gpu_check_fails_loudly_naming_a_row_it_could_not_measure(tmp_path: Path) -> None:
    # The causal step cannot run; the memory step after it still does; the steps left out are
    # not measured either, and say so.
    done = gpu_check(tmp_path, GPU_CHECK_CAUSAL_LAYERS="none", GPU_CHECK_STEPS="causal memory")

    assert done.returncode != 0
    assert "step causal FAILED" in done.stderr
    assert "NOT MEASURED: causal reranker vs predict" in done.stderr
    reported = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert "peak memory" in reported
    for row in ("engine at parity vs predict", "coalescing across streams", "queue throughput, two GPU workers"):
        assert f"NOT MEASURED: {row}" in done.stderr
