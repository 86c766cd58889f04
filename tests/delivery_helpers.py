"""Shared helpers for the delivery tests: worker env for the test providers, and waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from producer import RerankClient


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def pull_until_complete(client: RerankClient, stream: str, n: int, timeout_s: float = 60.0):
    """Pull everything, retrying (each timed-out pull also sweeps) until the stream is complete."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = client.pull(stream, 0, n, timeout=min(5.0, max(0.1, deadline - time.monotonic())))
        if page.complete:
            return page
        if time.monotonic() > deadline:
            raise AssertionError(f"stream {stream} not complete: {client.status(stream)}")


def commits_per_window(raw: redis.Redis, client: RerankClient, stream: str) -> dict[int, int]:
    """How many commit events each window wrote: exactly-once means all ones."""
    counts: dict[int, int] = {}
    for _, fields in raw.xrange(client.store.keys.stream(stream).events):
        window = int(fields[b"window"])
        counts[window] = counts.get(window, 0) + 1
    return counts
