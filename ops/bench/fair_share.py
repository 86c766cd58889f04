"""Fair share: tenant B's interactive rerank while tenant A floods the same device queue.

One private Redis, one CPU worker (``--processes``, prefork, the bench cross-encoder on the
``local`` member: MiniLM-L6-sized, ``ops/bench/common.py`` ``bench_model``), and the gateway
with two API keys, tenant A and tenant B. Tenant B calls ``POST /v2/rerank`` with two
documents, one call after another, each a new query (every call opens a stream and waits for
its window). Its latency is measured in four phases, in this order:

1. ``idle``: nothing else runs;
2. ``count flood``: tenant A keeps at least 80 one-candidate windows waiting, through
   ``POST /v1/streams`` (streams of 40 windows, every window admitted at open: the issue's
   flood), for the whole phase;
3. ``idle again``, once A's backlog drained (the two idle phases make the baseline);
4. ``cost flood``: tenant A opens one passages stream of 256 documents of 1,200 words
   (``passage_tokens=16``, ``max_passages=128``: 128 passages a document, 25 documents a
   window), which keeps the worker busy for longer than the phase; the run checks it did.

The worker runs with the fair share sized to it: ``RERANKQ_TENANT_QUEUED_WINDOWS`` is the
worker's process count, ``RERANKQ_TENANT_QUEUED_TOKENS`` its default. ``--unshared`` runs the
same with both at their maximum, what the queue did before fair share (B's call waits behind
A's whole backlog: expect timeouts, counted, under the cost flood).

Reported per phase: B's p50 and p95 (ms), the calls that failed, and each flood's p50 over the
idle p50 (the goal: at most 2).

    python -m ops.bench.fair_share --quick --json /tmp/fair_share.json
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from ops.bench.common import bench_model, p50, percentile, print_table, rerankq_worker, worker_env, write_json
from ops.bench.gateway import start_gateway
from producer.fair_share import bucket_for
from producer.gateway.auth import digest, new_key
from producer.keys import Keys
from worker.embedded.redis_server import EmbeddedRedis, free_port

NAMESPACE = "bfs"
#: Tenant A's count flood keeps at least this many windows waiting for its share.
FLOOD_WAITING = 80
FLOOD_WINDOWS = 40
COST_DOCUMENTS = 256
COST_WORDS = 1200
B_TIMEOUT_S = 30
UNSHARED = {"RERANKQ_TENANT_QUEUED_WINDOWS": "1000000", "RERANKQ_TENANT_QUEUED_TOKENS": str(2**40)}
WORDS = (
    "the checkout service returned errors after a certificate rotation on the payment gateway while "
    "operators restarted the ingress proxies and the database replicas caught up with the primary"
).split()


def long_text(i: int, words: int) -> str:
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(words))


class Tenants:
    """The gateway's two keys and the calls each tenant makes."""

    def __init__(self, url: str, keys: dict[str, str]) -> None:
        self.http = {
            name: httpx.Client(base_url=url, timeout=B_TIMEOUT_S + 30, headers={"Authorization": f"Bearer {key}"})
            for name, key in keys.items()
        }

    def b_rerank(self, query: str) -> tuple[float, int]:
        """One of tenant B's calls: (milliseconds, status)."""
        started = time.perf_counter()
        answer = self.http["b"].post(
            "/v2/rerank",
            json={
                "model": "m",
                "query": query,
                "documents": ["the gateway returned 502 after a certificate expired", "the printer on floor 3"],
            },
            headers={"X-Rerankq-Timeout": str(B_TIMEOUT_S)},
        )
        return (time.perf_counter() - started) * 1000, answer.status_code

    def a_open(self, body: dict[str, Any]) -> str:
        answer = self.http["a"].post("/v1/streams", json=body)
        if answer.status_code != 201:
            raise RuntimeError(f"tenant A's open answered {answer.status_code}: {answer.text[:300]}")
        return str(answer.json()["stream_id"])

    def close(self) -> None:
        for client in self.http.values():
            client.close()


class Ledger:
    """Tenant A's windows waiting for its share of the cpu queue, read from the ledger."""

    def __init__(self, redis_url: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.queued = Keys(NAMESPACE).fair_share("cpu").queued
        self.field = bucket_for("tenant-a", "interactive", "") + " n"

    def a_waiting(self) -> int:
        return int(self.client.hget(self.queued, self.field) or 0)

    def a_in_flight(self) -> int:
        return int(self.client.hget(self.queued, bucket_for("tenant-a", "interactive", "") + " w") or 0)


def b_phase(tenants: Tenants, name: str, calls: int, during: Any = None) -> dict[str, Any]:
    """Tenant B's calls in one phase; ``during()`` is checked after each (the flood still on)."""
    latencies, failed, flood_seen = [], 0, []
    for i in range(calls):
        ms, status = tenants.b_rerank(f"{name} {i} {uuid.uuid4().hex[:8]} why did checkout fail")
        if status == 200:
            latencies.append(ms)
        else:
            failed += 1
        if during is not None:
            flood_seen.append(during())
    print(f"  {name}: {len(latencies)} answered, {failed} failed, p50 {p50(latencies) if latencies else 0:.0f} ms")
    return {"latencies_ms": latencies, "failed": failed, "flood_seen": flood_seen}


class CountFlood:
    """Tenant A's streams of one-candidate windows, opened whenever fewer than FLOOD_WAITING wait."""

    def __init__(self, tenants: Tenants, ledger: Ledger) -> None:
        self.tenants, self.ledger = tenants, ledger
        self.stop = threading.Event()
        self.opened = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.ledger.a_waiting() < FLOOD_WAITING:
                    n = self.opened
                    self.tenants.a_open(
                        {
                            "query": f"a flood {n}",
                            "candidates": [{"id": f"a{n}-{i}", "text": f"note {i}"} for i in range(FLOOD_WINDOWS)],
                            "window_size": 1,
                            "first_windows": FLOOD_WINDOWS,
                        }
                    )
                    self.opened += 1
                else:
                    time.sleep(0.05)
        except BaseException as exc:  # reported by the phase, not lost in the thread
            self.error = exc

    def __enter__(self) -> CountFlood:
        self.thread.start()
        deadline = time.monotonic() + 60
        while self.ledger.a_waiting() < FLOOD_WAITING // 2:
            if self.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tenant A's flood did not build up: {self.error!r}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise RuntimeError(f"tenant A's flood failed: {self.error!r}")


def wait_drained(ledger: Ledger, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while ledger.a_waiting() or ledger.a_in_flight():
        if time.monotonic() > deadline:
            raise RuntimeError("tenant A's backlog did not drain")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="15 calls a phase (else 60)")
    parser.add_argument("--calls", type=int, default=None, help="tenant B's calls per phase")
    parser.add_argument("--processes", type=int, default=2, help="the worker's pool processes")
    parser.add_argument("--unshared", action="store_true", help="the shares at their maximum: no fair share")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    calls = args.calls or (15 if args.quick else 60)

    keys = {"a": new_key(), "b": new_key()}
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-fair-share-"))
    (logs / "keys.json").write_text(
        "[" + ",".join(f'{{"key_sha256": "{digest(k)}", "tenant": "tenant-{n}"}}' for n, k in keys.items()) + "]"
    )
    redis_server = EmbeddedRedis(directory=str(logs)).start()
    shares = UNSHARED if args.unshared else {"RERANKQ_TENANT_QUEUED_WINDOWS": str(args.processes)}
    env = worker_env(
        redis_server.url,
        NAMESPACE,
        RERANKQ_RERANKER_PROVIDER="local",
        RERANKQ_RERANKER_MODEL=str(bench_model("minilm", "random")),
        RERANKQ_PAIR_CACHE="false",
        RERANKQ_WORKER_PROCESSES=str(args.processes),
        RERANKQ_TORCH_THREADS="1",
        RERANKQ_GATEWAY_KEYS_FILE=str(logs / "keys.json"),
        **shares,
    )
    worker = rerankq_worker(env, logs / "worker.log")
    port = free_port()
    gateway = None
    tenants = None
    phases: dict[str, dict[str, Any]] = {}
    cost_stream_unfinished = None
    try:
        worker.start(timeout_s=300)
        gateway = start_gateway(env, port, logs / "gateway.log", 1, auth=())
        tenants = Tenants(f"http://127.0.0.1:{port}", keys)
        ledger = Ledger(redis_server.url)
        for i in range(5):  # warm: the model in both processes, connections, scripts
            tenants.b_rerank(f"warm {i}")
        print(f"tenant B: {calls} calls a phase; logs in {logs}", flush=True)
        phases["idle"] = b_phase(tenants, "idle", calls)
        with CountFlood(tenants, ledger) as flood:
            phases["count flood"] = b_phase(tenants, "count flood", calls, during=ledger.a_waiting)
        print(f"  (tenant A opened {flood.opened} streams of {FLOOD_WINDOWS} windows)", flush=True)
        wait_drained(ledger, timeout_s=600)
        phases["idle again"] = b_phase(tenants, "idle again", calls)
        cost_stream = tenants.a_open(
            {
                "query": "a cost flood: why did checkout fail",
                "candidates": [{"id": f"c{i}", "text": long_text(i, COST_WORDS)} for i in range(COST_DOCUMENTS)],
                "long_documents": "passages",
                "passage_tokens": 16,
                "max_passages": 128,
                "first_windows": -(-COST_DOCUMENTS // 25),
            }
        )
        phases["cost flood"] = b_phase(tenants, "cost flood", calls, during=ledger.a_in_flight)
        windows = tenants.http["a"].get(f"/v1/streams/{cost_stream}").json()["windows"]
        cost_stream_unfinished = any(w["state"] != "committed" for w in windows)
    finally:
        if tenants is not None:
            tenants.close()
        if gateway is not None:
            gateway.terminate()
            with contextlib.suppress(Exception):
                gateway.wait(timeout=30)
        worker.kill()
        redis_server.stop()

    idle = phases["idle"]["latencies_ms"] + phases["idle again"]["latencies_ms"]
    idle_p50 = p50(idle)
    figures: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "calls_per_phase": calls,
        "processes": args.processes,
        "unshared": args.unshared,
        "idle_ms_p50": idle_p50,
        "idle_ms_p95": percentile(idle, 0.95),
        "cost_flood_outlasted_the_phase": cost_stream_unfinished,
    }
    rows = [["idle (both phases)", len(idle), idle_p50, percentile(idle, 0.95), 0, ""]]
    for name in ("count flood", "cost flood"):
        phase = phases[name]
        latencies = phase["latencies_ms"]
        key = name.replace(" ", "_")
        ratio = p50(latencies) / idle_p50 if latencies else float("inf")
        figures[f"{key}_ms_p50"] = p50(latencies) if latencies else None
        figures[f"{key}_ms_p95"] = percentile(latencies, 0.95) if latencies else None
        figures[f"{key}_failed"] = phase["failed"]
        figures[f"{key}_ratio_p50"] = ratio
        figures[f"{key}_a_backlog_min"] = min(phase["flood_seen"]) if phase["flood_seen"] else None
        p95 = percentile(latencies, 0.95) if latencies else float("nan")
        rows.append([name, len(latencies), figures[f"{key}_ms_p50"] or float("nan"), p95, phase["failed"], ratio])
    print_table(
        f"fair share: tenant B's POST /v2/rerank (2 documents) under tenant A's flood, {args.processes}-process "
        f"worker, {'no fair share' if args.unshared else 'fair share sized to the worker'}",
        ["phase", "answered", "p50 ms", "p95 ms", "failed", "p50 / idle"],
        rows,
    )
    print(
        f"\ntenant A's backlog while B called: at least {figures['count_flood_a_backlog_min']} windows waiting "
        f"(count flood); cost flood stream still running at the end: {cost_stream_unfinished}"
    )
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
