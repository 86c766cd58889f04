"""The host's pip settings handed to the image builds: its wheel directories served over HTTP, its CA
bundle."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ops.compose_check.common import run

WHEELS_PORT = 18765


@dataclass
class PipSources:
    find_links: list[Path] = field(default_factory=list)
    cert: Path | None = None


def host_pip_sources() -> PipSources:
    """Wheel directories and the CA bundle this host's pip uses (`pip config list` and PIP_* variables)."""
    found = PipSources()
    listed = run([sys.executable, "-m", "pip", "config", "list"], check=False, timeout=60).stdout or ""
    values: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values.setdefault(key.split(".", 1)[-1], []).append(value.strip().strip("'\""))
    for name in ("find-links",):
        for value in values.get(name, []) + [os.environ.get("PIP_FIND_LINKS", "")]:
            for item in value.split():
                path = Path(item.removeprefix("file://"))
                if path.is_dir() and path not in found.find_links:
                    found.find_links.append(path)
    for value in [os.environ.get("PIP_CERT", ""), *values.get("cert", [])]:
        if value and Path(value).is_file():
            found.cert = Path(value)
            break
    return found


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """The directory over HTTP on loopback, for a `--network host` build's pip --find-links."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    # A fixed port where it is free: the URL is a build argument, and the same one keeps the
    # build's layer cache across runs.
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass
