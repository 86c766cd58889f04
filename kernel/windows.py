"""How a stream's candidates divide into windows: counted once, for both sides.

A stream's own windows, ``0 .. window_count - 1``, hold its candidates in fusion order: they
are its first stage. A cascade's later stages (``StreamSpec.later_stages``) each re-read the
previous stage's best ``keep`` rows in windows of their own, numbered after the stages before
them, so a window is still one number on the wire and in Redis: stage 2's windows start where
the first stage's end, stage 3's where stage 2's slots end. A stage's slots are the windows it
could need; it uses fewer when the stage before it shows fewer rows than ``keep`` or a budget
stops it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def window_count(n_candidates: int, window_size: int) -> int:
    """Windows of ``window_size`` that hold ``n_candidates``, the last one short."""
    return -(-n_candidates // window_size)


@dataclass(frozen=True)
class StageWindows:
    """Where one stage's windows are: ``first .. first + slots - 1``, each of ``window_size``
    candidates; ``number`` counts from 1, the stream's own windows."""

    number: int
    first: int
    slots: int
    window_size: int
    #: How many of the previous stage's best it reads; None for the first stage (all of them).
    keep: int | None

    def holds(self, window: int) -> bool:
        return self.first <= window < self.first + self.slots


def stage_windows(n_candidates: int, window_size: int, later: Sequence[tuple[int, int]] = ()) -> list[StageWindows]:
    """Every stage's windows: the first stage's, then one entry per ``(keep, window_size)`` of
    the later stages, in order. A stage reads at most what the stage before it read."""
    first = StageWindows(1, 0, window_count(n_candidates, window_size), window_size, None)
    stages = [first]
    reads, start = n_candidates, first.slots
    for number, (keep, size) in enumerate(later, start=2):
        reads = min(reads, keep)
        stage = StageWindows(number, start, window_count(reads, size), size, keep)
        stages.append(stage)
        start += stage.slots
    return stages


def stage_of(stages: Sequence[StageWindows], window: int) -> StageWindows | None:
    """The stage whose slots hold ``window``; None past the last one."""
    for stage in stages:
        if stage.holds(window):
            return stage
    return None
