"""Re-send windows that were admitted but not committed in time.

A Celery message on Redis can vanish between the broker fetch and the ack (a
worker's main process killed, a Redis restart that lost the last second of AOF),
and a producer can die between admitting a window and sending its message. The
stream's pending set still names every such window with a deadline, so re-sending
the overdue ones is enough to make every admitted window end committed. A
duplicate send is harmless: ``begin`` turns it away while a live attempt holds the
window, and ``commit`` writes a window only once.

Used by the workers' periodic sweep (``worker.sweep``) and by a reader whose wait
timed out (``RerankClient.pull``); it lives here because the producer never
imports the worker.
"""

from __future__ import annotations

import structlog

from producer.dispatch import Dispatcher
from producer.errors import StreamNotFound
from producer.store import Store

log = structlog.get_logger("rerankq.redelivery")


def resend_due(store: Store, dispatcher: Dispatcher, stream_ids: list[str], *, retry_in_s: float) -> int:
    """Claim and re-send every overdue window of these streams. Returns how many were sent."""
    sent = 0
    for stream_id, windows in store.due_windows_many(stream_ids, retry_in_s=retry_in_s).items():
        try:
            device = store.load_spec(stream_id).device
        except StreamNotFound:
            continue  # expired between the claim and now: nothing left to score
        dispatcher.send(stream_id, windows, device)
        sent += len(windows)
        log.warning("windows_redelivered", stream=stream_id, windows=windows)
    if sent:
        store.incr_counter("windows_redelivered", sent)
    return sent
