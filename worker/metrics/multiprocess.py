"""prometheus-client's multiprocess mode, one directory per worker.

A prefork worker scores in pool processes and serves HTTP from its main process, so every
process writes its metrics to memory-mapped files in one directory (the documented
``PROMETHEUS_MULTIPROC_DIR`` mode) and the main process merges them at scrape time. Each
worker gets a directory of its own, named after its main process, emptied at start so a
restarted worker never adds its predecessor's counts twice. A pool process that died is
marked dead at the next scrape (``mark_process_dead``): its live gauges go, its counters and
histograms stay, so totals never go backwards when a process is replaced. Directories left by
workers that are gone are removed when the next worker on the host starts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
_DIRECTORY = re.compile(r"^worker-(\d+)$")
_PID_FILE = re.compile(r"_(\d+)\.db$")


def base_directory(configured: str | None) -> Path:
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "rerankq-metrics"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, not ours to judge
    return True


def prepare(base: Path, pid: int | None = None) -> Path:
    """Create this worker's empty directory, point prometheus-client at it, and remove the
    directories of workers on this host that are gone. Call before any metric is created."""
    pid = os.getpid() if pid is None else pid
    base.mkdir(parents=True, exist_ok=True)
    for sibling in base.iterdir():
        match = _DIRECTORY.match(sibling.name)
        if match and int(match.group(1)) != pid and not alive(int(match.group(1))):
            shutil.rmtree(sibling, ignore_errors=True)
    directory = base / f"worker-{pid}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    os.environ[ENV] = str(directory)
    # prometheus-client picks its value class when first imported; if something imported it
    # before the variable was set, switch it now, before any metric exists.
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()
    return directory


def process_ids(directory: Path) -> set[int]:
    return {int(m.group(1)) for f in os.listdir(directory) if (m := _PID_FILE.search(f))}


def reap_dead(directory: Path) -> list[int]:
    """Mark every process that wrote here and is gone as dead; returns their ids."""
    from prometheus_client import multiprocess

    dead = [pid for pid in process_ids(directory) if not alive(pid)]
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(directory))
    return dead
