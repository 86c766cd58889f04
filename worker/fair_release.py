"""A committed window's share of its device queue, given back, and the windows that released sent.

The ledger (``kernel.fair_share``) counts a window against its tenant's share from the moment
it is sent until it is done with; a worker that commits it gives the share back and sends, in
their streams' lanes, the waiting windows that now fit. Neither step can lose a window: a share
not given back (Redis down, the process killed) is found and given back by the sweep, and a
released window whose message is not sent is pending like any other, so the sweep sends it once
overdue.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.exceptions import OperationalError

from kernel.dispatch import Dispatcher
from kernel.fair_share import LEDGER_ERRORS, FairShare, Released, member, parse_released, send_released
from kernel.settings import Settings
from kernel.store import Admitted, Store
from worker.side_writes import SideWrite

SEND_ERRORS = (redis.RedisError, OperationalError, OSError)


class ShareReturn:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.fair_share = FairShare(store, settings)
        self._dispatcher: Dispatcher | None = None

    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            self._dispatcher = Dispatcher(self.settings)
        return self._dispatcher

    def after_commit(self, device: str, stream_id: str, window: int, released: list[Released]) -> SideWrite:
        """Giving the window's share back, as a write that rides behind its commit in the commit's
        round trip; what it releases lands in ``released``, for ``send`` once the commit is back."""
        names = [member(stream_id, window)]
        return SideWrite(
            queue=lambda pipe: self.fair_share.queue_done(pipe, device, names),
            run=lambda: self.fair_share.done_reply(device, names),
            done=lambda reply: released.extend(parse_released(reply)),
        )

    def send_admitted(self, device: str, stream_id: str, admitted: Admitted, bound: Any) -> None:
        """Send what a commit admitted (a cascade's next stage), within the stream's fair share:
        a window that does not fit waits in the ledger; one not sent is pending, the sweep's."""
        if not admitted.windows:
            return
        try:
            now = self.fair_share.enter_admitted(stream_id, device, admitted)
        except LEDGER_ERRORS as exc:
            bound.warning("fair_share_unavailable", error=type(exc).__name__, sent=admitted.windows)
            now = admitted.windows
        try:
            if now:
                self.dispatcher().send(stream_id, now, device, admitted.lane)
        except SEND_ERRORS as exc:
            bound.warning("windows_not_sent", windows=now, error=type(exc).__name__, recovery="the sweep")
            return
        bound.info("windows_admitted", windows=admitted.windows, sent=now)

    def send(self, device: str, released: list[Released], bound: Any) -> None:
        if not released:
            return
        names = [member(r.stream_id, r.window) for r in released]
        try:
            send_released(self.dispatcher(), device, released)
        except SEND_ERRORS as exc:
            bound.warning("released_windows_not_sent", windows=names, error=type(exc).__name__, recovery="the sweep")
            return
        bound.info("windows_released", windows=names)

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()
