"""Counting the calls that really reach a provider (a cache hit is not one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from worker.metrics.recorder import NO_METRICS, Recorder
from worker.providers.base import Provider, ProviderError, Scale, ScoreRequest, repair_listener, retry_listener


class MeteredProvider:
    """Counts ``provider_calls:<member>`` only when the provider itself is called, and tells
    the metrics of the call: its pairs, its time, its error, its retries and its repairs."""

    def __init__(
        self, inner: Provider, *, label: str, count: Callable[..., None], recorder: Recorder = NO_METRICS
    ) -> None:
        """``count(name, then=...)`` adds one to a store counter and calls ``then()`` once it is
        counted (with the window's commit, ``worker.side_writes``), where the metrics count too."""
        self.inner = inner
        self.kind = inner.kind
        self.label = label
        self._count = count
        self._recorder = recorder
        self._on_retry = partial(recorder.provider_retried, label)
        self._on_repair = partial(recorder.provider_repaired, label)

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        self._count(
            f"provider_calls:{self.label}",
            then=partial(self._recorder.provider_called, self.label, len(request.documents)),
        )
        token = retry_listener.set(self._on_retry)
        repairs = repair_listener.set(self._on_repair)
        start = time.perf_counter()
        error: str | None = None
        try:
            return self.inner.score(request, deadline=deadline)
        except ProviderError as exc:
            error = exc.reason
            raise
        finally:
            repair_listener.reset(repairs)
            retry_listener.reset(token)
            self._recorder.provider_answered(self.label, time.perf_counter() - start, error)

    def close(self) -> None:
        self.inner.close()
