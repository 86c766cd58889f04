"""A private RabbitMQ node on free loopback ports, for the tests and the chaos run.

It runs ``rabbitmq-server`` (Debian's package puts the real script in
``/usr/lib/rabbitmq/bin``; ``/usr/sbin/rabbitmq-server`` is a wrapper that switches to the
``rabbitmq`` user and the system node's data) with everything of its own: node name, AMQP
and distribution ports, data, logs, config and an empty plugin list (no management
listener), and a HOME of its own for the Erlang cookie, so the system node on 5672 and its
cookie are never touched. Data lives on across ``restart``, so durable queues and the
messages in them come back, as they would on a real node.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import amqp

from worker.embedded.redis_server import free_port

#: Where the Debian package keeps the unwrapped scripts; PATH is tried first.
_DEBIAN_BIN = "/usr/lib/rabbitmq/bin"


def rabbitmq_server_binary() -> str | None:
    """The unwrapped ``rabbitmq-server`` script, or None when RabbitMQ is not installed."""
    debian = Path(_DEBIAN_BIN) / "rabbitmq-server"
    if debian.exists():
        return str(debian)
    return shutil.which("rabbitmq-server")


class EmbeddedRabbitMQ:
    """Start, stop, kill and restart one private RabbitMQ node.

    ``consumer_timeout_ms`` is the server-wide delivery acknowledgement timeout written to
    the node's config (RabbitMQ's own default, 30 minutes, when None).
    """

    def __init__(
        self, *, directory: str | None = None, consumer_timeout_ms: int | None = None, binary: str | None = None
    ) -> None:
        found = binary or rabbitmq_server_binary()
        if found is None:
            raise RuntimeError("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)")
        self.binary = found
        self.directory = Path(directory or tempfile.mkdtemp(prefix="rerankq-rabbitmq-"))
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"rerankq-{uuid.uuid4().hex[:8]}@localhost"
        self.consumer_timeout_ms = consumer_timeout_ms
        self.process: subprocess.Popen[bytes] | None = None
        self._prepare()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def _prepare(self) -> None:
        (self.directory / "home").mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")  # not the system's (its NODENAME)
        conf = [
            "loopback_users = none",
            f"listeners.tcp.default = 127.0.0.1:{self.port}",
            "log.file.level = info",
            "log.console = false",
        ]
        if self.consumer_timeout_ms is not None:
            conf.append(f"consumer_timeout = {self.consumer_timeout_ms}")
        (self.directory / "rabbitmq.conf").write_text("\n".join(conf) + "\n")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            {
                "HOME": str(self.directory / "home"),  # the Erlang cookie is made here, not in the system's
                "RABBITMQ_NODENAME": self.node,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.log_dir),
                "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq"),
                "RABBITMQ_CONF_ENV_FILE": str(self.directory / "rabbitmq-env.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "enabled_plugins"),
                "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.directory / "plugins-expand"),
                "RABBITMQ_PID_FILE": str(self.directory / "rabbitmq.pid"),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
            }
        )
        return env

    def start(self, timeout_s: float = 60.0) -> EmbeddedRabbitMQ:
        out = open(self.directory / "server.out", "ab")
        # Its own process group: stop() signals the node's Erlang VM and its helpers (epmd is
        # shared and started detached by whichever node came first; it is left running).
        self.process = subprocess.Popen(
            [self.binary],
            env=self._env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the node accepts an AMQP login (the broker is up, not just the VM)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.process.returncode}; see {self.directory}")
            try:
                with amqp.Connection(
                    f"127.0.0.1:{self.port}", userid="guest", password="guest", connect_timeout=2
                ) as conn:
                    conn.connect()
                    return
            except (OSError, amqp.exceptions.AMQPError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rabbitmq-server did not become ready; see {self.log_dir}") from None
                time.sleep(0.2)

    def _signal(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM: RabbitMQ shuts down cleanly (quorum queues write their state out)."""
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        self._reap_group()
        self.process = None

    def kill(self) -> None:
        """SIGKILL the node: a crash. Confirmed messages of a quorum queue are on disk already."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self.process.wait()
        self._reap_group()
        self.process = None

    def _reap_group(self) -> None:
        # erl_child_setup and friends share the group; never leave one holding the ports.
        if self.process is None:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        self._signal(signal.SIGKILL)

    def restart(self, *, crash: bool = False) -> None:
        self.kill() if crash else self.stop()
        self.start()

    def ctl(self, *args: str, timeout_s: float = 30.0) -> str:
        """``rabbitmqctl -n <this node> ...`` with this node's cookie; its output."""
        ctl = Path(self.binary).with_name("rabbitmqctl")
        done = subprocess.run(
            [str(ctl), "-n", self.node, *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        return done.stdout

    def queues(self) -> dict[str, dict[str, str]]:
        """Every queue of the default vhost: type, durability, ready and unacked messages."""
        out = self.ctl(
            "list_queues",
            "--quiet",
            "--no-table-headers",
            "name",
            "type",
            "durable",
            "messages_ready",
            "messages_unacknowledged",
        )
        rows = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 5:
                rows[parts[0]] = dict(zip(("type", "durable", "ready", "unacked"), parts[1:]))
        return rows

    def port_open(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRabbitMQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()
