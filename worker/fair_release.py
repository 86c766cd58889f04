"""A committed window's share of its device queue, given back, and the windows that released sent.

The ledger (``producer.fair_share``) counts a window against its tenant's share from the moment
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

from producer.dispatch import Dispatcher
from producer.fair_share import LEDGER_ERRORS, FairShare, Released, member, send_released
from producer.settings import Settings
from producer.store import Store

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

    def window_done(self, device: str, stream_id: str, window: int, bound: Any) -> None:
        try:
            released = self.fair_share.done(device, [member(stream_id, window)])
        except LEDGER_ERRORS as exc:
            bound.warning("fair_share_not_given_back", error=type(exc).__name__, recovery="the sweep gives it back")
            return
        self.send(device, released, bound)

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
