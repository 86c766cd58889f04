"""The store's deployment shape in a chaos run (``ops/chaos.py --store single|cluster|sentinel``).

- ``single``: one redis-server with AOF, store and broker (the run as it always was); its
  faults are restarts (SIGTERM, SIGKILL).
- ``cluster``: the store on a private Redis Cluster (three masters, three replicas), the broker
  on one redis-server with AOF (restarted as in ``single``); the store's fault is a master
  SIGKILLed, its replica promoted, the old master started again (it rejoins as a replica).
- ``sentinel``: store and broker on one Sentinel set (a master, a replica, three sentinels,
  every server with ``min-replicas-to-write 1``); the fault is a failover, by hand
  (``SENTINEL FAILOVER``) or by a SIGKILL of the master,
  which is started again and rejoins as a replica.

A failover can lose writes the old master acknowledged: after a SIGKILL those it had not yet
sent to its replica (after a manual Sentinel failover too: those in flight at the promotion;
without ``min-replicas-to-write`` also all it took between its replica's promotion and its own
demotion, seconds later). docs/deployments.md says so ("Redis Sentinel"). The run does not repair such
a loss and does not hide it: each failover is recorded with what it could have touched (a
cluster master's slots; all of a Sentinel master), the canary counts acknowledged writes lost
across failovers, and ``attribute`` moves only findings a failover can explain (a stream
whose open vanished, a window committed again or whose result changed, on a failed-over
master) into a separate count. Nothing else is excused: a window still uncommitted after the
drain is ``lost`` whatever happened, so a broken sweep still fails the run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from devservers.redis_cluster import EmbeddedRedisCluster
from devservers.redis_sentinel import EmbeddedSentinel
from kernel.keys import Keys
from kernel.redis_clients import store_client
from worker.embedded.redis_server import EmbeddedRedis

SHAPES = ("single", "cluster", "sentinel")
#: Canary keys, one per cluster master at the start (their slots: 0, 5461, 10923 ...): tags
#: found by search so each lands in another master's range.
CANARY_PREFIX = "rerankq-chaos-canary"


@dataclass
class Failover:
    kind: str
    started: float
    ended: float = 0.0
    #: The slots the failed master served; None: every slot (Sentinel's one master).
    slots: set[int] | None = None


@dataclass
class StoreShape:
    name: str
    store_url: str
    broker_url: str
    #: The single redis-server the restart faults act on (the broker; and the store for ``single``).
    restartable: EmbeddedRedis | None
    cluster: EmbeddedRedisCluster | None = None
    sentinel: EmbeddedSentinel | None = None
    failovers: list[Failover] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fault_weights(self, base: dict[str, int]) -> dict[str, int]:
        weights = dict(base)
        if self.restartable is None:
            weights.pop("redis_sigterm", None)
            weights.pop("redis_sigkill", None)
        if self.name != "single":
            weights["store_failover"] = 2
        return weights

    def failover(self, flip: bool) -> str:
        """One store failover; ``flip`` picks, for Sentinel, a SIGKILL over a manual failover."""
        if self.cluster is not None:
            record = Failover("cluster_master_killed", time.time())
            port = self.cluster.master_ports()[0]
            record.slots = _slots_of(self.cluster, port)
            with self.lock:
                self.failovers.append(record)
            self.cluster.kill_master(port)
            self.cluster.wait_promoted(port, timeout_s=60)
            self.cluster.restart(port, timeout_s=60)
            record.ended = time.time()
            return "cluster_master_killed"
        assert self.sentinel is not None
        record = Failover("sentinel_master_killed" if flip else "sentinel_failover", time.time())
        with self.lock:
            self.failovers.append(record)
        try:
            if flip:
                dead = self.sentinel.kill_master()
                self.sentinel.wait_new_master(dead, timeout_s=60)
                self.sentinel.restart(dead, timeout_s=60)
            else:
                self.sentinel.failover(timeout_s=60)
        except (RuntimeError, redis.RedisError):
            # A failover that did not finish in a minute is a finding of its own, not a reason
            # to stop injecting faults; its losses are counted like any other's.
            record.kind += "_unfinished"
        record.ended = time.time()
        return record.kind

    def explains(self, stream_id: str, keys: Keys) -> bool:
        """Whether a failover of this run could have lost an acknowledged write of this stream."""
        slot = key_slot(keys.stream(stream_id).meta.encode())
        with self.lock:
            return any(f.slots is None or slot in f.slots for f in self.failovers)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.sentinel is not None:
            self.sentinel.stop()
        if self.restartable is not None:
            self.restartable.stop()


def _slots_of(cluster: EmbeddedRedisCluster, port: int) -> set[int]:
    node = next(n for n in cluster.nodes if n.port == port)
    with node.client() as client:
        slots: set[int] = set()
        for start, end, *nodes in client.execute_command("CLUSTER", "SLOTS"):
            if int(nodes[0][1]) == port:
                slots.update(range(int(start), int(end) + 1))
    return slots


def start_shape(name: str, log_dir: Path, *, redis_broker: bool = True) -> StoreShape:
    """The store's servers, and for ``cluster`` a redis-server as the broker unless the broker is
    RabbitMQ (``redis_broker=False``): then there is no broker Redis, and no Redis restart fault
    acting on a server nothing uses."""
    (log_dir / "redis").mkdir(exist_ok=True)
    if name == "single":
        server = EmbeddedRedis(appendonly=True, directory=str(log_dir / "redis")).start()
        return StoreShape(name, server.url, server.url, server)
    if name == "cluster":
        cluster = EmbeddedRedisCluster(directory=str(log_dir / "cluster")).start()
        if not redis_broker:
            return StoreShape(name, cluster.url, "", None, cluster=cluster)
        broker = EmbeddedRedis(appendonly=True, directory=str(log_dir / "redis")).start()
        return StoreShape(name, cluster.url, broker.url, broker, cluster=cluster)
    if name == "sentinel":
        sentinel = EmbeddedSentinel(directory=str(log_dir / "sentinel")).start()
        return StoreShape(name, sentinel.url, sentinel.url, None, sentinel=sentinel)
    raise ValueError(name)


def canary_clients(shape: StoreShape) -> list[tuple[str, Any, str]]:
    """(what, client that never retries, key) for each canary: the broker's single Redis, and
    the store's masters where they can fail over (their losses are reported apart)."""
    out: list[tuple[str, Any, str]] = []
    no_retry = {"retry": Retry(NoBackoff(), 0), "retry_on_error": [], "socket_timeout": 2, "socket_connect_timeout": 2}
    if shape.restartable is not None:
        out.append(
            (
                "restarts",
                redis.Redis.from_url(
                    shape.restartable.url, socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
                ),
                f"{CANARY_PREFIX}:acknowledged-writes",
            )
        )
    if shape.cluster is not None:
        client = store_client(shape.store_url, **no_retry)
        wanted = [i * (16384 // shape.cluster.masters) for i in range(shape.cluster.masters)]
        for slot in wanted:
            tag = next(
                t
                for t in (str(i) for i in range(100000))
                if key_slot(t.encode()) >= slot and key_slot(t.encode()) < slot + 16384 // shape.cluster.masters
            )
            out.append(("failovers", client, f"{CANARY_PREFIX}:{{{tag}}}"))
    if shape.sentinel is not None:
        out.append(("failovers", store_client(shape.store_url, **no_retry), f"{CANARY_PREFIX}:acknowledged-writes"))
    return out


@dataclass
class FailoverLosses:
    """Findings a failover of the store explains: acknowledged writes it lost, reported apart."""

    canary: int = 0
    streams_vanished: int = 0
    windows_of_vanished: int = 0
    committed_again: int = 0
    changed: int = 0

    @property
    def total(self) -> int:
        return self.canary + self.streams_vanished + self.committed_again + self.changed


def attribute(findings: Any, shape: StoreShape, keys: Keys, n_windows: dict[str, int]) -> FailoverLosses:
    """Move what a failover explains out of ``findings`` into the returned count.

    Only three kinds qualify, each on a stream whose master was failed over: a stream that
    vanished (its acknowledged open was lost), a window with two ``window_committed`` log lines
    but one commit in its surviving log (its first commit was lost, the sweep had it scored
    again), a window whose result changed (the same). A window with two commits in its log,
    a window not committed, a failed window are never excused.
    """
    losses = FailoverLosses()
    if not shape.failovers:
        return losses
    for stream_id in sorted(findings.vanished_streams):
        if shape.explains(stream_id, keys):
            findings.vanished_streams.discard(stream_id)
            findings.vanished -= 1
            findings.lost -= n_windows.get(stream_id, 0)
            losses.streams_vanished += 1
            losses.windows_of_vanished += n_windows.get(stream_id, 0)
    for stream_id, window in sorted(findings.twice_logs - findings.twice_events):
        if shape.explains(stream_id, keys):
            findings.twice_logs.discard((stream_id, window))
            losses.committed_again += 1
    for stream_id, window in sorted(findings.changed_windows):
        if shape.explains(stream_id, keys):
            findings.changed_windows.discard((stream_id, window))
            findings.changed -= 1
            losses.changed += 1
    return losses
