"""The explicit passthrough: the window keeps its fusion order. Ends a chain that fails open."""

from __future__ import annotations

from kernel.settings import MemberSettings, Settings
from worker.providers.base import Scale, ScoreRequest


class RrfProvider:
    kind = "rrf"
    scale: Scale | None = None

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        pass

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        # Scores are seeded from fusion rank by the scoring step, which knows the
        # window; a passthrough never invents relevance.
        return [None] * len(request.documents)

    def close(self) -> None:
        pass
