"""A provider that does nothing, for the queue benchmark: the time it leaves is ours.

Loaded by import path: RERANKQ_RERANKER_PROVIDER=ops.bench.noop_provider:NoopProvider,
with the repository root on PYTHONPATH.
"""

from __future__ import annotations

from kernel.settings import MemberSettings, Settings
from worker.providers.base import ScoreRequest


class NoopProvider:
    kind = "noop"
    scale = "probability"

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        pass

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        # Distinct, decreasing scores: flat scores would be rejected as a broken model.
        n = len(request.documents)
        return [1.0 - i / (n + 1) for i in range(n)]

    def close(self) -> None:
        pass


class PacedProvider(NoopProvider):
    """Takes ``BENCH_WINDOW_S`` per window: a worker that drains at a known rate."""

    kind = "paced"

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        import os

        self.window_s = float(os.environ.get("BENCH_WINDOW_S", "0.1"))

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        import time

        time.sleep(self.window_s)
        return super().score(request, deadline=deadline)
