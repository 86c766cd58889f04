"""Cancelling a stream: every window not yet committed is committed as ``cancelled``.

The windows are written in one ``store.lua`` call, so a stream is cancelled whole or not at all;
from then on a worker that begins one of its windows finds it committed and skips it (no
provider is called), and one that was scoring a window when the cancel came loses the commit
race (a window is committed once, never rewritten). The stream then reads complete: its pages
hold the rows committed before the cancel, then the cancelled ones, in fusion order.

The cancelled windows' fair share (``kernel.fair_share``) is given back in a second call, on
the device's ledger (another Cluster slot), and whatever that releases of other streams is
sent; if that call fails, the sweep finds the shares of committed windows and gives them back.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from kernel.fair_share import LEDGER_ERRORS, member, send_released
from kernel.logs import get_logger
from kernel.store import Snapshot, StageHandedSince
from kernel.wire import Cancelled, Candidate, WindowResult

if TYPE_CHECKING:
    from kernel.dispatch import Dispatcher
    from kernel.fair_share import FairShare
    from kernel.store import Store

log = get_logger("rerankq.producer")

CANCELLED_REASON = "cancelled"
#: Reads a cancel makes before it gives up on a cascade that keeps handing stages windows
#: (each hand-off happens once per stage, so the stages bound it).
STAGE_RACE_RETRIES = 8


class CancelOutcome(msgspec.Struct, frozen=True):
    """What a cancel did: the windows it committed as cancelled (none when the stream was
    complete or cancelled already) and the stream's window count."""

    stream_id: str
    cancelled_windows: list[int]
    n_windows: int


def cancelled_result(window: int, start: int, candidates: list[Candidate], now: float) -> WindowResult:
    decisions = [
        Cancelled(id=c.id, index=start + i, document=c.text, reason=CANCELLED_REASON) for i, c in enumerate(candidates)
    ]
    return WindowResult(
        window=window,
        start=start,
        end=start + len(candidates),
        served_by=None,
        passthrough=False,
        attempts=0,
        committed_at=now,
        decisions=list(decisions),
        reason=CANCELLED_REASON,
    )


def open_windows(snapshot: Snapshot, candidates: list[Candidate], now: float) -> list[WindowResult]:
    """The cancelled result of every window not committed yet: the first stage's, and those a
    cascade's later stages were handed."""
    results = []
    for window in range(snapshot.n_windows):
        if window not in snapshot.results:
            start, end = snapshot.bounds(window)
            results.append(cancelled_result(window, start, candidates[start:end], now))
    for stage in snapshot.stage_windows()[1:]:
        handed = snapshot.handed.get(stage.number)
        if handed is None:
            continue
        for k in range(handed.windows):
            window = stage.first + k
            if window not in snapshot.results:
                members = handed.members[k * stage.window_size : (k + 1) * stage.window_size]
                result = cancelled_result(window, k * stage.window_size, [candidates[i] for i in members], now)
                decisions = [msgspec.structs.replace(d, index=i) for d, i in zip(result.decisions, members)]
                results.append(msgspec.structs.replace(result, decisions=decisions, stage=stage.number))
    return results


def cancel_stream(store: Store, fair_share: FairShare, dispatcher: Dispatcher, stream_id: str) -> CancelOutcome:
    # A cascade stage handed windows between the read and the write refuses the write: read again.
    for _ in range(STAGE_RACE_RETRIES):
        snapshot = store.snapshot(stream_id)
        candidates = store.load_candidates(stream_id, 0, snapshot.n_candidates) if not snapshot.complete else []
        try:
            written = store.cancel(stream_id, open_windows(snapshot, candidates, time.time()))
            break
        except StageHandedSince:
            continue
    else:
        raise StageHandedSince(stream_id)
    if written:
        try:
            released = fair_share.done(snapshot.device, [member(stream_id, w) for w in written])
            send_released(dispatcher, snapshot.device, released)
        except LEDGER_ERRORS as exc:
            log.warning(
                "fair_share_not_given_back",
                stream=stream_id,
                error=type(exc).__name__,
                recovery="the workers' sweep gives it back",
            )
    log.info("stream_cancelled", stream=stream_id, windows=len(written))
    return CancelOutcome(stream_id=stream_id, cancelled_windows=written, n_windows=snapshot.n_windows)
