"""What a producer-only install relies on: producer (the gateway and the exporter included)
imports neither the worker nor torch, checked two ways. Statically, every import statement,
lazy ones included, against the contract in pyproject.toml (import-linter); and at run time,
each program's modules loaded in a fresh interpreter, so an import through a third-party
package counts too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[dev]'")
    return found


def test_the_import_contracts_in_pyproject_are_kept() -> None:
    run = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(
    "modules",
    [
        ["producer"],
        ["producer.gateway", "producer.gateway.app", "producer.gateway.main"],
        ["producer.exporter", "producer.exporter.main"],
    ],
)
def test_the_programs_load_no_worker_module_and_no_torch(modules: list[str]) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('worker', 'torch', 'sentence_transformers')))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_serve_and_exporter_help_load_no_worker_module() -> None:
    """``python -m producer.gateway --help`` and ``python -m producer.exporter --help`` run their
    click commands: the whole program path, parsing included, stays on the producer side."""
    code = (
        "import runpy, sys\n"
        "sys.argv = [sys.argv[1], '--help']\n"
        "try:\n"
        "    runpy.run_module(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in ('worker', 'torch')))"
    )
    for program in ("producer.gateway", "producer.exporter"):
        run = subprocess.run(
            [sys.executable, "-c", code, program], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip().splitlines()[-1] == "LOADED []", program
