"""Shared helpers for the delivery tests: worker env for the test providers, and waits."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from producer import RerankClient

#: How many times its stated deadline a wait for something that should happen may take. The
#: wait returns the moment it happens, so the factor costs a passing run nothing; it only
#: decides how long a broken run takes to fail, and a loaded machine (CI beside another job,
#: two cores shared by four test processes) needs that margin: a deadline met on a quiet
#: machine and missed under load is a flaky test, not a finding.
PATIENCE = float(os.environ.get("RERANKQ_TEST_PATIENCE", "3"))


def patient(timeout_s: float) -> float:
    """``timeout_s`` stretched by ``PATIENCE``: the deadline of a wait for an event that should come."""
    return timeout_s * PATIENCE


def provider_env(
    provider: str, *, mark_dir: Path | None = None, sleep_s: float | None = None, **settings: Any
) -> dict[str, str]:
    """Worker env: one test provider (no torch), short delivery deadlines."""
    env = {
        "RERANKQ_RERANKER_PROVIDER": f"tests.delivery_providers:{provider}",
        "RERANKQ_RERANKER_MODEL": "",
        "RERANKQ_REDELIVER_AFTER_S": "4",
        "RERANKQ_SWEEP_INTERVAL_S": "1",
        "RERANKQ_VISIBILITY_TIMEOUT_S": "60",
    }
    if mark_dir is not None:
        env["TEST_PROVIDER_MARK_DIR"] = str(mark_dir)
    if sleep_s is not None:
        env["TEST_PROVIDER_SLEEP_S"] = str(sleep_s)
    env.update({f"RERANKQ_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    timeout_s = patient(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def pull_until_complete(client: RerankClient, stream: str, n: int, timeout_s: float = 60.0):
    """Pull everything, retrying (each timed-out pull also sweeps) until the stream is complete."""
    deadline = time.monotonic() + patient(timeout_s)
    while True:
        page = client.pull(stream, 0, n, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        if page.complete:
            return page
        if time.monotonic() > deadline:
            raise AssertionError(f"stream {stream} not complete: {client.status(stream)}")


def wait_committed(client: RerankClient, stream: str, timeout_s: float = 30.0) -> Any:
    """Wait until every window the stream admitted is committed; return its status."""
    deadline = time.monotonic() + patient(timeout_s)
    while time.monotonic() < deadline:
        status = client.status(stream)
        if all(w.state == "committed" for w in status.windows):
            return status
        time.sleep(0.05)
    raise AssertionError(f"windows not committed: {client.status(stream)}")


def commits_per_window(raw: redis.Redis, client: RerankClient, stream: str) -> dict[int, int]:
    """How many commit events each window wrote: exactly-once means all ones."""
    counts: dict[int, int] = {}
    for _, fields in raw.xrange(client.store.keys.stream(stream).events):
        window = int(fields[b"window"])
        counts[window] = counts.get(window, 0) + 1
    return counts
