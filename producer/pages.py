"""Pages are rebuilt from committed windows only, in window order.

Only the contiguous prefix of committed windows is readable: a page never shows
window 3 while window 2 is still being scored, so a page once returned never
changes when deeper windows commit.
"""

from __future__ import annotations

from kernel.errors import WindowFailed
from kernel.store import Snapshot
from kernel.windows import window_count
from kernel.wire import Failed, Filtered, Omitted, Page, Row

# Rows that take no page slot and are not counted in the total.
_HIDDEN = (Filtered, Omitted)


def visible_rows(snapshot: Snapshot, *, raise_on_failed: bool = False, stream_id: str = "") -> tuple[list[Row], int]:
    """Rows of the committed prefix, and how many windows that prefix spans."""
    rows: list[Row] = []
    window = 0
    while window in snapshot.results:
        result = snapshot.results[window]
        for decision in result.decisions:
            if isinstance(decision, _HIDDEN):
                continue
            if raise_on_failed and isinstance(decision, Failed):
                raise WindowFailed(stream_id, window, decision.reason)
            rows.append(Row(rank=len(rows) + 1, window=window, decision=decision))
        window += 1
    return rows, window


def build_page(
    stream_id: str, snapshot: Snapshot, offset: int, limit: int, *, raise_on_failed: bool = False
) -> tuple[Page, int]:
    """The page, and the window count to admit so it can fill: -1 when the page is full or
    final, ``snapshot.admitted`` when windows already in flight may fill it."""
    rows, prefix = visible_rows(snapshot, raise_on_failed=raise_on_failed, stream_id=stream_id)
    complete = prefix >= snapshot.n_windows
    wanted = offset + limit
    page = Page(
        stream_id=stream_id,
        offset=offset,
        limit=limit,
        rows=rows[offset:wanted],
        total=len(rows),
        complete=complete,
        pending_windows=snapshot.admitted - len(snapshot.results),
    )
    missing = 0 if complete else max(0, wanted - len(rows))
    return page, _windows_to_admit(snapshot, prefix, missing) if missing else -1


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
