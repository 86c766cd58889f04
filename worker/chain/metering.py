"""Counting the calls that really reach a provider (a cache hit is not one)."""

from __future__ import annotations

from collections.abc import Callable

from worker.providers.base import Provider, Scale, ScoreRequest


class MeteredProvider:
    """Counts ``provider_calls:<member>`` only when the provider itself is called."""

    def __init__(self, inner: Provider, *, label: str, count: Callable[[str], None]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.label = label
        self._count = count

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        self._count(f"provider_calls:{self.label}")
        return self.inner.score(request, deadline=deadline)

    def close(self) -> None:
        self.inner.close()
