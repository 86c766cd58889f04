"""Where a window stands in its stream: its cascade stage, the chain profile that scores it, its
candidates' indexes in the stream, and where it starts and ends (``kernel.windows``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kernel.store import Begun
from kernel.wire import Stage, StreamSpec


class Undecodable(Exception):
    """The stored spec or a candidate cannot be decoded: the window can only fail."""


@dataclass(frozen=True)
class WindowPlace:
    """Where a window stands in its stream: its cascade stage and the chain profile that scores
    it, its candidates' indexes in the stream, and its ``start`` and ``end`` (a later stage's:
    places in what that stage reads)."""

    stage: int
    chain: str | None
    indexes: list[int]
    start: int
    end: int
    #: A later stage's settings (its budgets); None for the first stage.
    later: Stage | None = None

    def past_time_budget(self, admitted_at_ms: int) -> bool:
        """A later stage's window begun after the stage's ``max_seconds`` ran out."""
        if self.later is None or self.later.max_seconds is None or not admitted_at_ms:
            return False
        return time.time() * 1000 - admitted_at_ms > self.later.max_seconds * 1000


def place_of(spec: StreamSpec, window: int, begun: Begun) -> WindowPlace:
    try:
        windows, later = spec.stage_of(window)
    except ValueError as exc:
        raise Undecodable(str(exc)) from None
    if later is None:
        start = window * spec.window_size
        end = start + len(begun.candidates)
        return WindowPlace(stage=1, chain=spec.chain, indexes=list(range(start, end)), start=start, end=end)
    if len(begun.indexes) != len(begun.candidates):
        raise Undecodable(f"{len(begun.indexes)} indexes for {len(begun.candidates)} candidates")
    start = (window - windows.first) * later.window_size
    return WindowPlace(
        stage=windows.number,
        chain=later.chain,
        indexes=list(begun.indexes),
        start=start,
        end=start + len(begun.indexes),
        later=later,
    )


def place_at_worst(spec: StreamSpec | None, window: int, begun: Begun) -> WindowPlace:
    """The window's place as far as what could be decoded tells it (a failed window's rows)."""
    if spec is not None:
        try:
            return place_of(spec, window, begun)
        except Undecodable:
            pass
    size = spec.window_size if spec is not None else len(begun.candidates)
    start = window * size
    indexes = begun.indexes or list(range(start, start + len(begun.candidates)))
    return WindowPlace(stage=1, chain=None, indexes=indexes, start=start, end=start + len(indexes))
