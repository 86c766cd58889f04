"""The Redis store: writes go through the one Lua script, reads are pipelined snapshots."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

import msgspec
import redis

from producer.errors import IdempotencyConflict, StreamNotFound
from producer.keys import Keys, StreamKeys
from producer.wire import (
    Candidate,
    StreamSpec,
    WindowResult,
    candidate_decoder,
    encode,
    spec_decoder,
    window_result_decoder,
)

_SCRIPT = resources.files("producer").joinpath("store.lua").read_text()


BLOCK_CHUNK_S = 5.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def connect(url: str) -> redis.Redis:
    """A client for ``redis://``, ``rediss://`` (TLS) or ``unix://`` URLs, with retries on blips."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=30,
        # Above the longest blocking read (BLOCK_CHUNK_S), so a wait is never cut short.
        socket_timeout=BLOCK_CHUNK_S + 10,
        socket_connect_timeout=5,
    )


class Snapshot(msgspec.Struct):
    """One consistent read of a stream: its results and the last event id."""

    n_candidates: int
    window_size: int
    admitted: int
    results: dict[int, WindowResult]
    last_event_id: bytes

    @property
    def n_windows(self) -> int:
        return -(-self.n_candidates // self.window_size)

    def bounds(self, window: int) -> tuple[int, int]:
        start = window * self.window_size
        return start, min(start + self.window_size, self.n_candidates)


class Store:
    def __init__(self, client: redis.Redis, namespace: str, *, event_log_maxlen: int = 1000) -> None:
        self.client = client
        self.keys = Keys(namespace)
        self.event_log_maxlen = event_log_maxlen
        self._script = client.register_script(_SCRIPT)

    def _run(self, stream: StreamKeys, command: str, *args: Any) -> Any:
        return self._script(keys=stream.all(), args=[command, _now_ms(), *args])

    # -- producer side -----------------------------------------------------

    def open(
        self,
        stream_id: str,
        spec: StreamSpec,
        candidates: list[Candidate],
        *,
        first_windows: int,
        enqueue_grace_s: float,
        fingerprint: str,
    ) -> tuple[bool, list[int]]:
        """Write a stream and admit its first windows in one step.

        Returns ``(created, admitted windows)``; a retried open with the same
        idempotency key and payload returns ``(False, [])``.
        """
        blobs = [encode(c) for c in candidates]
        spec_blob = encode(spec)
        expire_at = _now_ms() + spec.ttl_s * 1000
        deadline = _now_ms() + int(enqueue_grace_s * 1000)
        # The active index is how the sweep finds streams. It lives outside the stream's
        # hash slot (so not in the script), and is written first: an entry for a stream
        # whose open then failed is harmless (the sweep finds no meta and skips it), a
        # stream missing from the index would only be swept by its readers.
        self._index_active(stream_id, expire_at)
        reply = self._run(
            self.keys.stream(stream_id), "open", fingerprint, expire_at, spec_blob,
            spec.window_size, first_windows, deadline, *blobs,
        )
        if reply[0] == -1:
            raise IdempotencyConflict(stream_id.removeprefix("k_"))
        return reply[0] == 1, [int(w) for w in reply[1:]]

    def admit(self, stream_id: str, target_windows: int, *, enqueue_grace_s: float) -> list[int]:
        reply = self._run(
            self.keys.stream(stream_id), "admit", target_windows, _now_ms() + int(enqueue_grace_s * 1000)
        )
        if reply and reply[0] == -3:
            raise StreamNotFound(stream_id)
        return [int(w) for w in reply[1:]]

    def snapshot(self, stream_id: str) -> Snapshot:
        k = self.keys.stream(stream_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hmget(k.meta, "n", "window_size", "admitted")
        pipe.hgetall(k.results)
        pipe.xrevrange(k.events, count=1)
        meta, results, last = pipe.execute()
        if meta[0] is None:
            raise StreamNotFound(stream_id)
        return Snapshot(
            n_candidates=int(meta[0]),
            window_size=int(meta[1]),
            admitted=int(meta[2]),
            results={int(w): window_result_decoder.decode(v) for w, v in results.items()},
            last_event_id=last[0][0] if last else b"0-0",
        )

    def wait_for_commit(self, stream_id: str, after_id: bytes, timeout_s: float) -> bool:
        """Block on the stream's event log until a commit after ``after_id`` or the timeout."""
        if timeout_s <= 0:
            return False
        block_ms = max(1, int(min(timeout_s, BLOCK_CHUNK_S) * 1000))
        reply = self.client.xread({self.keys.stream(stream_id).events: after_id}, count=1, block=block_ms)
        return bool(reply)

    def attempts(self, stream_id: str) -> dict[int, int]:
        """Deliveries that started on each window (the hash also holds each window's lease)."""
        raw = self.client.hgetall(self.keys.stream(stream_id).attempts)
        return {int(w): int(n) for w, n in raw.items() if w.isdigit()}

    # -- worker side -------------------------------------------------------

    def load_spec(self, stream_id: str) -> StreamSpec:
        blob = self.client.get(self.keys.stream(stream_id).spec)
        if blob is None:
            raise StreamNotFound(stream_id)
        return spec_decoder.decode(blob)

    def load_candidates(self, stream_id: str, start: int, end: int) -> list[Candidate]:
        blobs = self.client.lrange(self.keys.stream(stream_id).candidates, start, end - 1)
        return [candidate_decoder.decode(b) for b in blobs]

    def begin(self, stream_id: str, window: int, *, work_deadline_s: float, delivery: str) -> int:
        """Count an attempt and take the window's lease for ``work_deadline_s``.

        Returns the attempt number, or -1 committed, -2 not admitted, -3 gone, -4 another
        delivery (``delivery`` is the Celery task id) holds a live lease.
        """
        return int(
            self._run(
                self.keys.stream(stream_id), "begin", window, _now_ms() + int(work_deadline_s * 1000), delivery
            )
        )

    def commit(self, stream_id: str, result: WindowResult) -> int:
        """Commit a window once. Returns 1 when written, 0 when already committed, -3 when gone."""
        return int(
            self._run(
                self.keys.stream(stream_id), "commit", result.window, encode(result), self.event_log_maxlen
            )
        )

    def due_windows(self, stream_id: str, *, retry_in_s: float) -> list[int]:
        """Windows past their deadline, claimed for re-sending: their deadline moves ``retry_in_s`` out."""
        return self.due_windows_many([stream_id], retry_in_s=retry_in_s).get(stream_id, [])

    def due_windows_many(self, stream_ids: list[str], *, retry_in_s: float) -> dict[str, list[int]]:
        """``due_windows`` for many streams in one round trip (each script call stays atomic)."""
        if not stream_ids:
            return {}
        retry_at = _now_ms() + int(retry_in_s * 1000)
        pipe = self.client.pipeline(transaction=False)
        for stream_id in stream_ids:
            self._script(keys=self.keys.stream(stream_id).all(), args=["due", _now_ms(), retry_at], client=pipe)
        replies = pipe.execute()
        return {s: [int(w) for w in reply] for s, reply in zip(stream_ids, replies) if reply}

    def _index_active(self, stream_id: str, expire_at: int) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(self.keys.active_streams, {stream_id: expire_at}, gt=True)
        # The index itself expires with its longest-lived stream (NX sets a first TTL,
        # GT only ever pushes it out), so an idle namespace leaves nothing behind.
        pipe.pexpireat(self.keys.active_streams, expire_at, nx=True)
        pipe.pexpireat(self.keys.active_streams, expire_at, gt=True)
        pipe.execute()

    def active_streams(self) -> list[str]:
        """Live stream ids; expired ones are pruned from the index as a side effect."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zremrangebyscore(self.keys.active_streams, "-inf", _now_ms())
        pipe.zrange(self.keys.active_streams, 0, -1)
        _, live = pipe.execute()
        return [s.decode() for s in live]

    def try_sweep_lock(self, hold_s: float) -> bool:
        """One sweeper per interval across all workers: the lock is never released, it expires."""
        return bool(self.client.set(self.keys.sweep_lock, "1", nx=True, px=max(1, int(hold_s * 1000))))

    def incr_counter(self, name: str, amount: int = 1) -> None:
        self.client.hincrby(self.keys.counters, name, amount)

    def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.counters).items()}
