"""Readers: open streams and pull them page by page, as pipelines do, through every restart.

They only open and read. An open is retried with its idempotency key until it succeeds
or gives up (a violation); a pull is retried the same way. Every attempted open and the
digest of every window's stored result, as first read, go into the ledger the audit
checks at the end. Nothing here sends a message or touches a window's state: recovering
a lost message is the workers' sweep's job alone.
"""

from __future__ import annotations

import functools
import hashlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError

from kernel.errors import StoreFull, StoreUnavailable, StreamNotFound
from kernel.windows import window_count
from producer import RerankClient

T = TypeVar("T")

WINDOW_SIZE = 10
#: What a restart looks like to a client; anything else is a real error and is raised.
TRANSIENT = (StoreUnavailable, StoreFull, redis.ConnectionError, redis.TimeoutError, OperationalError, OSError)


class GaveUp(Exception):
    """Redis did not come back within the give-up time."""


def retrying(call: Callable[[], T], *, give_up_s: float) -> T:
    deadline = time.monotonic() + give_up_s
    while True:
        try:
            return call()
        except TRANSIENT as exc:
            if time.monotonic() > deadline:
                raise GaveUp(type(exc).__name__) from exc
            time.sleep(0.2)


def digest(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


@dataclass
class OpenAttempt:
    key: str
    size: int
    acknowledged: bool = False
    gave_up: str | None = None
    #: A cascade's second stage: how many of the first stage's best it re-reads (in one window).
    second_keep: int | None = None

    @property
    def stream_id(self) -> str:
        return "k_" + self.key

    @property
    def n_windows(self) -> int:
        """Every window the stream commits: the first stage's, and a second stage's one window
        over the first stage's best (no filter runs here, so the first stage shows every row)."""
        return window_count(self.size, WINDOW_SIZE) + (1 if self.second_keep else 0)

    def stage_options(self) -> dict[str, object]:
        return {"stages": [{}, {"keep": self.second_keep}]} if self.second_keep else {}


class Ledger:
    """What the readers saw, shared by their threads, the chaos loop and the audit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.opens: dict[str, OpenAttempt] = {}
        #: (stream, window) -> digest of its stored result when a reader first read it.
        self.first_read: dict[tuple[str, int], str] = {}
        #: Streams a reader found gone after their open was acknowledged.
        self.vanished: set[str] = set()

    def attempt(self, key: str, size: int, second_keep: int | None = None) -> OpenAttempt:
        with self.lock:
            self.opens[key] = OpenAttempt(key, size, second_keep=second_keep)
            return self.opens[key]

    def read(self, stream_id: str, results: dict[bytes, bytes]) -> None:
        with self.lock:
            for window, blob in results.items():
                self.first_read.setdefault((stream_id, int(window)), digest(blob))

    def committed(self) -> list[tuple[str, int]]:
        with self.lock:
            return list(self.first_read)


def stored_results(client: RerankClient, stream_id: str) -> dict[bytes, bytes]:
    """The stream's committed results, as stored (the bytes a digest is taken of)."""
    return client.store.client.hgetall(client.store.keys.stream(stream_id).results)


def candidates_for(key: str, size: int) -> list[dict[str, str]]:
    # A function of the key alone: a retried open is the same job.
    return [{"id": f"c{i}", "text": f"payment gateway error number {i} {key}"} for i in range(size)]


def read_streams(
    client: RerankClient, ledger: Ledger, rng: random.Random, index: int, until: float, *, give_up_s: float
) -> None:
    """Open streams and pull each page by page until ``until``; later windows are admitted by the pulls."""
    n = 0
    while time.monotonic() < until:
        key = f"r{index}-{n}"
        n += 1
        # A third of the streams are cascades: the whole chain again over the first stage's best,
        # handed over by a commit that a kill or a restart may cut short.
        attempt = ledger.attempt(
            key, rng.randint(WINDOW_SIZE, 8 * WINDOW_SIZE), second_keep=rng.choice([None, None, 5, WINDOW_SIZE])
        )
        # Some streams ask for every window up front: bursts keep messages waiting in the queue.
        first_windows = rng.choice([1, 1, 2, attempt.n_windows])
        try:
            opening = functools.partial(
                client.open,
                "payment gateway error",
                candidates_for(key, attempt.size),
                window_size=WINDOW_SIZE,
                first_windows=first_windows,
                idempotency_key=key,
                allow_shallow=True,
                **attempt.stage_options(),
            )
            stream = retrying(opening, give_up_s=give_up_s)
        except GaveUp as exc:
            attempt.gave_up = str(exc)
            continue
        attempt.acknowledged = True
        offset = 0
        while offset < attempt.size and time.monotonic() < until:
            try:
                page = retrying(
                    lambda stream=stream, offset=offset: client.pull(stream, offset, WINDOW_SIZE, timeout=2.0),
                    give_up_s=give_up_s,
                )
                ledger.read(stream, retrying(lambda stream=stream: stored_results(client, stream), give_up_s=give_up_s))
            except StreamNotFound:
                with ledger.lock:
                    ledger.vanished.add(stream)
                break
            except GaveUp:
                break  # the audit reads every stream whole at the end
            offset += len(page.rows)
            if page.complete:
                break
