"""Re-sends under a backlog: does the sweep re-send windows that are only waiting in a queue?

    python -m ops.bench.resend            # backlog of 5x what the worker drains per redelivery period
    python -m ops.bench.resend --quick

One worker drains windows at a known pace (a provider that takes ``--window-s`` per window).
A backlog of ``--backlog`` times what it drains in one redelivery period
(``RERANKQ_REDELIVER_AFTER_S``) is opened at once, so most windows wait in the queue past
their deadline. Side by side, in one run: the sweep as it is (it leaves a window whose
message is still queued alone) and the sweep as it was (every overdue window re-sent, an
overlay in ``ops/bench/overlays``). Reported: re-sent messages per window (target <= 0.05),
the time to drain, and, for messages deleted from the queue (lost), how long after their
deadline the sweep re-sent them (bound: ``REDELIVER_AFTER_S + SWEEP_INTERVAL_S``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kernel.broker_queues import QueueProbe
from ops.bench.common import ROOT, print_table, rerankq_worker, worker_env, write_json
from producer import RerankClient, load_settings
from worker.embedded.redis_server import EmbeddedRedis

OVERLAY = ROOT / "ops" / "bench" / "overlays" / "sweep_without_probe"


PER_STREAM = 10


def resend_settings(args: argparse.Namespace) -> dict[str, str]:
    return {
        "RERANKQ_REDELIVER_AFTER_S": str(args.redeliver_after_s),
        "RERANKQ_SWEEP_INTERVAL_S": "1",
        "RERANKQ_VISIBILITY_TIMEOUT_S": str(max(600, args.redeliver_after_s * 4)),
        "RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:PacedProvider",
        "BENCH_WINDOW_S": str(args.window_s),
        "RERANKQ_PAIR_CACHE": "false",
    }  # every window must reach the paced provider


def open_backlog(client: RerankClient, n_windows: int) -> list[str]:
    return [
        client.open(
            "payment gateway error",
            [{"id": f"c{i}", "text": f"doc {i}"} for i in range(10)],
            window_size=1,
            first_windows=PER_STREAM,
            allow_shallow=True,
        )
        for _ in range(n_windows // PER_STREAM)
    ]


def lose_messages(client: RerankClient, queue: str, n: int) -> set[tuple[str, int]]:
    """Delete ``n`` messages from the far end of the queue (the last to be fetched), as a worker
    killed between its fetch and its record of the fetch would; their (stream, window)s."""
    lost = []
    for raw in client.store.client.lrange(queue, 0, n - 1):
        client.store.client.lrem(queue, 1, raw)
        lost.append(raw)
    lost_ids = set()
    for raw in lost:
        text = raw.decode()
        marker = text.index('"rq:') + 4
        stream, window, _ = text[marker:].split(":", 2)
        lost_ids.add((stream, int(window)))
    return lost_ids


def watch_drain(
    client: RerankClient,
    streams: list[str],
    lost_ids: set[tuple[str, int]],
    queue: str,
    *,
    started: float,
    admitted_at: float,
    timeout_s: float,
    mode: str,
) -> tuple[float, list[float]]:
    """Poll until every window is committed: the seconds from the first open, and for each lost
    message the seconds from admission until it was queued again (or committed)."""
    recovered_after: list[float] = []
    pending_lost = set(lost_ids)
    probe = QueueProbe(client.store.client)
    while True:
        snapshots = {s: client.store.snapshot(s) for s in streams}
        if pending_lost:
            resent_now = pending_lost & probe.queued_windows([queue])
            resent_now |= {(s, w) for s, w in pending_lost if w in snapshots[s].results}
            recovered_after += [time.monotonic() - admitted_at] * len(resent_now)
            pending_lost -= resent_now
        if all(len(s.results) == PER_STREAM for s in snapshots.values()):
            break
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{mode}: backlog not drained in {timeout_s} s")
        time.sleep(0.5)
    return time.monotonic() - started, recovered_after


def run(mode: str, server: EmbeddedRedis, args: argparse.Namespace, log_dir: Path) -> dict[str, float]:
    namespace = "resend" + uuid.uuid4().hex[:6]
    settings = resend_settings(args)
    env = worker_env(server.url, namespace, **settings)
    if mode == "every overdue window (before)":
        env["PYTHONPATH"] = f"{OVERLAY}:{env['PYTHONPATH']}"
    client = RerankClient(load_settings(worker_env(server.url, namespace, **settings)))
    drained_per_period = args.redeliver_after_s / args.window_s
    n_windows = int(args.backlog * drained_per_period)
    worker = rerankq_worker(env, log_dir / f"{namespace}.log", "--processes", "1").start()
    try:
        started = time.monotonic()
        streams = open_backlog(client, n_windows)
        admitted_at = time.monotonic()
        queue = client.settings.queues.cpu_queue
        lost_ids = lose_messages(client, queue, args.lost)
        drain_s, recovered_after = watch_drain(
            client,
            streams,
            lost_ids,
            queue,
            started=started,
            admitted_at=admitted_at,
            timeout_s=args.timeout_s,
            mode=mode,
        )
        resent = client.store.counters().get("windows_redelivered", 0)
    finally:
        worker.stop()
        client.close()
    return {
        "windows": n_windows,
        "drained_per_period": drained_per_period,
        "drain_s": drain_s,
        "resent": resent,
        "resent_per_window": resent / n_windows,
        "lost": len(lost_ids),
        "lost_recovered_max_s": max(recovered_after, default=float("nan")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backlog", type=float, default=5.0, help="backlog in redelivery periods of draining")
    parser.add_argument("--window-s", type=float, default=None, help="seconds the worker takes per window")
    parser.add_argument("--redeliver-after-s", type=int, default=None)
    parser.add_argument("--lost", type=int, default=5, help="messages deleted from the queue")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.window_s = args.window_s or (0.05 if args.quick else 0.1)
    args.redeliver_after_s = args.redeliver_after_s or (4 if args.quick else 8)
    log_dir = Path(tempfile.mkdtemp(prefix="rerankq-bench-resend-"))
    figures = {}
    with EmbeddedRedis() as server:
        for mode in ("queued windows left alone (now)", "every overdue window (before)"):
            figures[mode] = run(mode, server, args, log_dir)
    bound = args.redeliver_after_s + 1
    rows = [
        [
            mode,
            f["windows"],
            f"{args.backlog:g}x",
            f["drain_s"],
            f["resent"],
            f["resent_per_window"],
            f"{f['lost']}, re-sent by {f['lost_recovered_max_s']:.1f} s",
        ]
        for mode, f in figures.items()
    ]
    print_table(
        f"Re-sends under a backlog (worker drains {1 / args.window_s:.0f} windows/s, "
        f"REDELIVER_AFTER_S={args.redeliver_after_s}, SWEEP_INTERVAL_S=1)",
        ["sweep", "windows", "backlog", "drain s", "re-sent", "re-sent/window", "lost, re-sent by"],
        rows,
    )
    now, before = figures["queued windows left alone (now)"], figures["every overdue window (before)"]
    print(
        f"\nre-sent per window: {now['resent_per_window']:.3f} now vs {before['resent_per_window']:.3f} before "
        f"(target <= 0.05); drain {now['drain_s']:.1f} s vs {before['drain_s']:.1f} s "
        f"({before['drain_s'] / now['drain_s']:.2f}x)"
    )
    print(
        f"lost messages re-sent {now['lost_recovered_max_s']:.1f} s after they were admitted (and lost); "
        f"bound: REDELIVER_AFTER_S + SWEEP_INTERVAL_S = {bound} s"
    )
    write_json(
        args.json, {"resend": figures, "target_resent_per_window": 0.05, "resent_per_window": now["resent_per_window"]}
    )
    return 0 if now["resent_per_window"] <= 0.05 and now["lost_recovered_max_s"] <= bound + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
