"""Windows committed per second on each deployment shape, side by side in one run, and an
estimate on paper of what a fleet scoring a million pairs a second needs.

Shapes (each with its own private servers and its own workers, all started at once; rounds
alternate which shape goes first, and only one shape is busy at a time, so machine noise hits
every shape alike):

- ``redis``: one redis-server is store and broker;
- ``cluster``: the store on a private Redis Cluster (three masters, three replicas), the
  broker on one redis-server;
- ``amqp``: RabbitMQ as the broker, the store on one redis-server;
- ``amqp+cluster``: RabbitMQ as the broker, the store on a second private Redis Cluster.

The RabbitMQ shapes run rerankq's own amqp configuration (``kernel.amqp_broker``: durable
quorum lane queues, publisher confirms, per-consumer prefetch 1) on a private RabbitMQ node
(``devservers.rabbitmq_server``) unless ``--amqp-url`` names a broker to use instead.

Then the cost of ``open`` itself: a stream of the same candidates opened with 1 and with
``--windows`` first windows, one open at a time, workers stopped, per shape: the extra windows
show what sending their messages costs (a Redis push each, or RabbitMQ publishes and confirms).
On RabbitMQ both ways of publishing are timed in the same run: rerankq's bursts (publish all,
wait once for their confirms) and Celery's own publish (a confirm wait per message).

A round opens ``--streams`` streams from ``--clients`` threads at once, every window of each
sent at open (25 candidates a window), and pulls each until it is complete; the provider does
nothing (``ops/bench/noop_provider.py``), so a window costs only the queue and the store.
Throughput is windows committed per second; ratios are to ``redis`` in the same round.

The estimate reads each server's own accounting (``INFO commandstats``, reset before the
measured rounds): the store's Lua calls per window and microseconds of server time per call,
the broker's server time per window. A Redis shard runs commands on one thread, so its ceiling
is about one second of server time per second: windows/s per shard = 1e6 / (store µs per
window). From that: shards (and Redis broker instances, each holding its share of the device
queues) for 1,000,000 pairs/s = 40,000 windows of 25 a second, kept at half their ceiling.

    python -m ops.bench.deployments --quick
    python -m ops.bench.deployments --json /tmp/deployments.json
    python -m ops.bench.deployments --amqp-url amqp://guest:guest@127.0.0.1:5672//   # a broker of your own
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

from devservers.rabbitmq_server import EmbeddedRabbitMQ, rabbitmq_server_binary
from devservers.redis_cluster import EmbeddedRedisCluster
from kernel.dispatch import Dispatcher
from kernel.settings import load_settings
from ops.bench.common import p50, print_table, rerankq_worker, worker_env, write_json
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis

WINDOW = 25
TARGET_PAIRS_PER_S = 1_000_000
HEADROOM = 0.5


def candidates(n: int, tag: str) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "text": f"{tag} runbook {i}: checkout returned 502"} for i in range(n)]


class Shape:
    def __init__(
        self,
        name: str,
        store_url: str,
        broker_url: str,
        store_nodes: list[redis.Redis],
        broker_node: redis.Redis | None,
        logs: Path,
        args: argparse.Namespace,
    ) -> None:
        self.name = name
        namespace = f"bd-{name.replace('+', '-')}-{uuid.uuid4().hex[:6]}"
        self.env = {
            **worker_env(store_url, namespace),
            "RERANKQ_BROKER_URL": broker_url,
            "RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:NoopProvider",
            "RERANKQ_RERANKER_MODEL": "",
            "RERANKQ_PAIR_CACHE": "false",
        }
        self.store_nodes = store_nodes
        self.broker_node = broker_node
        self.workers = [
            rerankq_worker(self.env, logs / f"{name}-{i}.log", "--processes", str(args.processes))
            for i in range(args.workers)
        ]
        self.clients: list[RerankClient] = []
        self.args = args

    def start(self) -> Shape:
        for worker in self.workers:
            worker.start()
        self.clients = [RerankClient(load_settings(self.env)) for _ in range(self.args.clients)]
        return self

    def round(self, tag: str, streams: int, windows: int) -> float:
        """Seconds from the first open to every window of every stream committed."""
        n = windows * WINDOW

        def one(i: int) -> None:
            client = self.clients[i % len(self.clients)]
            stream = client.open(
                f"{tag} query {i}",
                candidates(n, f"{tag}-{i}"),
                window_size=WINDOW,
                first_windows=windows,
                allow_shallow=True,
            )
            page = client.pull(stream, 0, n, timeout=120)
            while not page.complete:
                page = client.pull(stream, 0, n, timeout=120)

        start = time.perf_counter()
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(one, range(streams)))
        return time.perf_counter() - start

    def open_ms(
        self, tag: str, windows: int, opens: int, n_candidates: int, client: RerankClient | None = None
    ) -> list[float]:
        """Milliseconds per ``open`` of a stream of ``n_candidates`` with ``windows`` first windows,
        one at a time."""
        client = client or self.clients[0]
        out = []
        for i in range(opens):
            rows = candidates(n_candidates, f"{tag}-{i}")
            start = time.perf_counter()
            client.open(f"{tag} open {i}", rows, window_size=WINDOW, first_windows=windows, allow_shallow=True)
            out.append((time.perf_counter() - start) * 1000)
        return out

    def reset_stats(self) -> None:
        for node in [*self.store_nodes, *([self.broker_node] if self.broker_node else [])]:
            node.config_resetstat()

    def server_usec(self) -> dict[str, Any]:
        """Server time spent, from each server's commandstats: the store's Lua calls and all its
        commands (summed over masters), and the broker's."""

        def stats(node: redis.Redis) -> dict[str, dict[str, float]]:
            return node.info("commandstats")

        store = [stats(n) for n in self.store_nodes]
        lua_calls = sum(
            s.get("cmdstat_evalsha", {}).get("calls", 0) + s.get("cmdstat_eval", {}).get("calls", 0) for s in store
        )
        lua_usec = sum(
            s.get("cmdstat_evalsha", {}).get("usec", 0) + s.get("cmdstat_eval", {}).get("usec", 0) for s in store
        )
        store_usec = sum(v.get("usec", 0) for s in store for v in s.values())
        per_master = [sum(v.get("usec", 0) for v in s.values()) for s in store]
        broker_usec = sum(v.get("usec", 0) for v in stats(self.broker_node).values()) if self.broker_node else None
        return {
            "lua_calls": lua_calls,
            "lua_usec": lua_usec,
            "store_usec": store_usec,
            "store_usec_per_master": per_master,
            "broker_usec": broker_usec,
        }

    def committed(self) -> int:
        return self.clients[0].store.counters().get("windows_committed", 0)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for worker in self.workers:
            worker.stop()


def broker_cell(name: str, usec: float | None) -> str:
    if usec is not None:
        return f"{usec:.0f}"
    return "(in store's)" if name == "redis" else "not measured (RabbitMQ)"


def masters_of(cluster: EmbeddedRedisCluster) -> list[redis.Redis]:
    return [redis.Redis(port=port) for port in cluster.master_ports()]


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds (about two minutes)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--streams", type=int, default=None, help="concurrent streams per round")
    parser.add_argument("--windows", type=int, default=4, help="windows of 25 per stream")
    parser.add_argument("--clients", type=int, default=16, help="producer threads opening and pulling")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--amqp-url", default=None, help="a RabbitMQ broker for the amqp shapes (default: a private node started here)"
    )
    parser.add_argument("--opens", type=int, default=None, help="opens timed per shape and window count")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def add_shapes(args: argparse.Namespace, logs: Path, servers: list[Any], shapes: dict[str, Shape]) -> None:
    """Start each shape's private servers into ``servers`` and its Shape into ``shapes`` (the caller
    stops both however this ends, so a server started before a failure is not left running)."""
    single = EmbeddedRedis().start()
    servers.append(single)
    shapes["redis"] = Shape("redis", single.url, single.url, [redis.Redis.from_url(single.url)], None, logs, args)
    cluster_broker = EmbeddedRedis().start()
    cluster = EmbeddedRedisCluster().start()
    servers += [cluster_broker, cluster]
    shapes["cluster"] = Shape(
        "cluster",
        cluster.url,
        cluster_broker.url,
        masters_of(cluster),
        redis.Redis.from_url(cluster_broker.url),
        logs,
        args,
    )
    amqp_url = args.amqp_url
    if amqp_url is None and rabbitmq_server_binary() is not None:
        node = EmbeddedRabbitMQ()
        servers.append(node)
        amqp_url = node.start().url
    if amqp_url is None:
        print("deployments: rabbitmq-server is not installed and no --amqp-url: the amqp shapes are left out")
        return
    amqp_store = EmbeddedRedis().start()
    amqp_cluster = EmbeddedRedisCluster().start()
    servers += [amqp_store, amqp_cluster]
    shapes["amqp"] = Shape("amqp", amqp_store.url, amqp_url, [redis.Redis.from_url(amqp_store.url)], None, logs, args)
    shapes["amqp+cluster"] = Shape(
        "amqp+cluster", amqp_cluster.url, amqp_url, masters_of(amqp_cluster), None, logs, args
    )


def warm_shapes(shapes: dict[str, Shape], windows: int) -> None:
    for shape in shapes.values():
        shape.start()
        shape.round("warm", 4, windows)
        shape.reset_stats()


def run_rounds(
    shapes: dict[str, Shape], *, rounds: int, streams: int, windows: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each shape's seconds per round and its ratio to redis's in the same round; the first shape rotates."""
    seconds: dict[str, list[float]] = {name: [] for name in shapes}
    ratios: dict[str, list[float]] = {name: [] for name in shapes}
    names = list(shapes)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        took = {name: shapes[name].round(f"r{r}", streams, windows) for name in order}
        for name in names:
            seconds[name].append(took[name])
            ratios[name].append(took["redis"] / took[name])
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{name} {streams * windows / took[name]:.0f} windows/s" for name in names),
            flush=True,
        )
    return seconds, ratios


def per_window_usec(shape: Shape, measured_windows: int) -> tuple[dict[str, Any], list[float]]:
    """The shape's server time per measured window, and its store's time on each master."""
    usec = shape.server_usec()
    per_window = {
        "lua_calls": usec["lua_calls"] / measured_windows,
        "lua_usec_per_call": usec["lua_usec"] / max(1, usec["lua_calls"]),
        "store_usec": usec["store_usec"] / measured_windows,
        "broker_usec": None if usec["broker_usec"] is None else usec["broker_usec"] / measured_windows,
    }
    return per_window, usec["store_usec_per_master"]


def shape_figures(
    shapes: dict[str, Shape],
    seconds: dict[str, list[float]],
    ratios: dict[str, list[float]],
    *,
    rounds: int,
    streams: int,
    windows: int,
) -> dict[str, Any]:
    """Each shape's throughput, ratio to redis and server time per window, after checking that every
    window it was sent was committed; printed as a table."""
    measured_windows = rounds * streams * windows
    figures: dict[str, Any] = {}
    rows = []
    for name, shape in shapes.items():
        expected = (4 + rounds * streams) * windows
        if shape.committed() != expected:
            raise RuntimeError(f"{name}: {shape.committed()} windows committed, expected {expected}")
        per_window, per_master = per_window_usec(shape, measured_windows)
        figures[name] = {
            "windows_per_s_p50": streams * windows / p50(seconds[name]),
            "windows_per_s_min": streams * windows / max(seconds[name]),
            "windows_per_s_max": streams * windows / min(seconds[name]),
            "ratio_to_redis_p50": statistics.median(ratios[name]),
            "ratio_min": min(ratios[name]),
            "ratio_max": max(ratios[name]),
            "per_window": per_window,
            "store_usec_per_master": per_master,
        }
        rows.append(
            [
                name,
                figures[name]["windows_per_s_p50"],
                f"{measured_windows / sum(seconds[name]):.0f}",
                f"{statistics.median(ratios[name]):.2f} ({min(ratios[name]):.2f}-{max(ratios[name]):.2f})",
                per_window["lua_calls"],
                per_window["lua_usec_per_call"],
                per_window["store_usec"],
                broker_cell(name, per_window["broker_usec"]),
            ]
        )
    print_shapes_table(rows)
    return figures


def print_shapes_table(rows: list[list[Any]]) -> None:
    print_table(
        "Windows committed per second, no-op provider (ratio: redis's round time / this shape's; server "
        "time from INFO commandstats; redis: store and broker on one server; amqp: RabbitMQ's not counted)",
        [
            "shape",
            "windows/s p50",
            "windows/s all",
            "ratio to redis",
            "Lua calls/window",
            "µs/Lua call",
            "store µs/window",
            "broker µs/window",
        ],
        rows,
    )


def stop_all(shapes: dict[str, Shape], servers: list[Any]) -> None:
    for shape in shapes.values():
        shape.stop()
    for server in servers:
        server.remove() if isinstance(server, EmbeddedRabbitMQ) else server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    streams = args.streams or (48 if args.quick else 128)
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-deployments-"))
    print(
        f"deployments: rounds={rounds} streams={streams} windows/stream={args.windows} clients={args.clients} "
        f"workers={args.workers}x{args.processes} logs={logs}",
        flush=True,
    )

    servers: list[Any] = []
    shapes: dict[str, Shape] = {}
    try:
        add_shapes(args, logs, servers, shapes)
        warm_shapes(shapes, args.windows)
        seconds, ratios = run_rounds(shapes, rounds=rounds, streams=streams, windows=args.windows)
        figures: dict[str, Any] = {
            "rounds": rounds,
            "streams": streams,
            "windows_per_stream": args.windows,
            "window_size": WINDOW,
            "shapes": shape_figures(shapes, seconds, ratios, rounds=rounds, streams=streams, windows=args.windows),
        }
        figures["open_ms"] = open_costs(shapes, args.windows, args.opens or (60 if args.quick else 200))
        figures["estimate"] = estimate(figures["shapes"])
        write_json(args.json, figures)
    finally:
        stop_all(shapes, servers)
    return 0


def open_costs(shapes: dict[str, Shape], windows: int, opens: int) -> dict[str, Any]:
    """p50 ms per open with 1 and with ``windows`` first windows, shapes interleaved in chunks of
    ten opens so that machine noise hits each alike; the difference per extra window is what one
    more message costs the producer (a Redis push, or a RabbitMQ publish and its confirm)."""
    # The workers are stopped first (their scoring would compete for the CPU and blur the
    # difference), and every stream has the same candidates: only the messages sent differ.
    for shape in shapes.values():
        for worker in shape.workers:
            worker.stop()
    # On RabbitMQ also Celery's own publish, one confirm wait per message, beside the bursts.
    variants: dict[str, tuple[Shape, RerankClient | None]] = {name: (shape, None) for name, shape in shapes.items()}
    extra: list[RerankClient] = []
    for name in [n for n in shapes if n.startswith("amqp")]:
        settings = shapes[name].clients[0].settings
        extra.append(RerankClient(settings, dispatcher=Dispatcher(settings, confirm_bursts=False)))
        variants[f"{name} (a confirm per message)"] = (shapes[name], extra[-1])
    samples: dict[str, dict[int, list[float]]] = {name: {1: [], windows: []} for name in variants}
    chunk = 10
    for c in range(0, opens, chunk):
        for name, (shape, client) in variants.items():
            for n in dict.fromkeys((1, windows)):
                samples[name][n] += shape.open_ms(f"o{c}-{n}", n, min(chunk, opens - c), windows * WINDOW, client)
    for client in extra:
        client.close()
    out: dict[str, Any] = {}
    rows = []
    for name in variants:
        one, many = p50(samples[name][1]), p50(samples[name][windows])
        per_window = (many - one) / (windows - 1) if windows > 1 else float("nan")
        out[name] = {
            "open_ms_p50_1_window": one,
            f"open_ms_p50_{windows}_windows": many,
            "ms_per_extra_window": per_window,
        }
        rows.append([name, one, many, per_window, many / p50(samples["redis"][windows])])
    print_table(
        f"open() of {windows * WINDOW} candidates: ms per call, p50 of {opens}, one at a time, workers stopped "
        f"(ratio: to redis at {windows} windows)",
        ["shape", "1 window", f"{windows} windows", "ms per extra window", f"ratio at {windows}"],
        rows,
    )
    return out


def estimate(shapes: dict[str, Any]) -> dict[str, Any]:
    """Shards and broker instances for TARGET_PAIRS_PER_S, from the measured server time; printed."""
    windows_per_s = TARGET_PAIRS_PER_S / WINDOW
    single = shapes["redis"]["per_window"]
    cluster = shapes["cluster"]["per_window"]
    store_usec = cluster["store_usec"]
    per_shard = 1e6 / store_usec
    broker_usec = cluster["broker_usec"] or 0.0
    per_broker = 1e6 / broker_usec if broker_usec else float("inf")
    out = {
        "target_pairs_per_s": TARGET_PAIRS_PER_S,
        "windows_per_s": windows_per_s,
        "headroom": HEADROOM,
        "store_usec_per_window": store_usec,
        "lua_calls_per_window": cluster["lua_calls"],
        "lua_usec_per_call": cluster["lua_usec_per_call"],
        "windows_per_s_per_shard": per_shard,
        "store_shards": math.ceil(windows_per_s / (per_shard * HEADROOM)),
        "broker_usec_per_window": broker_usec,
        "windows_per_s_per_redis_broker": per_broker,
        "redis_brokers": math.ceil(windows_per_s / (per_broker * HEADROOM)) if broker_usec else 0,
        "one_redis_store_and_broker_windows_per_s": 1e6 / (single["store_usec"] or 1),
    }
    if "amqp+cluster" in shapes:
        # With RabbitMQ as the broker the store does the same work; its figure is a second measurement.
        amqp_store = shapes["amqp+cluster"]["per_window"]["store_usec"]
        out["amqp_cluster_store_usec_per_window"] = amqp_store
        out["amqp_cluster_store_shards"] = math.ceil(windows_per_s / (1e6 / amqp_store * HEADROOM))
    print_estimate(out)
    return out


def print_estimate(out: dict[str, Any]) -> None:
    print(
        f"\nOn paper, for {TARGET_PAIRS_PER_S:,} pairs/s = {out['windows_per_s']:,.0f} windows of {WINDOW}/s "
        f"(every shard and broker kept at {HEADROOM:.0%} of its ceiling):"
    )
    print(
        f"  store: {out['lua_calls_per_window']:.2f} Lua calls per window at {out['lua_usec_per_call']:.0f} µs "
        f"of server time each; {out['store_usec_per_window']:.0f} µs of store server time per window with the reads, "
        f"so one shard commits about {out['windows_per_s_per_shard']:,.0f} windows/s: {out['store_shards']} "
        "cluster masters (plus a replica each)"
    )
    if out["broker_usec_per_window"]:
        brokers = out["redis_brokers"]
        print(
            f"  broker (Redis): {out['broker_usec_per_window']:.0f} µs of server time per window (send, fetch, "
            f"unacked bookkeeping, ack): about {out['windows_per_s_per_redis_broker']:,.0f} windows/s per instance: "
            f"{brokers} Redis broker instances, each holding its share of the device queues (rerankq.gpu split "
            f"{brokers} ways)"
        )
    if "amqp_cluster_store_usec_per_window" in out:
        print(
            f"  store with RabbitMQ as the broker (amqp+cluster): {out['amqp_cluster_store_usec_per_window']:.0f} µs "
            f"per window: {out['amqp_cluster_store_shards']} cluster masters; RabbitMQ's own server time is not "
            "measured here (no access to its accounting), so the queues it needs are not estimated"
        )
    print(
        f"  one Redis as store and broker: about {out['one_redis_store_and_broker_windows_per_s']:,.0f} windows/s "
        "of store time alone; the ceiling this run measured end to end is the workers' CPU, not Redis"
    )


if __name__ == "__main__":
    sys.exit(main())
