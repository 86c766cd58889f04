"""A private Redis Cluster (three masters, three replicas) on free loopback ports, for tests,
the chaos run and the deployments benchmark.

The cluster is built with the commands ``redis-cli --cluster create`` sends (ADDSLOTS, MEET,
REPLICATE), from redis-py, so it needs only a ``redis-server`` (the system's, or the 6.2 the
dev extra ships, which comes without ``redis-cli``) and works the same on 6.2 and 7.x.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import redis

from worker.embedded.redis_server import private_server_args, redis_server_binary

SLOTS = 16384


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: set[int] | frozenset[int] = frozenset()) -> int:
    """A free port whose cluster bus port (+10000) is free too; Redis refuses ports above 55535."""
    while True:
        port = random.randint(20000, 55535)
        if port not in taken and port + 10000 not in taken and _bindable(port) and _bindable(port + 10000):
            return port


@dataclass
class ClusterNode:
    port: int
    directory: str
    process: subprocess.Popen[bytes] | None = None
    node_id: str = ""
    extra: list[str] = field(default_factory=list)

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(interval_s)
    raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}" + (f" (last error: {last})" if last else ""))


class EmbeddedRedisCluster:
    """Start a 3-master, 3-replica cluster; kill a master and wait for its replica's promotion; stop.

    ``node_timeout_ms`` is the cluster's failure-detection time: a master unreachable that long
    is failed over by its replica (the validity factor is 0, so a replica always may).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1500,
        appendonly: bool = False,
        binary: str | None = None,
        directory: str | None = None,
    ) -> None:
        self.binary = binary or redis_server_binary()
        self.masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.directory = directory or tempfile.mkdtemp(prefix="rerankq-cluster-")
        total = masters * (1 + replicas_per_master)
        ports: set[int] = set()
        for _ in range(total):
            ports.add(free_cluster_port(ports | {p + 10000 for p in ports} | {p - 10000 for p in ports}))
        self.nodes = [
            ClusterNode(port=port, directory=os.path.join(self.directory, str(i)))
            for i, port in enumerate(sorted(ports))
        ]

    @property
    def url(self) -> str:
        """``redis+cluster://`` naming every node, as rerankq's settings take it."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    # -- processes ------------------------------------------------------------

    def _spawn(self, node: ClusterNode) -> None:
        os.makedirs(node.directory, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(node.port),
            *private_server_args(node.directory, appendonly=self.appendonly),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-replica-validity-factor",
            "0",
            *node.extra,
        ]
        node.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = node.client()
        try:
            _wait(lambda: client.ping(), 10, f"redis-server on {node.port} (see {node.directory}/redis.log)", 0.05)
        finally:
            client.close()

    def start(self, timeout_s: float = 60.0) -> EmbeddedRedisCluster:
        for node in self.nodes:
            self._spawn(node)
        clients = [n.client() for n in self.nodes]
        try:
            for node, client in zip(self.nodes, clients):
                node.node_id = client.execute_command("CLUSTER", "MYID").decode()
            masters = self.nodes[: self.masters]
            per = SLOTS // self.masters
            for i, client in enumerate(clients[: self.masters]):
                end = SLOTS if i == self.masters - 1 else (i + 1) * per
                client.execute_command("CLUSTER", "ADDSLOTS", *range(i * per, end))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            _wait(
                lambda: all(
                    len(c.execute_command("CLUSTER", "NODES").decode().splitlines()) == len(self.nodes) for c in clients
                ),
                timeout_s,
                "every node to know every other",
            )
            for j, (node, client) in enumerate(zip(self.nodes[self.masters :], clients[self.masters :])):
                master = masters[j % self.masters]
                _wait(
                    lambda c=client, m=master: c.execute_command("CLUSTER", "REPLICATE", m.node_id),
                    timeout_s,
                    f"node {node.port} to replicate {master.port}",
                )
            self.wait_healthy(timeout_s)
        finally:
            for client in clients:
                client.close()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()
                node.process = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state ----------------------------------------------------------------

    def _live(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def roles(self) -> dict[int, str]:
        """Port -> ``master`` / ``slave`` as a live node sees the cluster (failed nodes left out)."""
        node = self._live()[0]
        with node.client() as client:
            table = client.execute_command("CLUSTER", "NODES").decode()
        out = {}
        for line in table.splitlines():
            parts = line.split()
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            flags = parts[2].split(",")
            if "fail" in flags or "fail?" in flags:
                continue
            out[port] = "master" if "master" in flags else "slave"
        return out

    def master_ports(self) -> list[int]:
        return sorted(port for port, role in self.roles().items() if role == "master")

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok``, ``masters`` masters serve the slots, and
        every live replica's link to its master is up."""
        live = self._live()
        for node in live:
            with node.client() as client:
                if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return False
                info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
        return len(self.master_ports()) == self.masters

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        _wait(self.healthy, timeout_s, "the cluster to be healthy", 0.2)

    def kill_master(self, port: int | None = None) -> int:
        """SIGKILL one master (the first, or the one on ``port``); returns its port."""
        port = port or self.master_ports()[0]
        node = next(n for n in self.nodes if n.port == port)
        assert node.process is not None
        node.process.kill()
        node.process.wait()
        node.process = None
        return port

    def wait_promoted(self, dead_port: int, timeout_s: float = 30.0) -> int:
        """Wait until a replica took over the dead master's slots and the cluster is ok again;
        returns the new master's port."""
        before = {n.port for n in self.nodes} - {dead_port}

        def promoted() -> int | None:
            live = self._live()
            with live[0].client() as client:
                if b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    return None
            return len([p for p in self.master_ports() if p in before]) == self.masters

        _wait(promoted, timeout_s, f"a replica of {dead_port} to be promoted", 0.2)
        return self._new_master_for(dead_port)

    def _new_master_for(self, dead_port: int) -> int:
        node = self._live()[0]
        with node.client() as client:
            table = client.execute_command("CLUSTER", "NODES").decode()
        # The promoted replica took a new config epoch: the newest of the live masters.
        epochs = []
        for line in table.splitlines():
            parts = line.split()
            if "master" in parts[2] and "fail" not in parts[2]:
                epochs.append((int(parts[6]), int(parts[1].split("@")[0].rsplit(":", 1)[1])))
        return max(epochs)[1]

    def restart(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed node again on its port: it rejoins as a replica of its successor."""
        node = next(n for n in self.nodes if n.port == port)
        self._spawn(node)
        self.wait_healthy(timeout_s)
