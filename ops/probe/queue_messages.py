"""Hostile queue messages against a real worker: ``python -m ops.probe.queue_messages``.

Starts a private redis-server and a real ``python -m worker --device cpu`` (the ``rrf``
provider: no model to load), takes a real message envelope from the queue, and injects one
hostile variant at a time into the worker's queue: body shapes Celery's strategy cannot
unpack, an undecodable base64 body, an envelope that is a JSON list or not JSON at all,
Celery's built-in task names, a far-future ETA, a chained callback. After each it opens a
good stream and checks that its window is scored, that the worker is still the same
process, that the hostile message is not held unacknowledged, and that the worker counted
it on ``rerankq_task_messages_refused_total``. A worker that died is started again, so each
probe is judged on its own.

One line per probe, ``probe <name>: ok`` or ``probe <name>: FAIL <why>``; the exit status is
non-zero on any failure. Loopback only; bounded by ``--timeout-s`` per probe.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from producer import RerankClient, load_settings
from producer.celery_config import TASK_NAME
from worker.embedded.redis_server import EmbeddedRedis, free_port
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
REFUSED_METRIC = "rerankq_task_messages_refused_total"
#: kombu's Redis transport keeps unacknowledged messages in this hash (one per Redis db).
UNACKED_HASH = "unacked"
FAR_FUTURE = "2999-01-01T00:00:00+00:00"
NO_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _b64(value: Any) -> str:
    return base64.b64encode(json.dumps(value).encode()).decode()


def _with_body(template: dict[str, Any], body: Any) -> bytes:
    return json.dumps({**template, "body": _b64(body)}).encode()


def _with_headers(template: dict[str, Any], body: Any | None = None, **headers: Any) -> bytes:
    envelope = {**template, "headers": {**template["headers"], **headers}}
    if body is not None:
        envelope["body"] = _b64(body)
    return json.dumps(envelope).encode()


def hostile_entries(template: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(name, raw Redis list entry) for each hostile message, built from a real envelope
    ``template`` (a message rerankq sent, parsed from the queue's list)."""
    args = json.loads(base64.b64decode(template["body"]))[0]
    return [
        ("body-object", _with_body(template, {"a": 1})),
        ("body-pair", _with_body(template, [1, 2])),
        ("body-args-kwargs", _with_body(template, [args, {}])),
        ("body-string", _with_body(template, "hello")),
        ("body-null", _with_body(template, None)),
        ("body-args-not-a-list", _with_body(template, [{"stream_id": 1}, {}, NO_EMBED])),
        ("body-embed-not-a-map", _with_body(template, [args, {}, [1]])),
        ("body-three-args", _with_body(template, [[*args, 1], {}, NO_EMBED])),
        ("body-callback", _with_body(template, [args, {}, {**NO_EMBED, "callbacks": [
            {"task": "celery.accumulate", "args": [], "kwargs": {}, "options": {}}]}])),
        ("body-invalid-base64", json.dumps({**template, "body": "@@@@x"}).encode()),
        ("body-invalid-json", json.dumps({**template, "body": base64.b64encode(b"{not json").decode()}).encode()),
        ("body-pickle", json.dumps({**template, "content-type": "application/x-python-serialize"}).encode()),
        ("envelope-list", json.dumps([template, "x", "y"]).encode()),
        ("envelope-no-properties", json.dumps({k: v for k, v in template.items() if k != "properties"}).encode()),
        ("envelope-headers-list", json.dumps({**template, "headers": [1, 2]}).encode()),
        ("envelope-delivery-info-list", json.dumps(
            {**template, "properties": {**template["properties"], "delivery_info": [1]}}).encode()),
        ("raw-not-json", b"not json at all \xff"),
        ("headers-timelimit", _with_headers(template, timelimit=[1])),
        ("headers-no-id", _with_headers(template, id=None)),
        ("task-celery.accumulate", _with_headers(template, [[1, 2], {}, NO_EMBED], task="celery.accumulate")),
        ("task-celery.backend_cleanup", _with_headers(template, [[], {}, NO_EMBED], task="celery.backend_cleanup")),
        ("task-celery.map", _with_headers(template, [[{"task": TASK_NAME, "args": [], "kwargs": {}, "options": {}},
                                                     [args]], {}, NO_EMBED], task="celery.map")),
        ("task-celery.chord_unlock", _with_headers(template, [["g"], {}, NO_EMBED], task="celery.chord_unlock")),
        ("task-unknown", _with_headers(template, task="not.a.task")),
        ("eta-far-future", _with_headers(template, eta=FAR_FUTURE)),
    ]


def worker_env(redis_url: str, namespace: str, metrics_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({
        "RERANKQ_REDIS_URL": redis_url,
        "RERANKQ_NAMESPACE": namespace,
        "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
        "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
        "RERANKQ_ANY_QUEUE": f"{namespace}.any",
        "RERANKQ_RERANKER_PROVIDER": "rrf",
        "RERANKQ_METRICS_PORT": str(metrics_port),
        "RERANKQ_METRICS_HOST": "127.0.0.1",
        "RERANKQ_SWEEP_INTERVAL_S": "1",
        "PYTHONPATH": str(ROOT),
    })
    return env


def refused_count(port: int) -> float:
    """The worker's refused-message counter, summed over its labels (0 when absent or unreachable)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0.0
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == REFUSED_METRIC)


def held_entries(raw: redis.Redis, queue: str) -> list[bytes]:
    """Unacknowledged messages of ``queue`` in kombu's unacked hash."""
    out = []
    for value in raw.hvals(UNACKED_HASH):
        try:
            _, _, routing_key = json.loads(value)
        except (ValueError, TypeError):
            continue
        if routing_key == queue:
            out.append(value)
    return out


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class QueueProbe:
    """One private Redis and one worker; probes run one at a time against them."""

    def __init__(self, directory: Path, timeout_s: float) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        self.redis = EmbeddedRedis(directory=str(directory / "redis"))
        self.namespace = "probe" + uuid.uuid4().hex[:8]
        self.queue = f"{self.namespace}.cpu"
        self.metrics_port = free_port()
        self.worker: WorkerProcess | None = None
        self.starts = 0

    def __enter__(self) -> QueueProbe:
        (self.directory / "redis").mkdir(parents=True, exist_ok=True)
        self.redis.start()
        self.env = worker_env(self.redis.url, self.namespace, self.metrics_port)
        self.raw = redis.Redis.from_url(self.redis.url)
        self.client = RerankClient(load_settings(self.env))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.client.close()
        self.raw.close()
        self.redis.stop()

    def template(self) -> dict[str, Any]:
        """A real envelope: a stream opened with no worker running leaves its message in the list."""
        self.client.open("template query", _candidates(3), window_size=3)
        entry = self.raw.lindex(self.queue, 0)
        assert entry is not None, f"no message in {self.queue}"
        return json.loads(entry)

    def start_worker(self) -> None:
        self.starts += 1
        log = self.directory / f"worker-{self.starts}.log"
        self.worker = WorkerProcess.rerankq(self.env, log, "--device", "cpu", cwd=ROOT).start()

    def worker_alive(self) -> bool:
        return self.worker is not None and self.worker.proc is not None and self.worker.proc.poll() is None

    def good_window_scored(self) -> bool:
        stream = self.client.open("payment gateway error", _candidates(4), window_size=4)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            page = self.client.pull(stream, 0, 4, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if page.complete:
                return all(row.kind == "ranked" for row in page.rows)
            if not self.worker_alive():
                return False
        return False

    def run(self, name: str, entry: bytes) -> str | None:
        """Why this probe failed, or None."""
        assert self.worker is not None and self.worker.proc is not None
        pid = self.worker.proc.pid
        before = refused_count(self.metrics_port)
        self.raw.lpush(self.queue, entry)
        if not self.good_window_scored():
            return "a good window sent after it was not scored" + ("" if self.worker_alive() else " (worker exited)")
        if not self.worker_alive() or self.worker.proc.pid != pid:
            return f"the worker exited ({self.worker.proc.poll() if self.worker.proc else '?'})"
        if not wait_until(lambda: not held_entries(self.raw, self.queue), 3.0):
            return "the message is held unacknowledged (restored at every shutdown)"
        if not wait_until(lambda: refused_count(self.metrics_port) > before, 3.0):
            return f"not counted on {REFUSED_METRIC}"
        return None


def _candidates(n: int) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "text": f"payment gateway error number {i}"} for i in range(n)]


def probes(template: dict[str, Any], only: list[str] | None) -> Iterator[tuple[str, bytes]]:
    for name, entry in hostile_entries(template):
        if not only or name in only:
            yield name, entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.probe.queue_messages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-s", type=float, default=20.0, help="how long a good window may take after each probe")
    parser.add_argument("--only", nargs="*", help="run only these probes (names as printed)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory and print where it is")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="rerankq-probe-queue-"))
    failures = 0
    with QueueProbe(directory, args.timeout_s) as probe:
        template = probe.template()
        probe.start_worker()
        if not probe.good_window_scored():
            print(f"probe baseline: FAIL the worker scores no window; see {directory}")
            return 1
        for name, entry in probes(template, args.only):
            why = probe.run(name, entry)
            print(f"probe {name}: ok" if why is None else f"probe {name}: FAIL {why}", flush=True)
            if why is not None:
                failures += 1
                if not probe.worker_alive():
                    probe.worker.stop() if probe.worker else None
                    probe.raw.delete(probe.queue, UNACKED_HASH, UNACKED_HASH + "_index")
                    probe.start_worker()
    if args.keep or failures:
        print(f"logs: {directory}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
