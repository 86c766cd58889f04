"""What each worker process tells an operator: its device and chain members, with model,
precision and breaker.

Celery's remote control reaches a worker's main process only, and a prefork worker's model
lives in its pool processes. So every process that builds a runtime writes a card to Redis:
one hash per worker (its Celery hostname), one field per process. ``rerankq inspect`` reads
the cards of the workers that answer remote control. The hash expires ``CARD_TTL_S`` after
its last write; the worker's main process keeps it alive and drops the fields of processes
that are gone, so a dead worker's card leaves within the TTL.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis
import structlog

from kernel import consumers
from kernel.settings import DEFAULT_MODEL, Settings
from kernel.store import Store, connect
from worker.scoring.calibration import calibration_identity

log = structlog.get_logger("rerankq.card")

CARD_TTL_S = 120
CARD_REFRESH_S = 30.0

#: The worker's Celery hostname, learnt in the main process (celeryd_init) and inherited by
#: its forked pool processes.
_hostname: str | None = None


def set_hostname(hostname: str) -> None:
    global _hostname
    _hostname = hostname


def hostname() -> str | None:
    return _hostname


def describe(runtime: Any) -> dict[str, Any]:
    """This process's card: its device, and per chain member what it runs and whether it started."""
    members = []
    for member in runtime.chain.members:
        engine = getattr(member.checked, "engine", None) if member.checked is not None else None
        model = member.settings.model or (DEFAULT_MODEL if member.settings.provider == "local" else None)
        members.append(
            {
                "label": member.label,
                "provider": member.settings.provider,
                "model": model,
                "precision": getattr(engine, "precision", None),
                "started": member.started,
                # What its scores depend on besides the pair: what a calibration map is fitted for.
                "identity": calibration_identity(member.identity) if member.identity else None,
                # Only a remote member goes through the shared breaker.
                "breaker": member.breaker_id if member.remote else None,
            }
        )
    return {
        "pid": os.getpid(),
        "device": runtime.settings.worker.device,
        "members": members,
        "at": round(time.time(), 3),
    }


def publish(store: Store, name: str, card: dict[str, Any]) -> None:
    """Write this process's card; an operator aid, so a Redis error is logged, never raised."""
    key = store.keys.worker_card(name)
    try:
        pipe = store.client.pipeline(transaction=True)
        pipe.hset(key, str(card["pid"]), json.dumps(card, sort_keys=True))
        pipe.expire(key, CARD_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("worker_card_not_written", error=type(exc).__name__)


#: The card hash's field for the queues the worker consumes (the others are pids).
QUEUES_FIELD = "queues"


def read_cards(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The processes' cards (the fields named by a pid)."""
    cards = []
    for field, raw in client.hgetall(key).items():
        if not field.isdigit():
            continue
        try:
            cards.append(json.loads(raw))
        except ValueError:
            continue
    return cards


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CardKeeper:
    """In the worker's main process: keeps its card hash alive, drops processes that are gone, and
    says which queues it consumes (in its card, and in ``kernel.consumers``' registry, which a
    producer reads to warn that no worker serves a stream's device)."""

    def __init__(self, settings: Settings, name: str, queues: list[str] | None = None) -> None:
        self.settings = settings
        self.name = name
        self.queues = sorted(set(queues or []))
        self._stop = threading.Event()

    def start(self) -> CardKeeper:
        threading.Thread(target=self._run, name="rerankq-card", daemon=True).start()
        return self

    def request_stop(self) -> None:
        self._stop.set()

    def _announce(self, store: Store, key: str) -> None:
        if not self.queues:
            return
        pipe = store.client.pipeline(transaction=True)
        pipe.hset(key, QUEUES_FIELD, json.dumps(self.queues))
        pipe.expire(key, CARD_TTL_S)
        pipe.execute()
        consumers.record(store.client, store.keys, self.name, self.queues)

    def _run(self) -> None:
        store = Store(
            connect(self.settings.store.redis_url or self.settings.store.broker), self.settings.store.namespace
        )
        key = store.keys.worker_card(self.name)
        try:
            try:
                self._announce(store, key)
            except redis.RedisError as exc:
                log.warning("worker_card_not_written", error=type(exc).__name__)
            while not self._stop.wait(CARD_REFRESH_S):
                try:
                    gone = [pid for pid in store.client.hkeys(key) if pid.isdigit() and not _alive(int(pid))]
                    if gone:
                        store.client.hdel(key, *gone)
                    store.client.expire(key, CARD_TTL_S)
                    self._announce(store, key)
                except redis.RedisError as exc:
                    log.warning("worker_card_not_refreshed", error=type(exc).__name__)
            try:
                consumers.forget(store.client, store.keys, self.name, self.queues)
            except redis.RedisError:
                pass  # then it leaves the registry when its last write ages out
        finally:
            store.client.close()
