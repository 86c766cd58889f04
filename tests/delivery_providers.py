"""Providers for the delivery, restart, poison and chaos tests, loaded by import path
(``RERANKQ_RERANKER_PROVIDER=delivery_providers:SlowProvider``; tests/ is on the
workers' path). They import no torch, so a worker starts in a second or two.

Test knobs come from the environment the test gives its worker:
``TEST_PROVIDER_SLEEP_S`` (how long a window takes) and ``TEST_PROVIDER_MARK_DIR``
(a file per scoring attempt, named ``<pid>.<stream>.<window>``, so a test knows
which process to kill and when).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

from worker.providers.base import ScoreRequest


def _score(query: str, document: str) -> float:
    # Deterministic and spread out: a redelivered window scores exactly the same.
    digest = hashlib.blake2b(f"{query}\x00{document}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


class FastProvider:
    kind = "fast"
    scale = "probability"

    def __init__(self, member: object = None, settings: object = None) -> None:
        self.sleep_s = float(os.environ.get("TEST_PROVIDER_SLEEP_S", "0"))
        mark_dir = os.environ.get("TEST_PROVIDER_MARK_DIR")
        self.mark_dir = Path(mark_dir) if mark_dir else None

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        if self.mark_dir is not None:
            (self.mark_dir / f"{os.getpid()}.{request.stream_id}.{request.window}").touch()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [_score(request.query, d) for d in request.documents]

    def close(self) -> None:
        pass


class SlowProvider(FastProvider):
    """A window takes TEST_PROVIDER_SLEEP_S (default 3 s): long enough to be killed mid-window."""

    kind = "slow"

    def __init__(self, member: object = None, settings: object = None) -> None:
        super().__init__(member, settings)
        self.sleep_s = float(os.environ.get("TEST_PROVIDER_SLEEP_S", "3"))


class SuicideProvider(FastProvider):
    """Kills its own process on every window: what a model that segfaults looks like."""

    kind = "suicide"

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        super().score(request, deadline=deadline)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class SlowStartProvider(FastProvider):
    """Takes TEST_PROVIDER_START_S to build, like a model loading in a fresh pool process."""

    kind = "slow-start"

    def __init__(self, member: object = None, settings: object = None) -> None:
        super().__init__(member, settings)
        time.sleep(float(os.environ.get("TEST_PROVIDER_START_S", "6")))
