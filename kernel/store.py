"""The Redis store: writes go through the one Lua script, reads are pipelined snapshots."""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib import resources
from typing import Any, cast

import msgspec
import redis
import redis.cluster
from redis.typing import EncodableT

from kernel.errors import IdempotencyConflict, StreamCorrupted, StreamNotFound
from kernel.keys import FairShareKeys, Keys, StreamKeys
from kernel.limits import MAX_STAGES
from kernel.redis_clients import BLOCK_CHUNK_S as BLOCK_CHUNK_S
from kernel.redis_clients import MIN_REDIS_VERSION as MIN_REDIS_VERSION
from kernel.redis_clients import server_version as server_version
from kernel.redis_clients import store_client
from kernel.windows import StageWindows, stage_windows, window_count
from kernel.wire import (
    Candidate,
    Device,
    Lane,
    StreamProgress,
    StreamSpec,
    WindowEmbeddings,
    WindowResult,
    candidate_decoder,
    encode,
    spec_decoder,
    window_embeddings_decoder,
    window_result_decoder,
)

_SCRIPT = resources.files("kernel").joinpath("store.lua").read_text()

#: ``begin`` and ``commit`` codes, as ``store.lua`` returns them.
ALREADY_COMMITTED, NOT_ADMITTED, GONE, HELD_ELSEWHERE, NO_SUCH_WINDOW = -1, -2, -3, -4, -5
#: ``cancel``'s: a cascade stage was handed windows since the caller read the stream.
STAGE_HANDED_SINCE = -6

#: The meta fields a snapshot reads of each later stage of a cascade (``store.lua``).
_STAGE_FIELDS = ("handed", "members", "stopped", "handed_at")
_LATER_STAGE_NUMBERS = range(2, MAX_STAGES + 1)


def stage_layout(spec: StreamSpec) -> str:
    """A cascade's later stages as ``store.lua`` keeps them: ``first:slots:size:keep:max_pairs:
    max_tokens`` each (0: no budget), ``;`` apart; empty for a stream of one stage."""
    windows = spec.stage_windows()[1:]
    return ";".join(
        f"{w.first}:{w.slots}:{w.window_size}:{s.keep}:{s.max_pairs or 0}:{s.max_tokens or 0}"
        for w, s in zip(windows, spec.later_stages)
    )


class HandedStage(msgspec.Struct):
    """What a later stage of a cascade was handed: the candidate indexes it reads, in the
    previous stage's order, and its windows; ``stopped``: the budget that cut it short."""

    members: list[int]
    windows: int
    handed_at_ms: int
    stopped: str | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


#: The store's client for any URL rerankq takes (``kernel.redis_clients``).
connect = store_client


class Snapshot(msgspec.Struct):
    """One consistent read of a stream: its results and the last event id."""

    n_candidates: int
    window_size: int
    admitted: int
    results: dict[int, WindowResult]
    last_event_id: bytes
    device: Device = "cpu"
    lane: Lane = "interactive"
    #: A cascade's later stages as open laid them out (``(keep, window_size)`` each), what each
    #: was handed so far (by stage number), and whether the stream was cancelled.
    later_stages: list[tuple[int, int]] = []
    handed: dict[int, HandedStage] = {}
    cancelled: bool = False
    #: Each stage's chain profile, first to last (None: the whole chain).
    stage_chains: list[str | None] = []

    @property
    def n_windows(self) -> int:
        """The first stage's windows: the stream's own, over its candidates."""
        return window_count(self.n_candidates, self.window_size)

    def stage_windows(self) -> list[StageWindows]:
        return stage_windows(self.n_candidates, self.window_size, self.later_stages)

    @property
    def complete(self) -> bool:
        """Every window committed: the first stage's, and every later stage's, each once handed
        (a cancelled stream hands nothing more)."""
        if any(w not in self.results for w in range(self.n_windows)):
            return False
        for stage in self.stage_windows()[1:]:
            handed = self.handed.get(stage.number)
            if handed is None:
                if not self.cancelled:
                    return False
                continue
            if any(w not in self.results for w in range(stage.first, stage.first + handed.windows)):
                return False
        return True

    def bounds(self, window: int) -> tuple[int, int]:
        start = window * self.window_size
        return start, min(start + self.window_size, self.n_candidates)


class DueWindows(msgspec.Struct):
    """A stream's overdue windows, claimed by the sweep, with where their messages go."""

    device: str
    lane: str
    windows: list[int]
    #: Overdue windows left alone because their queued mark was trusted (``trust_queued_s``).
    held: int = 0


class Admitted(msgspec.Struct):
    """Windows a deeper admit took in, each one's cost, and the stream's fair-share bucket
    (empty for a stream opened before buckets were kept) and expiry."""

    windows: list[int]
    costs: list[int]
    bucket: str
    expire_at_ms: int
    #: The stream's lane (a commit's admissions say it; a producer's admit knows it already).
    lane: Lane = "interactive"


class Begun(msgspec.Struct):
    """A delivery's start on a window: the attempt number, when the window was admitted
    (epoch milliseconds by the admitting client's clock; 0 if unknown) and its raw data.
    ``indexes``: a cascade's later-stage window's candidate indexes (empty for a first-stage
    window, whose candidates follow on from ``window * window_size``)."""

    attempt: int
    spec: bytes
    candidates: list[bytes]
    admitted_at_ms: int = 0
    indexes: list[int] = []


class Commit(msgspec.Struct):
    """A commit's answer: 1 written, 0 already committed, or a negative code; and the windows it
    admitted (a cascade's next stage handed its rows, or a first-stage window that stage needs),
    for the committer to send."""

    code: int
    admitted: Admitted | None = None


# The client is made without decode_responses, so its replies are bytes; redis-py's types say
# bytes | str (they cannot know), hence the casts on the replies that are decoded.
class Store:
    def __init__(self, client: redis.Redis, namespace: str, *, event_log_maxlen: int = 1000) -> None:
        self.client = client
        self.keys = Keys(namespace)
        self.event_log_maxlen = event_log_maxlen
        self._script = client.register_script(_SCRIPT)
        # redis-py's cluster pipeline refuses scripts: the sweep's batched calls go per node.
        self._cluster = isinstance(client, redis.cluster.RedisCluster)

    def _run(self, stream: StreamKeys, command: str, *args: Any, client: Any = None) -> Any:
        return self._script(keys=stream.all(), args=[command, _now_ms(), *args], client=client)

    def run_ledger(self, ledger: FairShareKeys, command: str, *args: Any) -> Any:
        """One of ``store.lua``'s fair-share commands on a device's ledger (``kernel.fair_share``)."""
        return self._script(keys=ledger.all(), args=[command, _now_ms(), *args])

    def queue_ledger(self, pipe: Any, ledger: FairShareKeys, command: str, *args: Any) -> None:
        """``run_ledger`` queued on a pipeline as a bare EVALSHA (a registered script would cost
        the pipeline a SCRIPT EXISTS round trip); a Redis that lost the script answers
        NoScriptError, and the caller runs it again with ``run_ledger``."""
        keys = ledger.all()
        pipe.evalsha(self._script.sha, len(keys), *keys, command, _now_ms(), *args)

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
        lane: Lane = "interactive",
        bucket: str = "",
        costs: Sequence[int] = (),
        candidate_tokens: Sequence[int] = (),
        candidate_pairs: Sequence[int] = (),
    ) -> tuple[bool, list[int]]:
        """Write a stream, index it and admit its first windows, in one script call. ``bucket``
        (its fair-share bucket) and ``costs`` (each window's) are kept for its later admits;
        a cascade's ``candidate_tokens`` and ``candidate_pairs`` (each candidate's) for its later
        stages' windows and budgets.

        Returns ``(created, admitted windows)``; a retried open with the same idempotency
        key and payload returns ``(False, [])`` and writes nothing.
        """
        blobs = [encode(c) for c in candidates]
        staged = bool(spec.later_stages)
        now = _now_ms()
        expire_at = now + spec.ttl_s * 1000
        deadline = now + int(enqueue_grace_s * 1000)
        reply = self._run(
            self.keys.stream(stream_id),
            "open",
            stream_id,
            fingerprint,
            expire_at,
            encode(spec),
            spec.window_size,
            first_windows,
            deadline,
            spec.device,
            lane,
            bucket,
            ",".join(str(int(c)) for c in costs),
            stage_layout(spec),
            ",".join(str(int(c)) for c in candidate_tokens) if staged else "",
            ",".join(str(int(p)) for p in candidate_pairs) if staged else "",
            ",".join(c or "" for c in (spec.chain, *(s.chain for s in spec.later_stages))) if staged else "",
            *blobs,
        )
        if reply[0] == -1:
            raise IdempotencyConflict(stream_id.removeprefix("k_"))
        return reply[0] == 1, [int(w) for w in reply[1:]]

    def admit(self, stream_id: str, target_windows: int, *, enqueue_grace_s: float) -> Admitted:
        """Admit windows up to ``target_windows``; returns the new ones with what fair share needs."""
        reply = self._run(self.keys.stream(stream_id), "admit", target_windows, _now_ms() + int(enqueue_grace_s * 1000))
        if reply and reply[0] == GONE:
            raise StreamNotFound(stream_id)
        pairs = reply[3:]
        return Admitted(
            windows=[int(w) for w in pairs[0::2]],
            costs=[int(c) for c in pairs[1::2]],
            bucket=reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1]),
            expire_at_ms=int(reply[2]),
        )

    def hurry(self, stream_id: str, windows: list[int]) -> None:
        """Make admitted windows due now: their message could not be sent, so the sweep sends it."""
        if windows:
            self._run(self.keys.stream(stream_id), "hurry", *windows)

    def cancel(self, stream_id: str, results: Sequence[WindowResult]) -> list[int]:
        """Commit each of ``results`` (the cancelled windows) unless its window is committed
        already, all in one script call; returns the windows it committed."""
        args: list[EncodableT] = [self.event_log_maxlen]
        for result in results:
            args += [result.window, encode(result)]
        reply = self._run(self.keys.stream(stream_id), "cancel", *args)
        if reply[0] == GONE:
            raise StreamNotFound(stream_id)
        if reply[0] == STAGE_HANDED_SINCE:
            raise StageHandedSince(stream_id)
        return [int(w) for w in reply[1:]]

    def snapshot(self, stream_id: str) -> Snapshot:
        # No MULTI: at maxmemory Redis refuses every command queued in one, reads included,
        # and a reader must still read a full Redis.
        pipe = self.client.pipeline(transaction=False)
        self.queue_snapshot(pipe, stream_id)
        return self.parse_snapshot(stream_id, pipe.execute())

    def queue_snapshot(self, pipe: Any, stream_id: str) -> None:
        """Queue a snapshot's reads on a pipeline (redis-py's, or redis.asyncio's for the gateway).

        The order keeps it consistent enough: the last event is read first, so any commit the
        results miss comes after it and wakes a wait on the log at once.
        """
        k = self.keys.stream(stream_id)
        pipe.xrevrange(k.events, count=1)
        pipe.hmget(k.meta, *_SNAPSHOT_FIELDS)
        pipe.hgetall(k.results)

    @staticmethod
    def parse_snapshot(stream_id: str, replies: list[Any]) -> Snapshot:
        """The Snapshot from the replies of ``queue_snapshot``'s commands."""
        last, meta, results = replies
        if meta[0] is None:
            raise StreamNotFound(stream_id)
        try:
            decoded = {int(w): window_result_decoder.decode(v) for w, v in results.items()}
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise StreamCorrupted(stream_id, f"a committed window: {exc}") from None
        later, handed = _parse_stages(meta[5], meta[8:])
        return Snapshot(
            later_stages=later,
            handed=handed,
            cancelled=meta[6] is not None,
            stage_chains=[c or None for c in meta[7].decode().split(",")] if meta[7] is not None else [],
            n_candidates=int(meta[0]),
            window_size=int(meta[1]),
            admitted=int(meta[2]),
            results=decoded,
            last_event_id=last[0][0] if last else b"0-0",
            # Written by open from the validated spec: one of the literals.
            device=cast(Device, meta[3].decode()) if meta[3] else "cpu",
            lane=cast(Lane, meta[4].decode()) if meta[4] else "interactive",
        )

    def progress(self, stream_ids: list[str]) -> list[StreamProgress | None]:
        """Each stream's progress from its meta alone, in one round trip; None for a stream
        that does not exist (never opened, or expired)."""
        pipe = self.client.pipeline(transaction=False)
        for stream_id in stream_ids:
            pipe.hmget(self.keys.stream(stream_id).meta, *PROGRESS_FIELDS)
        return [parse_progress(stream_id, meta) for stream_id, meta in zip(stream_ids, pipe.execute())]

    def wait_and_snapshot(self, stream_id: str, after_id: bytes, timeout_s: float) -> Snapshot:
        """Block on the stream's event log until a commit after ``after_id`` or the timeout, then
        read a snapshot: one round trip. Redis runs a connection's pipelined commands in order
        and a blocked command holds back the ones behind it, so the reads run once the wait ends,
        as a snapshot taken after ``wait_for_commit`` returned would."""
        if timeout_s <= 0:
            return self.snapshot(stream_id)
        block_ms = max(1, int(min(timeout_s, BLOCK_CHUNK_S) * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.xread({self.keys.stream(stream_id).events: after_id}, count=1, block=block_ms)
        self.queue_snapshot(pipe, stream_id)
        return self.parse_snapshot(stream_id, pipe.execute()[1:])

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

    def load_spec(self, stream_id: str) -> StreamSpec:
        blob = cast("bytes | None", self.client.get(self.keys.stream(stream_id).spec))
        if blob is None:
            raise StreamNotFound(stream_id)
        return spec_decoder.decode(blob)

    def load_candidates(self, stream_id: str, start: int, end: int) -> list[Candidate]:
        blobs = cast(list[bytes], self.client.lrange(self.keys.stream(stream_id).candidates, start, end - 1))
        return [candidate_decoder.decode(b) for b in blobs]

    # -- worker side -------------------------------------------------------

    def begin(
        self, stream_id: str, window: int, *, work_deadline_s: float, delivery: str, takeover: bool = False
    ) -> Begun | int:
        """Count an attempt, take the window's lease for ``work_deadline_s`` and read the window.

        Returns what to score, or a code: ALREADY_COMMITTED, NOT_ADMITTED, GONE,
        HELD_ELSEWHERE (a delivery, this one included, holds a live lease: a duplicate or a
        copy of a running message) or NO_SUCH_WINDOW. ``takeover``: the broker itself delivers
        this message again (its worker died whole), so ``delivery``'s own live lease is taken over.
        """
        reply = self._run(
            self.keys.stream(stream_id),
            "begin",
            window,
            _now_ms() + int(work_deadline_s * 1000),
            delivery,
            int(takeover),
        )
        if reply[0] < 0:
            return int(reply[0])
        indexes = [int(i) for i in reply[3].split(b",")] if reply[3] else []
        return Begun(
            attempt=int(reply[0]),
            admitted_at_ms=int(reply[1]),
            spec=reply[2],
            candidates=list(reply[4:]),
            indexes=indexes,
        )

    def release(self, stream_id: str, window: int, *, delivery: str, refund: bool) -> int:
        """End ``delivery``'s lease on the window now: the worker saw its attempt end without a
        commit, so the message it puts back can begin at once. ``refund`` gives the attempt back
        (the worker cancelled it; the window's own work did not fail). Returns 1 when released,
        0 when that delivery held no live lease, or a negative code."""
        return int(self._run(self.keys.stream(stream_id), "release", window, delivery, int(refund)))

    def commit(
        self,
        stream_id: str,
        result: WindowResult,
        *,
        outcome: str,
        embeddings: WindowEmbeddings | None = None,
        side_writes: Sequence[Any] = (),
        after: Sequence[Any] = (),
        order: Sequence[int] = (),
        enqueue_grace_s: float = 0.0,
    ) -> Commit:
        """Commit a window once and count it under ``windows_<outcome>`` (ranked, failed, poisoned,
        skipped); its ``embeddings``, when given, are written in the same script call, or not at all.
        ``order``: the candidate indexes its page shows, in order, which a cascade's next stage
        reads; the windows the commit admits for that stage are due ``enqueue_grace_s`` from now.

        ``side_writes`` (the worker's: cache entries, counters) go in the same round trip, ahead
        of the commit, each a command of its own: each is given ``queue(pipeline)`` to queue one
        command and ``settle(reply)`` with what it answered. ``after`` (giving the window's fair
        share back) goes the same way, behind the commit.

        Returns the commit's code (1 written, 0 already committed, or a negative code) and what
        it admitted.
        """
        stream = self.keys.stream(stream_id)
        now = _now_ms()
        args: list[EncodableT] = [
            "commit",
            now,
            result.window,
            encode(result),
            self.event_log_maxlen,
            outcome,
            encode(embeddings) if embeddings is not None else b"",
            len(result.failovers),
            ",".join(str(i) for i in order),
            now + int(enqueue_grace_s * 1000),
        ]
        if self._cluster or not (side_writes or after):
            # A cluster pipeline refuses scripts, and the side writes' keys live on other
            # slots than the stream's: each goes on its own, around the commit.
            for side_write in side_writes:
                side_write.run_now()
            written = _commit_reply(self._script(keys=stream.all(), args=args))
            for side_write in after:
                side_write.run_now()
            return written
        keys = stream.all()
        pipe = self.client.pipeline(transaction=False)
        for side_write in side_writes:
            side_write.queue(pipe)
        # EVALSHA itself: a registered script would cost the pipeline a SCRIPT EXISTS round trip.
        pipe.evalsha(self._script.sha, len(keys), *keys, *args)
        for side_write in after:
            side_write.queue(pipe)
        replies = pipe.execute(raise_on_error=False)
        for side_write, reply in zip(side_writes, replies):
            side_write.settle(reply)
        reply = replies[len(side_writes)]
        for side_write, later in zip(after, replies[len(side_writes) + 1 :]):
            side_write.settle(later)
        if isinstance(reply, redis.exceptions.NoScriptError):  # a restarted Redis: the call loads it
            return _commit_reply(self._script(keys=keys, args=args))
        if isinstance(reply, Exception):
            raise reply
        return _commit_reply(reply)

    def load_embeddings(self, stream_id: str, windows: list[int]) -> dict[int, list[float]]:
        """The kept embeddings of these windows' candidates, by candidate index (windows without any add none)."""
        if not windows:
            return {}
        out: dict[int, list[float]] = {}
        blobs = cast(
            "list[bytes | None]", self.client.hmget(self.keys.stream(stream_id).embeddings, [str(w) for w in windows])
        )
        for blob in blobs:
            if blob is not None:
                out.update(window_embeddings_decoder.decode(blob).unpack())
        return out

    def due_windows(self, stream_id: str, *, retry_in_s: float, trust_queued_s: float = 0) -> list[int]:
        """``due_windows_many`` for one stream: its overdue windows, claimed."""
        due = self.due_windows_many([stream_id], retry_in_s=retry_in_s, trust_queued_s=trust_queued_s).get(stream_id)
        return due.windows if due is not None else []

    def due_windows_many(
        self, stream_ids: list[str], *, retry_in_s: float, trust_queued_s: float = 0
    ) -> dict[str, DueWindows]:
        """Overdue windows of these streams, claimed for re-sending (their deadline moves
        ``retry_in_s`` out), with each stream's device and lane: one round trip, each call atomic.

        With ``trust_queued_s`` > 0, an overdue window whose queued mark (a message sent, no
        delivery begun since) is younger than that is held instead of claimed (``DueWindows.held``).
        """
        if not stream_ids:
            return {}
        retry_at = _now_ms() + int(retry_in_s * 1000)
        trust_ms = int(trust_queued_s * 1000)
        replies = self._due_on_cluster(stream_ids, retry_at, trust_ms) if self._cluster else None
        if replies is None:
            pipe = self.client.pipeline(transaction=False)
            for stream_id in stream_ids:
                self._run(self.keys.stream(stream_id), "due", retry_at, trust_ms, client=pipe)
            replies = pipe.execute()
        out: dict[str, DueWindows] = {}
        for stream_id, reply in zip(stream_ids, replies):
            if reply:
                out[stream_id] = DueWindows(
                    device=reply[0].decode(),
                    lane=reply[1].decode(),
                    held=int(reply[2]),
                    windows=[int(w) for w in reply[3:]],
                )
        return out

    def _due_on_cluster(self, stream_ids: list[str], retry_at: int, trust_ms: int) -> list[Any]:
        """``due`` calls on a cluster: redis-py's cluster pipeline refuses scripts, so one plain
        pipeline per master, each call on the node that owns its stream's slot. A call that
        meets a moved slot (a failover the slot map has not caught up with) runs again alone,
        through the cluster client, which follows the redirection."""
        cluster = cast(redis.cluster.RedisCluster, self.client)  # only called when _cluster
        by_node: dict[str, tuple[Any, list[int]]] = {}
        for i, stream_id in enumerate(stream_ids):
            node = cluster.get_node_from_key(self.keys.stream(stream_id).meta)
            by_node.setdefault(node.name, (node, []))[1].append(i)
        replies: list[Any] = [None] * len(stream_ids)
        for node, indexes in by_node.values():
            try:
                pipe = cluster.get_redis_connection(node).pipeline(transaction=False)
                for i in indexes:
                    self._run(self.keys.stream(stream_ids[i]), "due", retry_at, trust_ms, client=pipe)
                answers = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError):
                answers = [None] * len(indexes)  # the node is gone: ask the cluster client again
            for i, answer in zip(indexes, answers):
                if answer is None or isinstance(answer, Exception):
                    answer = self._run(self.keys.stream(stream_ids[i]), "due", retry_at, trust_ms)
                replies[i] = answer
        return replies

    def active_streams(self) -> list[str]:
        """Live stream ids of every shard; expired ones are pruned from the index as a side effect."""
        now = _now_ms()
        pipe = self.client.pipeline(transaction=False)
        for tag in self.keys.shard_tags():
            pipe.zremrangebyscore(self.keys.active(tag), "-inf", now)
            pipe.zrange(self.keys.active(tag), 0, -1)
        replies = pipe.execute()
        return [s.decode() for live in replies[1::2] for s in live]

    def try_sweep_lock(self, hold_s: float) -> bool:
        """One sweeper per interval across all workers: the lock is never released, it expires."""
        return bool(self.client.set(self.keys.sweep_lock, "1", nx=True, px=max(1, int(hold_s * 1000))))

    def incr_counter(self, name: str, amount: int = 1, *, stream_id: str | None = None) -> None:
        self.client.hincrby(self.keys.counters_for(stream_id), name, amount)

    def counters(self) -> dict[str, int]:
        """Every counter, summed over the shards."""
        pipe = self.client.pipeline(transaction=False)
        for tag in self.keys.shard_tags():
            pipe.hgetall(self.keys.counters(tag))
        totals: dict[str, int] = {}
        for shard in pipe.execute():
            for name, value in shard.items():
                key = name.decode()
                totals[key] = totals.get(key, 0) + int(value)
        return totals


#: The meta fields a stream's progress is read from (``parse_progress``).
PROGRESS_FIELDS = ("n", "window_size", "admitted", "committed", "failed", "failovers", "lane", "later", "unhanded")


def parse_progress(stream_id: str, meta: Sequence[bytes | None]) -> StreamProgress | None:
    """A stream's progress from its ``PROGRESS_FIELDS``; None for a stream that does not exist."""
    if meta[0] is None or meta[1] is None:
        return None
    return StreamProgress(
        stream_id=stream_id,
        n_candidates=int(meta[0]),
        window_size=int(meta[1]),
        admitted=int(meta[2] or 0),
        committed=int(meta[3] or 0),
        failed=int(meta[4] or 0),
        failovers=int(meta[5] or 0),
        lane=cast(Lane, meta[6].decode()) if meta[6] else "interactive",
        later_windows=int(meta[7] or 0),
        unhanded_stages=int(meta[8] or 0),
    )


class StageHandedSince(Exception):
    """A cancel saw a cascade stage before it was handed windows: read the stream again."""


_SNAPSHOT_FIELDS = (
    "n",
    "window_size",
    "admitted",
    "device",
    "lane",
    "stages",
    "cancelled_at",
    "stage_chains",
    *(f"{field}:{n}" for n in _LATER_STAGE_NUMBERS for field in _STAGE_FIELDS),
)


def _parse_stages(
    layout: bytes | None, fields: Sequence[bytes | None]
) -> tuple[list[tuple[int, int]], dict[int, HandedStage]]:
    """A cascade's later stages (``(keep, window_size)`` each) and what each was handed, from
    the meta fields ``queue_snapshot`` reads."""
    if not layout:
        return [], {}
    later = []
    for entry in layout.decode().split(";"):
        _first, _slots, size, keep, *_budgets = entry.split(":")
        later.append((int(keep), int(size)))
    handed: dict[int, HandedStage] = {}
    width = len(_STAGE_FIELDS)
    for k, number in enumerate(_LATER_STAGE_NUMBERS):
        windows, members, stopped, handed_at = fields[k * width : (k + 1) * width]
        if windows is None:
            continue
        handed[number] = HandedStage(
            members=[int(i) for i in members.split(b",")] if members else [],
            windows=int(windows),
            handed_at_ms=int(handed_at or 0),
            stopped=stopped.decode() if stopped else None,
        )
    return later, handed


def _commit_reply(reply: Any) -> Commit:
    """``commit``'s answer: ``{code}``, or ``{1, bucket, expire_at, lane, (window, cost)...}``."""
    code = int(reply[0])
    if code != 1 or len(reply) < 4:
        return Commit(code=code)
    pairs = reply[4:]
    bucket, lane = reply[1], reply[3]
    return Commit(
        code=code,
        admitted=Admitted(
            windows=[int(w) for w in pairs[0::2]],
            costs=[int(c) for c in pairs[1::2]],
            bucket=bucket.decode() if isinstance(bucket, bytes) else str(bucket),
            expire_at_ms=int(reply[2]),
            lane=cast(Lane, lane.decode() if isinstance(lane, bytes) else str(lane)),
        ),
    )
