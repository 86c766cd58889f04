"""A private Sentinel set on free loopback ports: a master, a replica and three sentinels,
for tests and the chaos run, every server run with ``min-replicas-to-write`` (see below).
Sentinels are ``redis-server --sentinel`` (the same binary, the
system's or the 6.2 the dev extra ships), so nothing else needs installing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import redis

from worker.embedded.redis_server import EmbeddedRedis, free_port, redis_server_binary

SERVICE = "rerankq"
#: A master refuses writes (NOREPLICAS) unless this many replicas are in sync: the old master of
#: a failover stops taking writes the moment its replica is promoted, instead of ~10 s later
#: when the sentinels demote it (writes that its resync then drops). 0 turns the guard off.
MIN_REPLICAS_TO_WRITE = 1
#: "In sync": acknowledged the replication stream within this many seconds (replicas ack once a
#: second). It bounds how long a master cut off from its replica (a partition) keeps taking
#: writes it cannot pass on; kept under Sentinel's down-after time, so an isolated master stops
#: writing before its successor is chosen, and above a few missed acks of a busy host.
MIN_REPLICAS_MAX_LAG = 5


class EmbeddedSentinel:
    """Start a master, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2); fail over,
    by hand (``SENTINEL FAILOVER``) or by killing the master; stop."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        service: str = SERVICE,
        down_after_ms: int = 1000,
        appendonly: bool = False,
        binary: str | None = None,
        directory: str | None = None,
        min_replicas_to_write: int = MIN_REPLICAS_TO_WRITE,
        min_replicas_max_lag: int = MIN_REPLICAS_MAX_LAG,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.service = service
        self.down_after_ms = down_after_ms
        self._own_directory = directory is None  # a caller's directory (the chaos run's logs) is kept
        self.directory = directory or tempfile.mkdtemp(prefix="rerankq-sentinel-")
        # Every server, replicas too: any of them may be promoted.
        guard = [
            "--min-replicas-to-write",
            str(min_replicas_to_write),
            "--min-replicas-max-lag",
            str(min_replicas_max_lag),
            # A replica joining a new master starts its full sync at once, not 5 s later (7.x's
            # default): with the guard on, the master refuses writes until that sync is done.
            "--repl-diskless-sync-delay",
            "0",
        ]
        self.servers = [
            EmbeddedRedis(appendonly=appendonly, binary=self.binary, directory=self._dir(f"data{i}"), extra_args=guard)
            for i in range(1 + replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinel_processes: list[subprocess.Popen[bytes]] = []

    def _dir(self, name: str) -> str:
        path = os.path.join(self.directory, name)
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def url(self) -> str:
        """``redis+sentinel://`` naming every sentinel and the service, as rerankq's settings take it."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout_s: float = 30.0) -> EmbeddedSentinel:
        master = self.servers[0].start()
        for replica in self.servers[1:]:
            replica.start()
            with redis.Redis(port=replica.port) as client:
                client.execute_command("REPLICAOF", "127.0.0.1", master.port)
        for i, port in enumerate(self.sentinel_ports):
            conf = os.path.join(self._dir(f"sentinel{i}"), "sentinel.conf")
            with open(conf, "w") as fh:
                fh.write(
                    f"port {port}\nbind 127.0.0.1\ndir {os.path.dirname(conf)}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {master.port} 2\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} 5000\n"
                    f"sentinel parallel-syncs {self.service} 1\n"
                )
            log = os.path.join(os.path.dirname(conf), "sentinel.log")
            self.sentinel_processes.append(
                subprocess.Popen(
                    [self.binary, conf, "--sentinel", "--logfile", log, "--daemonize", "no"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self._wait(
            lambda: self._replicas_known() >= len(self.servers) - 1,
            timeout_s,
            "the sentinels to see the master and its replicas",
        )
        self._wait(lambda: self._replicas_linked(), timeout_s, "replication links up")
        return self

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def _replicas_known(self) -> int:
        known = []
        for port in self.sentinel_ports:
            with self._sentinel(port) as client:
                master = client.sentinel_master(self.service)
                known.append(
                    int(master.get("num-slaves", 0))
                    if int(master.get("num-other-sentinels", 0)) >= len(self.sentinel_ports) - 1
                    else 0
                )
        return min(known)

    def _replicas_linked(self) -> bool:
        port = self.master_port()
        for server in self.servers:
            if server.process is None or server.port == port:
                continue
            with redis.Redis(port=server.port, socket_timeout=2) as client:
                info = client.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
        return True

    @staticmethod
    def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except (redis.RedisError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}" + (f" (last: {last})" if last else ""))

    def master_port(self) -> int:
        """The master's port as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            try:
                with self._sentinel(port) as client:
                    host, master = client.sentinel_get_master_addr_by_name(self.service)
                    return int(master)
            except (redis.RedisError, OSError, TypeError):
                continue
        raise RuntimeError("no sentinel answers")

    def server_on(self, port: int) -> EmbeddedRedis:
        return next(s for s in self.servers if s.port == port)

    def failover(self, timeout_s: float = 30.0) -> int:
        """A manual failover (``SENTINEL FAILOVER``: no quorum needed, nothing lost that the replica
        had); returns the new master's port once it serves writes."""
        old = self.master_port()
        deadline = time.monotonic() + timeout_s
        while self.master_port() == old:
            # A sentinel aborts a failover with no replica it deems good (one that rejoined a
            # moment ago) or refuses one in progress: ask again, only while the master is unchanged
            # (asking once it changed would fail over back).
            try:
                with self._sentinel(self.sentinel_ports[0]) as client:
                    client.execute_command("SENTINEL", "FAILOVER", self.service)
            except redis.ResponseError:
                pass
            until = time.monotonic() + 5.0
            while self.master_port() == old and time.monotonic() < until:
                time.sleep(0.1)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no failover of {old} within {timeout_s}s")
        return self.wait_new_master(old, max(1.0, deadline - time.monotonic()))

    def kill_master(self) -> int:
        """SIGKILL the master (a crash: writes it acknowledged but had not replicated are lost
        when its replica takes over); returns its port."""
        port = self.master_port()
        self.server_on(port).kill()
        return port

    #: How long the sentinels may take to demote a live old master: they notice it from its INFO
    #: (every 10 s outside a failover) and wait a few publish periods first, so tens of seconds on
    #: a loaded host; the failover itself (a new master taking writes) is bounded by its own time.
    DEMOTION_TIMEOUT_S = 120.0

    def wait_new_master(self, old_port: int, timeout_s: float = 30.0) -> int:
        def promoted() -> bool:
            port = self.master_port()
            if port == old_port:
                return False
            with redis.Redis(port=port, socket_timeout=2) as client:
                return client.info("replication").get("role") == "master"

        self._wait(promoted, timeout_s, f"a new master in place of {old_port}")
        old = self.server_on(old_port)
        if old.process is not None:
            # The failover ends when the sentinels demote the old master (seconds later: until
            # then it still takes writes from clients connected to it, which its resync drops).
            def demoted() -> bool:
                with redis.Redis(port=old_port, socket_timeout=2) as client:
                    return client.info("replication").get("role") == "slave"

            self._wait(demoted, self.DEMOTION_TIMEOUT_S, f"the old master {old_port} to be demoted")
        return self.master_port()

    def restart(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed server again: the sentinels make it a replica of the new master."""
        self.server_on(port).start()
        self._wait(self._replicas_linked, timeout_s, f"{port} to rejoin as a replica")

    def stop(self) -> None:
        for process in self.sentinel_processes:
            process.terminate()
        for process in self.sentinel_processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.sentinel_processes = []
        for server in self.servers:
            server.stop()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedSentinel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
