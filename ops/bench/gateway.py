"""HTTP gateway: what a Cohere-shaped call costs over RerankClient, and requests per second.

1. Round trip, alternated in one run against one private Redis and one worker on an ``rrf``
   chain: ``RerankClient.open`` + ``pull`` of a 25-candidate one-window stream, against
   ``POST /v2/rerank`` of 25 documents through the gateway (a stdlib keep-alive connection,
   JSON encoded and decoded by the client). Every request is a new query, so every one opens a
   stream and waits for its window. The overhead is the difference of the percentiles.
2. Requests per second with 50 concurrent keep-alive clients (asyncio, raw HTTP/1.1), each
   request a new query: the gateway opening streams and waiting on commits.
3. The same with repeated requests: answered from the retained decisions, no window sent.

    python -m ops.bench.gateway --quick --json /tmp/gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel.settings import load_settings
from ops.bench.common import ROOT, p50, percentile, print_table, rerankq_worker, worker_env, write_json
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis, free_port

WINDOW = 25


def documents(tag: str) -> list[str]:
    return [f"{tag} incident note {i}: the gateway returned 502 after a certificate expired" for i in range(WINDOW)]


def start_gateway(
    env: dict[str, str], port: int, log_path: Path, workers: int, auth: Sequence[str] = ("--insecure-no-auth",)
) -> subprocess.Popen[bytes]:
    """The gateway, ready; ``auth``: its arguments for keys (none: the keys file in ``env``)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "producer.gateway",
                *auth,
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as answer:
                if answer.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"gateway did not start:\n{log_path.read_text()[-3000:]}")


class Caller:
    """One keep-alive connection, as a client library would hold it."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port)

    def rerank(self, query: str, docs: list[str]) -> dict:
        body = json.dumps({"model": "rrf", "query": query, "documents": docs})
        self.connection.request("POST", "/v2/rerank", body, {"Content-Type": "application/json"})
        answer = self.connection.getresponse()
        payload = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{answer.status}: {payload[:300]!r}")
        return json.loads(payload)


def cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """CPU seconds the gateway's processes have used (its server processes too, with --gateway-workers)."""
    import psutil

    parent = psutil.Process(proc.pid)
    return sum(p.cpu_times().user + p.cpu_times().system for p in [parent, *parent.children(recursive=True)])


def timed_client(client: RerankClient, query: str) -> float:
    start = time.perf_counter()
    stream = client.open(
        query,
        [{"id": str(i), "text": t} for i, t in enumerate(documents(query))],
        window_size=WINDOW,
        max_rerank_candidates=WINDOW,
    )
    page = client.pull(stream, 0, WINDOW, timeout=60)
    elapsed = (time.perf_counter() - start) * 1000
    if len(page.rows) != WINDOW:
        raise RuntimeError(f"{stream}: {len(page.rows)} rows")
    return elapsed


def timed_gateway(caller: Caller, query: str) -> float:
    start = time.perf_counter()
    answer = caller.rerank(query, documents(query))
    elapsed = (time.perf_counter() - start) * 1000
    if len(answer["results"]) != WINDOW:
        raise RuntimeError(f"{len(answer['results'])} results")
    return elapsed


async def load(port: int, concurrency: int, requests: int, *, repeat: bool, tag: str) -> tuple[float, list[float]]:
    """``requests`` POSTs over ``concurrency`` connections; returns (requests per second, latencies ms)."""
    latencies: list[float] = []
    counter = iter(range(requests))

    async def one_client(client_id: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in counter:
                query = f"{tag} repeated {client_id % 5}" if repeat else f"{tag} query {n}"
                body = json.dumps({"model": "rrf", "query": query, "documents": documents(query)}).encode()
                writer.write(
                    b"POST /v2/rerank HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                start = time.perf_counter()
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                latencies.append((time.perf_counter() - start) * 1000)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.split(b"\r\n")[0].decode())
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one_client(i) for i in range(concurrency)))
    return requests / (time.perf_counter() - start), latencies


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=None, help="round trips per arm")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--gateway-workers", type=int, default=1, help="gateway server processes")
    parser.add_argument("--worker-threads", type=int, default=8, help="threads of the one rrf worker")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


@dataclasses.dataclass
class RoundTrips:
    """Step 1: milliseconds per round trip of each arm, and the gateway's CPU per request."""

    client_ms: list[float]
    gateway_ms: list[float]
    cpu_ms: float


@dataclasses.dataclass
class Load:
    """Steps 2 and 3: requests per second, latencies, the gateway's CPU per request and windows committed."""

    rps: float
    load_ms: list[float]
    cpu_ms: float
    committed: int
    repeat_rps: float
    repeat_ms: list[float]
    committed_by_repeats: int


def round_trips(client: RerankClient, caller: Caller, gateway: subprocess.Popen[bytes], n: int) -> RoundTrips:
    for i in range(10):  # warm both paths: connections, scripts, first-call imports, thread pool
        timed_client(client, f"warm client {i}")
        timed_gateway(caller, f"warm gateway {i}")
    client_ms, gateway_ms = [], []
    cpu_before = cpu_s(gateway)
    for i in range(n):
        client_ms.append(timed_client(client, f"client {i}"))
        gateway_ms.append(timed_gateway(caller, f"gateway {i}"))
    cpu_ms = (cpu_s(gateway) - cpu_before) / n * 1000
    print(f"round trips: {n} each, alternated", flush=True)
    return RoundTrips(client_ms, gateway_ms, cpu_ms)


def under_load(
    client: RerankClient, gateway: subprocess.Popen[bytes], port: int, *, concurrency: int, n_load: int
) -> Load:
    def committed() -> int:
        return int(client.store.counters().get("windows_committed", 0))

    calls_before = committed()
    cpu_before = cpu_s(gateway)
    rps, load_ms = asyncio.run(load(port, concurrency, n_load, repeat=False, tag="load"))
    cpu_load_ms = (cpu_s(gateway) - cpu_before) / n_load * 1000
    calls_after = committed()
    repeat_rps, repeat_ms = asyncio.run(load(port, concurrency, n_load, repeat=True, tag="again"))
    return Load(rps, load_ms, cpu_load_ms, calls_after - calls_before, repeat_rps, repeat_ms, committed() - calls_after)


def measure(args: argparse.Namespace, *, n_round_trips: int, n_load: int) -> tuple[RoundTrips, Load]:
    """One private Redis, one rrf worker and the gateway: the round trips, then the load."""
    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-gateway-"))
    env = worker_env(redis_server.url, "bg", RERANKQ_RERANKER_PROVIDER="rrf")
    # A threads pool: an rrf window is Redis round trips, not compute, so windows overlap.
    worker = rerankq_worker(env, logs / "worker.log", "--pool", "threads", "--threads", str(args.worker_threads))
    port = free_port()
    gateway = None
    try:
        worker.start()
        gateway = start_gateway(env, port, logs / "gateway.log", args.gateway_workers)
        client = RerankClient(load_settings(env))
        trips = round_trips(client, Caller(port), gateway, n_round_trips)
        loaded = under_load(client, gateway, port, concurrency=args.concurrency, n_load=n_load)
        client.close()
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(timeout=30)
        worker.stop()
        redis_server.stop()
    return trips, loaded


def gateway_figures(args: argparse.Namespace, trips: RoundTrips, loaded: Load, *, n_load: int) -> dict[str, Any]:
    client_ms, gateway_ms = trips.client_ms, trips.gateway_ms
    return {
        "client_ms_p50": p50(client_ms),
        "client_ms_p95": percentile(client_ms, 0.95),
        "gateway_ms_p50": p50(gateway_ms),
        "gateway_ms_p95": percentile(gateway_ms, 0.95),
        "overhead_ms_p50": p50(gateway_ms) - p50(client_ms),
        "overhead_ms_p95": percentile(gateway_ms, 0.95) - percentile(client_ms, 0.95),
        "concurrency": args.concurrency,
        "requests_per_s": loaded.rps,
        "load_ms_p50": p50(loaded.load_ms),
        "load_ms_p95": percentile(loaded.load_ms, 0.95),
        "windows_committed_under_load": loaded.committed,
        "repeat_requests_per_s": loaded.repeat_rps,
        "repeat_ms_p50": p50(loaded.repeat_ms),
        "windows_committed_by_repeats": loaded.committed_by_repeats,
        "round_trips": len(client_ms),
        "load_requests": n_load,
        "gateway_workers": args.gateway_workers,
        "gateway_cpu_ms_per_request": trips.cpu_ms,
        "gateway_cpu_ms_per_request_under_load": loaded.cpu_ms,
    }


def print_gateway(figures: dict[str, Any], trips: RoundTrips, loaded: Load, concurrency: int) -> None:
    print_table(
        "gateway: one 25-document window per request, rrf chain, private redis, same run",
        ["arm", "n", "p50 ms", "p95 ms"],
        [
            ["RerankClient.open + pull", len(trips.client_ms), figures["client_ms_p50"], figures["client_ms_p95"]],
            ["POST /v2/rerank (gateway)", len(trips.gateway_ms), figures["gateway_ms_p50"], figures["gateway_ms_p95"]],
            ["overhead (difference)", "", figures["overhead_ms_p50"], figures["overhead_ms_p95"]],
            [
                f"{concurrency} concurrent clients, new queries",
                len(loaded.load_ms),
                figures["load_ms_p50"],
                figures["load_ms_p95"],
            ],
            [
                f"{concurrency} concurrent clients, repeated queries",
                len(loaded.repeat_ms),
                figures["repeat_ms_p50"],
                percentile(loaded.repeat_ms, 0.95),
            ],
        ],
    )
    print(
        f"\nrequests per second, {concurrency} concurrent clients: {loaded.rps:.0f} new queries "
        f"({loaded.committed} windows committed), {loaded.repeat_rps:.0f} repeated "
        f"({loaded.committed_by_repeats} windows committed)"
    )
    print(f"gateway CPU per request: {trips.cpu_ms:.2f} ms one at a time, {loaded.cpu_ms:.2f} ms under load")


def main() -> None:
    args = parse_arguments()
    n_round_trips = args.requests or (100 if args.quick else 400)
    n_load = 1000 if args.quick else 4000
    trips, loaded = measure(args, n_round_trips=n_round_trips, n_load=n_load)
    figures = gateway_figures(args, trips, loaded, n_load=n_load)
    print_gateway(figures, trips, loaded, args.concurrency)
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
