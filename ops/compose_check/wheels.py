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

from ops.compose_check.common import CheckFailed, log, reachable, run

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


def torch_build_args(sources: PipSources, stack: contextlib.ExitStack) -> list[str]:
    """Build arguments for torch: none when the PyTorch CPU index answers, else the local +cpu
    wheel served on loopback for as long as ``stack`` is open (the rest then comes from PyPI)."""
    if reachable("https://download.pytorch.org/whl/cpu/"):
        return []
    torch_wheels = [w for d in sources.find_links for w in sorted(d.glob("torch-*+cpu-*.whl"))]
    if not torch_wheels:
        raise CheckFailed("the PyTorch CPU index is unreachable and no local torch +cpu wheel is configured")
    wheel = torch_wheels[-1]
    version = wheel.name.split("-")[1]
    url = stack.enter_context(serve_directory(wheel.parent))
    log(f"PyTorch index unreachable: torch=={version} from {wheel.parent} (served on {url}), the rest from PyPI")
    return [
        "--build-arg",
        "TORCH_CPU_INDEX=https://pypi.org/simple",
        "--build-arg",
        f"TORCH_SPEC=torch=={version}",
        "--build-arg",
        f"PIP_BUILD_FIND_LINKS={url}",
    ]
