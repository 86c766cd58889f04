"""Each tenant's fair share of a device queue, counted by cost.

A tenant may have ``RERANKQ_TENANT_QUEUED_WINDOWS`` windows, and ``RERANKQ_TENANT_QUEUED_TOKENS``
of their cost (``kernel.cost``), sent to a device queue's lane and not yet committed; a
window past that is not sent but waits in Redis, behind the tenant's earlier waiting windows.
When a window commits, its share comes back and the waiting windows that now fit are released,
one per tenant per turn, round robin over the tenants that have any waiting; the worker that
committed sends them. So the queue holds at most a share of each tenant, and a tenant's window
waits behind at most the other tenants' shares and what is running, however deep anyone's
backlog is. A tenant with nothing queued may always send one window, so a window costlier than
the whole share still runs, alone.

The bucket a window is counted in is its stream's tenant and lane (a tenant's batch work never
holds back its own interactive calls: the batch lane already waits behind them); a stream
without a tenant is a bucket of its own, so a pipeline that uses ``RerankClient`` directly
(or a gateway without keys, where callers cannot be told apart) is bounded per stream.

Every change to the ledger is one ``store.lua`` call on the device's keys (``Keys.fair_share``:
one hash tag, so on a Redis Cluster every call stays on one slot). A stream's own keys live on
another slot, so admitting a window and entering it, or committing it and giving its share back,
are two calls; a process that dies between them leaves what the sweep repairs
(``worker.sweep``): a window released but never sent is pending like any other and re-sent once
overdue; a share never given back (its window committed, or its stream expired) is found by the
sweep, which reads each entry's window, and given back; and the sweep releases what fits every
interval, so nothing waits on a commit that already happened.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

import msgspec
import redis

from kernel.dispatch import Dispatcher
from kernel.keys import FairShareKeys
from kernel.settings import Settings
from kernel.store import Admitted, Store
from kernel.wire import Lane


class Released(msgspec.Struct, frozen=True):
    """A window the ledger let go: its message is the releaser's to send."""

    stream_id: str
    window: int
    lane: Lane


def bucket_for(tenant: str | None, lane: Lane, stream_id: str) -> str:
    """Whose share a stream's windows count against: its tenant's in its lane, or its own."""
    return f"{tenant}/{lane}" if tenant is not None else f"~{stream_id}"


def member(stream_id: str, window: int) -> str:
    return f"{stream_id}:{window}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_released(reply: Sequence[Any]) -> list[Released]:
    """``fair_done`` / ``fair_release``'s reply: (member, lane) pairs."""
    out = []
    for name, lane in zip(reply[0::2], reply[1::2]):
        stream_id, _, window = _text(name).rpartition(":")
        # The lane was written by fair_enter from a stream's validated lane.
        out.append(Released(stream_id=stream_id, window=int(window), lane=cast(Lane, _text(lane))))
    return out


class FairShare:
    """The device queues' ledgers, through the store's script."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.bounds = (settings.fairness.tenant_queued_windows, settings.fairness.tenant_queued_tokens)

    def ledger(self, device: str) -> FairShareKeys:
        return self.store.keys.fair_share(device)

    def _run(self, device: str, command: str, *args: Any) -> Any:
        return self.store.run_ledger(self.ledger(device), command, *self.bounds, *args)

    def enter(
        self,
        stream_id: str,
        *,
        device: str,
        bucket: str,
        lane: str,
        expire_at_ms: int,
        windows: Sequence[int],
        costs: Sequence[int],
    ) -> list[int]:
        """Count newly admitted windows against their bucket's share; returns those to send now
        (the others wait in Redis until the ledger releases them)."""
        if not windows:
            return []
        pairs = [value for window, cost in zip(windows, costs) for value in (window, max(0, int(cost)))]
        reply = self._run(device, "fair_enter", bucket, stream_id, expire_at_ms, lane, *pairs)
        return [int(w) for w in reply]

    def enter_admitted(self, stream_id: str, device: str, admitted: Admitted) -> list[int]:
        """``enter`` for what an admit (or a commit that admitted) answered; a stream opened
        before buckets were kept is unshared: every window goes."""
        if not admitted.bucket:
            return admitted.windows
        return self.enter(
            stream_id,
            device=device,
            bucket=admitted.bucket,
            lane=admitted.lane,
            expire_at_ms=admitted.expire_at_ms,
            windows=admitted.windows,
            costs=admitted.costs,
        )

    def done(self, device: str, members: Iterable[str]) -> list[Released]:
        """Give back the share of windows done with (committed, or gone); returns what that released."""
        names = list(members)
        return parse_released(self.done_reply(device, names)) if names else []

    def done_reply(self, device: str, members: Sequence[str]) -> Any:
        """``done``'s raw reply, for ``parse_released``."""
        return self._run(device, "fair_done", *members)

    def queue_done(self, pipe: Any, device: str, members: Sequence[str]) -> None:
        """``done`` queued on a pipeline (the commit's round trip); its reply goes to ``parse_released``."""
        self.store.queue_ledger(pipe, self.ledger(device), "fair_done", *self.bounds, *members)

    def release(self, device: str) -> list[Released]:
        """Release whatever fits now (the sweep's backstop)."""
        return parse_released(self._run(device, "fair_release"))

    def deferred(self, device: str, members: Sequence[str]) -> set[str]:
        """Which of ``members`` are waiting in the ledger (not to be sent by anyone but it)."""
        if not members:
            return set()
        reply = self._run(device, "fair_deferred", *members)
        return {name for name, flag in zip(members, reply) if int(flag)}

    def in_flight(self, device: str) -> dict[str, int]:
        """Every window counted as sent and not done, with its stream's expiry (ms)."""
        raw = self.store.client.hgetall(self.ledger(device).inflight)
        return {_text(name): int(_text(entry).split(" ")[2]) for name, entry in raw.items()}

    def stale(self, device: str) -> list[str]:
        """The windows counted as in flight whose share was never given back: committed, or of a
        stream that expired or is gone."""
        entries = self.in_flight(device)
        if not entries:
            return []
        now = int(time.time() * 1000)
        names = list(entries)
        pipe = self.store.client.pipeline(transaction=False)
        for name in names:
            stream_id, _, window = name.rpartition(":")
            keys = self.store.keys.stream(stream_id)
            pipe.hexists(keys.results, window)
            pipe.exists(keys.meta)
        replies = pipe.execute()
        return [
            name
            for name, committed, exists in zip(names, replies[0::2], replies[1::2])
            if committed or not exists or entries[name] <= now
        ]


def send_released(dispatcher: Dispatcher, device: str, released: Sequence[Released]) -> None:
    """Send the released windows, a message each, to their device queue in their stream's lane."""
    by_stream: dict[tuple[str, Lane], list[int]] = {}
    for item in released:
        by_stream.setdefault((item.stream_id, item.lane), []).append(item.window)
    for (stream_id, lane), windows in by_stream.items():
        dispatcher.send(stream_id, windows, device, lane)


#: What a ledger call can meet: Redis down, restarting or full.
LEDGER_ERRORS = (redis.RedisError, OSError)
