"""Reading a real /metrics endpoint the way Prometheus does: over HTTP, parsed by
prometheus-client's own parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def get(port: int, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def status_of(port: int, path: str) -> int:
    """The status a path answers, or 0 while nothing listens."""
    try:
        return get(port, path)[0]
    except (urllib.error.URLError, OSError):
        return 0


def get_json(port: int, path: str) -> tuple[int, Any]:
    status, body = get(port, path)
    return status, json.loads(body)


def scrape(port: int) -> list[Sample]:
    status, body = get(port, "/metrics")
    assert status == 200, body[:500]
    return [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` whose labels include ``labels``."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def series(samples: list[Sample], name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for s in samples if s.name == name]
