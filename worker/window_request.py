"""The window task's request in the worker's main process: it tells the store when an attempt ended.

An attempt counts against a window (``RERANKQ_MAX_ATTEMPTS``, then ``poison``) only when the
window's own work failed. ``begin`` counts one for each delivery it lets run, and lets a
delivery run only when no live lease holds the window, so a copy of a running message (anyone
who can write to the queue can replay one) is turned away uncounted. What ends a lease early is
the main process, which sees how each attempt ended (Celery calls these handlers there):

- its pool process died (OOM, a segfault, SIGKILL), or the worker's own time limit killed it:
  the window's own work failed; the attempt stands and the lease ends, so the message Celery
  puts back begins at once (and counts);
- the worker cancelled it (a soft shutdown, a lost broker connection): not the window's doing;
  the attempt is given back and the lease ends.

A worker that dies whole tells nothing: its windows are taken over once their leases run out
(``RERANKQ_REDELIVER_AFTER_S``), counted. A time limit other than the worker's own never runs:
the door refuses any ``timelimit`` header but rerankq's ``[null, null]``.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog
from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import WorkerLostError
from celery.worker.request import Request

from kernel.redis_clients import UNAVAILABLE_ERRORS, health_client
from kernel.store import Store

log = structlog.get_logger("rerankq.window")

_stores: dict[str, Store] = {}
_lock = threading.Lock()


def _store(app: Any) -> Store | None:
    settings = getattr(app, "rerankq_settings", None)
    if settings is None:
        return None
    url = settings.store.redis_url or settings.store.broker
    with _lock:
        if url not in _stores:
            # Calls that give up quickly: this runs in the consumer's loop, and a store that
            # does not answer costs the window no more than its lease (it is taken over then).
            _stores[url] = Store(health_client(url), settings.store.namespace)
        return _stores[url]


class WindowRequest(Request):  # type: ignore[misc]  # Celery's, unannotated
    def _release(self, *, refund: bool, why: str) -> None:
        args = self.args
        if not (isinstance(args, (list, tuple)) and len(args) == 2):
            return
        stream_id, window = args
        store = _store(self.app)
        if store is None:
            return
        try:
            store.release(stream_id, window, delivery=str(self.id), refund=refund)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("window_lease_not_released", stream=stream_id, window=window, why=why, error=type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - never let a store error reach Celery's loop
            log.warning("window_lease_not_released", stream=stream_id, window=window, why=why, error=repr(exc)[:200])

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        if not soft:
            self._release(refund=False, why="time limit")
        return super().on_timeout(soft, timeout)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        # Celery reads SystemExit / KeyboardInterrupt it did not cause as a lost pool process too.
        lost = isinstance(exc, WorkerLostError) or (
            isinstance(exc, (SystemExit, KeyboardInterrupt)) and not (self._already_cancelled or self._already_revoked)
        )
        if lost:
            self._release(refund=False, why="pool process lost")
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> Any:
        if self.time_start:
            self._release(refund=True, why="cancelled")
        return super().cancel(pool, signal=signal, emit_retry=emit_retry)
