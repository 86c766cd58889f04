"""Pages are rebuilt from committed windows only, in window order.

Only the contiguous prefix of committed windows is readable: a page never shows
window 3 while window 2 is still being scored, so a page once returned never
changes when deeper windows commit.

A cascade's page shows its last stage's rows first, in that stage's order, then the rest of
each earlier stage's rows in that stage's order (the rows the next stage did not read), down to
the first stage's. A later stage's window that failed, or began past its time budget, leaves
its rows where the earlier stage put them, with the earlier stage's decisions. Until the last
stage's rows are known nothing is shown: a page once returned never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.errors import WindowFailed
from kernel.store import HandedStage, Snapshot
from kernel.windows import StageWindows, window_count
from kernel.wire import (
    Cancelled,
    Decision,
    Failed,
    Filtered,
    Omitted,
    Page,
    Row,
    StageStatus,
    WindowState,
    WindowStatus,
    committed_window_status,
)

# Rows that take no page slot and are not counted in the total.
_HIDDEN = (Filtered, Omitted)
# A later stage's decisions that leave the earlier stage's in place.
_FELL_BACK = (Failed, Cancelled)


@dataclass
class Readable:
    """The rows a snapshot shows, in page order; how many first-stage windows the committed prefix
    spans; and whether the rows stop at a later stage (whose windows are in flight) rather than
    at the first stage's prefix (which a deeper admit extends)."""

    rows: list[Row]
    prefix: int
    waits_on_later_stage: bool = False


def _first_stage_rows(snapshot: Snapshot) -> tuple[list[Row], int]:
    rows: list[Row] = []
    window = 0
    while window < snapshot.n_windows and window in snapshot.results:
        for decision in snapshot.results[window].decisions:
            if not isinstance(decision, _HIDDEN):
                rows.append(Row(rank=len(rows) + 1, window=window, decision=decision))
        window += 1
    return rows, window


def _later_stage_rows(
    snapshot: Snapshot, stage: StageWindows, handed: HandedStage, earlier: dict[int, Row]
) -> tuple[list[Row], bool]:
    """A later stage's rows in its windows' order, as far as they are committed, and whether all
    are. ``earlier``: the previous stages' rows by candidate index, where a row falls back."""
    rows: list[Row] = []
    for window in range(stage.first, stage.first + handed.windows):
        result = snapshot.results.get(window)
        if result is None:
            return rows, False
        for decision in result.decisions:
            if isinstance(decision, _HIDDEN):
                continue
            if isinstance(decision, _FELL_BACK):
                rows.append(earlier[decision.index])
            else:
                rows.append(Row(rank=0, window=window, decision=decision, stage=stage.number))
    return rows, True


def visible_rows(snapshot: Snapshot, *, raise_on_failed: bool = False, stream_id: str = "") -> Readable:
    """The rows of the committed windows, in page order, ranked. ``raise_on_failed``: a failed
    row among them raises ``WindowFailed`` instead."""
    readable = _readable(snapshot)
    if raise_on_failed:
        for row in readable.rows:
            if isinstance(row.decision, Failed):
                raise WindowFailed(stream_id, row.window, row.decision.reason)
    return readable


def _readable(snapshot: Snapshot) -> Readable:
    first, prefix = _first_stage_rows(snapshot)  # ranked as they stand: a stream of one stage
    if not snapshot.later_stages:
        return Readable(first, prefix)
    # Each stage's rows, and how many of them the next stage read: the page is the last handed
    # stage's rows, then each earlier stage's rest, last to first.
    stages: list[tuple[list[Row], bool]] = [(first, prefix >= snapshot.n_windows)]
    read_by_next: list[int] = []
    earlier = {row.decision.index: row for row in first}
    for stage in snapshot.stage_windows()[1:]:
        handed = snapshot.handed.get(stage.number)
        if handed is None:
            if snapshot.cancelled:
                break  # it never runs: the stages before it stand
            return Readable([], prefix, waits_on_later_stage=True)
        rows, complete = _later_stage_rows(snapshot, stage, handed, earlier)
        stages.append((rows, complete))
        read_by_next.append(len(handed.members))
        earlier.update({row.decision.index: row for row in rows})
    shown: list[Row] = []
    for k in range(len(stages) - 1, -1, -1):
        rows, complete = stages[k]
        shown += rows[read_by_next[k] :] if k < len(read_by_next) else rows
        if not complete:
            return Readable(_ranked(shown), prefix, waits_on_later_stage=k > 0)
    return Readable(_ranked(shown), prefix)


def _ranked(rows: list[Row]) -> list[Row]:
    return [Row(rank=i, window=r.window, decision=r.decision, stage=r.stage) for i, r in enumerate(rows, start=1)]


def stage_statuses(snapshot: Snapshot) -> list[StageStatus]:
    """Each stage of a cascade, first to last: what it read, committed, and where it stopped short
    (empty for a stream of one stage)."""
    if not snapshot.later_stages:
        return []
    chains = snapshot.stage_chains
    out = []
    for stage in snapshot.stage_windows():
        chain = chains[stage.number - 1] if stage.number <= len(chains) else None
        if stage.number == 1:
            committed = sum(1 for w in range(stage.slots) if w in snapshot.results)
            out.append(
                StageStatus(stage=1, chain=chain, read=snapshot.n_candidates, windows=stage.slots, committed=committed)
            )
            continue
        handed = snapshot.handed.get(stage.number)
        if handed is None:
            out.append(StageStatus(stage=stage.number, chain=chain, keep=stage.keep))
            continue
        results = [
            snapshot.results[w] for w in range(stage.first, stage.first + handed.windows) if w in snapshot.results
        ]
        fell_back = [d for r in results for d in r.decisions if isinstance(d, _FELL_BACK)]
        out.append(
            StageStatus(
                stage=stage.number,
                chain=chain,
                keep=stage.keep,
                read=len(handed.members),
                windows=handed.windows,
                committed=len(results),
                stopped=handed.stopped,
                fell_back=len(fell_back),
                reasons=sorted({_reason(d) for d in fell_back}),
            )
        )
    return out


def _reason(decision: Decision) -> str:
    return getattr(decision, "reason", "") or "failed"


def build_page(
    stream_id: str,
    snapshot: Snapshot,
    offset: int,
    limit: int,
    *,
    raise_on_failed: bool = False,
) -> tuple[Page, int]:
    """The page, and the window count to admit so it can fill: -1 when the page is full or
    final, ``snapshot.admitted`` when windows already in flight may fill it."""
    readable = visible_rows(snapshot, raise_on_failed=raise_on_failed, stream_id=stream_id)
    rows = readable.rows
    complete = snapshot.complete
    wanted = offset + limit
    page = Page(
        stream_id=stream_id,
        offset=offset,
        limit=limit,
        rows=rows[offset:wanted],
        total=len(rows),
        complete=complete,
        pending_windows=_pending_windows(snapshot),
        stages=stage_statuses(snapshot),
    )
    missing = 0 if complete else max(0, wanted - len(rows))
    if not missing:
        return page, -1
    if readable.waits_on_later_stage:
        return page, snapshot.admitted
    return page, _windows_to_admit(snapshot, readable.prefix, missing)


def _pending_windows(snapshot: Snapshot) -> int:
    """Windows admitted and not yet committed, a cascade's later stages' included."""
    admitted = snapshot.admitted + sum(h.windows for h in snapshot.handed.values())
    return admitted - len(snapshot.results)


def _windows_to_admit(snapshot: Snapshot, prefix: int, missing_rows: int) -> int:
    # Uncommitted windows past the readable prefix count at full size (they may
    # filter nothing); committed ones at what they show.
    potential = 0
    for window in range(prefix, snapshot.admitted):
        result = snapshot.results.get(window)
        if result is None:
            start, end = snapshot.bounds(window)
            potential += end - start
        else:
            potential += sum(1 for d in result.decisions if not isinstance(d, _HIDDEN))
    short = missing_rows - potential
    if short <= 0:
        return snapshot.admitted
    return min(snapshot.n_windows, snapshot.admitted + window_count(short, snapshot.window_size))


def window_statuses(snapshot: Snapshot, attempts: dict[int, int]) -> list[WindowStatus]:
    """Where each window stands: the first stage's, then each later stage's once it was handed
    its rows (``start`` and ``end`` are then places in what the stage reads)."""
    out = []
    for window in range(snapshot.n_windows):
        start, end = snapshot.bounds(window)
        state: WindowState = "admitted" if window < snapshot.admitted else "not_admitted"
        out.append(_status(snapshot, window, start, end, state, attempts))
    for stage in snapshot.stage_windows()[1:]:
        handed = snapshot.handed.get(stage.number)
        if handed is None:
            continue
        for k in range(handed.windows):
            start, end = k * stage.window_size, min((k + 1) * stage.window_size, len(handed.members))
            out.append(_status(snapshot, stage.first + k, start, end, "admitted", attempts, stage=stage.number))
    return out


def _status(
    snapshot: Snapshot,
    window: int,
    start: int,
    end: int,
    state: WindowState,
    attempts: dict[int, int],
    *,
    stage: int = 1,
) -> WindowStatus:
    result = snapshot.results.get(window)
    if result is not None:
        return committed_window_status(result)
    return WindowStatus(window=window, start=start, end=end, state=state, attempts=attempts.get(window, 0), stage=stage)
