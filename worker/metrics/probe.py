"""A container health check: ``python -m worker.metrics.probe /readyz`` exits 0 when the
worker on this host answers 200 on ``RERANKQ_METRICS_PORT`` (at ``RERANKQ_METRICS_HOST``), 1
otherwise (the reason on stderr)."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else "/healthz"
    from kernel.errors import ConfigError
    from kernel.settings import load_settings

    try:
        metrics = load_settings().metrics
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    port = metrics.port
    if port is None:
        print("RERANKQ_METRICS_PORT is not set: the worker serves no health endpoint", file=sys.stderr)
        return 1
    host = metrics.host.strip()
    if host in ("", "0.0.0.0", "::"):  # every address: this host's loopback is one of them
        host = "127.0.0.1"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return 0 if reply.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(f"{url} answered {exc.code}: {exc.read()[:500].decode(errors='replace')}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
