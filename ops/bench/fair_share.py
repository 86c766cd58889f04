"""Fair share: tenant B's interactive rerank while tenant A floods the same device queue.

One private Redis, one CPU worker (``--processes``, prefork, the bench cross-encoder on the
``local`` member: MiniLM-L6-sized, ``ops/bench/common.py`` ``bench_model``), and the gateway
with two API keys, tenant A and tenant B. Tenant B calls ``POST /v2/rerank`` with two
documents, one call after another, each a new query (every call opens a stream and waits for
its window). Its latency is measured in phases, in rounds (``--rounds``; the host is shared,
so each flood is compared with the idle phase right before it):

1. ``idle``: nothing else runs;
2. ``count flood``: tenant A keeps at least 80 one-candidate windows uncommitted, through
   ``POST /v1/streams`` (streams of 40 windows, every window admitted at open: the issue's
   flood), for the whole phase; then A's backlog drains, and the next round starts;

and after the rounds, an idle phase and then

3. ``cost flood``: tenant A opens one passages stream of 256 documents of 1,200 words
   (``passage_tokens=16``, ``max_passages=128``: 128 passages a document, 25 documents a
   window), which keeps the worker busy for longer than the phase; the run checks it did.

The worker runs with the fair share sized to it: ``RERANKQ_TENANT_QUEUED_WINDOWS`` one fewer
than its processes (``--share``: a flooding tenant leaves a process to the others; at the
process count, B's window waits for one of A's to end), ``RERANKQ_TENANT_QUEUED_TOKENS`` its
default (one of the cost flood's windows fits it). ``--unshared`` runs the
same with both at their maximum, what the queue did before fair share (B's call waits behind
A's whole backlog: expect timeouts, counted, under the cost flood).

Reported per phase: B's p50 and p95 (ms), the calls that failed, and each flood's p50 over the
p50 of the idle phase before it (the count flood: the median of the rounds'; the goal: at most 2).

    python -m ops.bench.fair_share --quick --json /tmp/fair_share.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis

from kernel.fair_share import bucket_for
from kernel.keys import Keys
from ops.bench.common import bench_model, p50, percentile, print_table, rerankq_worker, worker_env, write_json
from ops.bench.gateway import start_gateway
from producer.gateway.auth import digest, new_key
from worker.embedded.redis_server import EmbeddedRedis, free_port

NAMESPACE = "bfs"
#: Tenant A's count flood keeps at least this many windows not committed (most of them waiting for its share).
FLOOD_BACKLOG = 80
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
    """Tenant A's windows on the cpu queue, read from the fair-share ledger: waiting for its share,
    and sent and not committed (with the shares at their maximum, every window is sent)."""

    def __init__(self, redis_url: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.queued = Keys(NAMESPACE).fair_share("cpu").queued
        self.bucket = bucket_for("tenant-a", "interactive", "")

    def a_in_flight(self) -> int:
        return int(self.client.hget(self.queued, f"{self.bucket} w") or 0)

    def a_backlog(self) -> int:
        """A's windows not committed: waiting, and sent."""
        waiting, sent = self.client.hmget(self.queued, f"{self.bucket} n", f"{self.bucket} w")
        return int(waiting or 0) + int(sent or 0)


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
    """Tenant A's streams of one-candidate windows, opened whenever fewer than FLOOD_BACKLOG are not committed."""

    def __init__(self, tenants: Tenants, ledger: Ledger) -> None:
        self.tenants, self.ledger = tenants, ledger
        self.stop = threading.Event()
        self.opened = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.ledger.a_backlog() < FLOOD_BACKLOG:
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
        while self.ledger.a_backlog() < FLOOD_BACKLOG // 2:
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
    while ledger.a_backlog() or ledger.a_in_flight():
        if time.monotonic() > deadline:
            raise RuntimeError("tenant A's backlog did not drain")
        time.sleep(0.2)


def warm(tenants: Tenants, processes: int) -> None:
    """Calls in parallel, so every process loads the model before anything is measured."""
    with ThreadPoolExecutor(processes) as pool:
        list(pool.map(tenants.b_rerank, [f"warm {i}" for i in range(4 * processes)]))


def open_cost_flood(tenants: Tenants) -> str:
    return tenants.a_open(
        {
            "query": "a cost flood: why did checkout fail",
            "candidates": [{"id": f"c{i}", "text": long_text(i, COST_WORDS)} for i in range(COST_DOCUMENTS)],
            "long_documents": "passages",
            "passage_tokens": 16,
            "max_passages": 128,
            "first_windows": -(-COST_DOCUMENTS // 25),
        }
    )


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 calls a phase (else 4 of 20)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of idle, then count flood")
    parser.add_argument("--calls", type=int, default=None, help="tenant B's calls per phase")
    parser.add_argument("--processes", type=int, default=2, help="the worker's pool processes")
    parser.add_argument(
        "--share",
        type=int,
        default=None,
        help="RERANKQ_TENANT_QUEUED_WINDOWS (default: one process fewer than --processes)",
    )
    parser.add_argument("--unshared", action="store_true", help="the shares at their maximum: no fair share")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args(argv)


def write_keys_file(logs: Path, keys: dict[str, str]) -> Path:
    path = logs / "keys.json"
    path.write_text(
        "[" + ",".join(f'{{"key_sha256": "{digest(k)}", "tenant": "tenant-{n}"}}' for n, k in keys.items()) + "]"
    )
    return path


def fair_share_env(args: argparse.Namespace, redis_url: str, keys_file: Path, share: int) -> dict[str, str]:
    shares = UNSHARED if args.unshared else {"RERANKQ_TENANT_QUEUED_WINDOWS": str(share)}
    return worker_env(
        redis_url,
        NAMESPACE,
        RERANKQ_RERANKER_PROVIDER="local",
        RERANKQ_RERANKER_MODEL=str(bench_model("minilm", "random")),
        RERANKQ_PAIR_CACHE="false",
        RERANKQ_WORKER_PROCESSES=str(args.processes),
        RERANKQ_TORCH_THREADS="1",
        RERANKQ_GATEWAY_KEYS_FILE=str(keys_file),
        **shares,
    )


@dataclasses.dataclass
class Phases:
    """Tenant B's phases: idle (one before each flood), count flood per round, and the cost flood."""

    idle: list[dict[str, Any]]
    count: list[dict[str, Any]]
    cost: dict[str, Any]
    cost_stream_unfinished: bool


def run_phases(tenants: Tenants, ledger: Ledger, *, rounds: int, calls: int) -> Phases:
    idle: list[dict[str, Any]] = []
    count: list[dict[str, Any]] = []
    for r in range(rounds):
        idle.append(b_phase(tenants, f"idle {r}", calls))
        with CountFlood(tenants, ledger) as flood:
            count.append(b_phase(tenants, f"count flood {r}", calls, during=ledger.a_backlog))
        print(f"  (tenant A opened {flood.opened} streams of {FLOOD_WINDOWS} windows)", flush=True)
        wait_drained(ledger, timeout_s=600)
    idle.append(b_phase(tenants, "idle before the cost flood", calls))
    cost_stream = open_cost_flood(tenants)
    cost = b_phase(tenants, "cost flood", calls, during=ledger.a_in_flight)
    windows = tenants.http["a"].get(f"/v1/streams/{cost_stream}").json()["windows"]
    return Phases(idle, count, cost, any(w["state"] != "committed" for w in windows))


def measure(args: argparse.Namespace, *, rounds: int, calls: int) -> tuple[Phases, int]:
    """Start Redis, the worker and the gateway, run tenant B's phases, stop them; the phases and the share."""
    keys = {"a": new_key(), "b": new_key()}
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-fair-share-"))
    keys_file = write_keys_file(logs, keys)
    redis_server = EmbeddedRedis(directory=str(logs)).start()
    share = args.share or max(1, args.processes - 1)
    env = fair_share_env(args, redis_server.url, keys_file, share)
    worker = rerankq_worker(env, logs / "worker.log")
    port = free_port()
    gateway = None
    tenants = None
    try:
        worker.start(timeout_s=300)
        gateway = start_gateway(env, port, logs / "gateway.log", 1, auth=())
        tenants = Tenants(f"http://127.0.0.1:{port}", keys)
        ledger = Ledger(redis_server.url)
        warm(tenants, args.processes)
        print(f"tenant B: {rounds} rounds, {calls} calls a phase; logs in {logs}", flush=True)
        phases = run_phases(tenants, ledger, rounds=rounds, calls=calls)
    finally:
        if tenants is not None:
            tenants.close()
        if gateway is not None:
            gateway.terminate()
            with contextlib.suppress(Exception):
                gateway.wait(timeout=30)
        worker.kill()
        redis_server.stop()
    return phases, share


def phase_ratio(flood: dict[str, Any], before: dict[str, Any]) -> float:
    if not flood["latencies_ms"] or not before["latencies_ms"]:
        return float("inf")
    return p50(flood["latencies_ms"]) / p50(before["latencies_ms"])


def all_latencies(phases: list[dict[str, Any]]) -> list[float]:
    return [ms for phase in phases for ms in phase["latencies_ms"]]


def fair_share_figures(
    args: argparse.Namespace, phases: Phases, *, rounds: int, calls: int, share: int
) -> dict[str, Any]:
    idle_all, count_all, cost = all_latencies(phases.idle), all_latencies(phases.count), phases.cost
    count_ratios = [phase_ratio(flood, before) for flood, before in zip(phases.count, phases.idle)]
    return {
        "date": time.strftime("%Y-%m-%d"),
        "rounds": rounds,
        "calls_per_phase": calls,
        "processes": args.processes,
        "share_windows": None if args.unshared else share,
        "unshared": args.unshared,
        "idle_ms_p50": p50(idle_all),
        "idle_ms_p95": percentile(idle_all, 0.95),
        "count_flood_ms_p50": p50(count_all) if count_all else None,
        "count_flood_ms_p95": percentile(count_all, 0.95) if count_all else None,
        "count_flood_failed": sum(phase["failed"] for phase in phases.count),
        "count_flood_ratio_per_round": count_ratios,
        "count_flood_ratio_median": statistics.median(count_ratios),
        "count_flood_a_backlog_min": min(min(phase["flood_seen"]) for phase in phases.count),
        "cost_flood_ms_p50": p50(cost["latencies_ms"]) if cost["latencies_ms"] else None,
        "cost_flood_ms_p95": percentile(cost["latencies_ms"], 0.95) if cost["latencies_ms"] else None,
        "cost_flood_failed": cost["failed"],
        "cost_flood_ratio": phase_ratio(cost, phases.idle[-1]),
        "cost_flood_a_in_flight_min": min(cost["flood_seen"]),
        "cost_flood_outlasted_the_phase": phases.cost_stream_unfinished,
    }


def phase_row(name: str, latencies: list[float], failed: int, against: str) -> list[Any]:
    if not latencies:
        return [name, 0, float("nan"), float("nan"), failed, against]
    return [name, len(latencies), p50(latencies), percentile(latencies, 0.95), failed, against]


def print_phases(args: argparse.Namespace, phases: Phases, figures: dict[str, Any], share: int) -> None:
    count_ratios = figures["count_flood_ratio_per_round"]
    print_table(
        f"fair share: tenant B's POST /v2/rerank (2 documents) under tenant A's flood, {args.processes}-process "
        f"worker, {'no fair share' if args.unshared else f'a share of {share} windows'}",
        ["phase", "answered", "p50 ms", "p95 ms", "failed", "p50 / idle p50"],
        [
            phase_row("idle (every idle phase)", all_latencies(phases.idle), 0, ""),
            phase_row(
                "count flood",
                all_latencies(phases.count),
                figures["count_flood_failed"],
                f"{figures['count_flood_ratio_median']:.2f} (median of rounds: "
                + ", ".join(f"{r:.2f}" for r in count_ratios)
                + ")",
            ),
            phase_row(
                "cost flood",
                phases.cost["latencies_ms"],
                phases.cost["failed"],
                f"{figures['cost_flood_ratio']:.2f} (against the idle phase before)",
            ),
        ],
    )
    print(
        f"\ntenant A while B called: at least {figures['count_flood_a_backlog_min']} windows not committed "
        "(count flood), "
        f"at least {figures['cost_flood_a_in_flight_min']} window in flight (cost flood); the cost flood's stream "
        f"still running at the end: {phases.cost_stream_unfinished}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    calls = args.calls or (10 if args.quick else 20)
    phases, share = measure(args, rounds=rounds, calls=calls)
    figures = fair_share_figures(args, phases, rounds=rounds, calls=calls, share=share)
    print_phases(args, phases, figures, share)
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
