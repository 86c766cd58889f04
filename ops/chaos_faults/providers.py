"""The provider ``--break provider`` runs: it raises on every window, and the chain has no
member to fail open to, so every window commits ``failed``. The run must then fail."""

from __future__ import annotations

from worker.providers.base import ProviderUnavailable, ScoreRequest


class RaisingProvider:
    kind = "raising"
    scale = "probability"

    def __init__(self, member: object = None, settings: object = None) -> None:
        pass

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        raise ProviderUnavailable("chaos_broken", "ops/chaos.py --break provider: this member never answers")

    def close(self) -> None:
        pass
