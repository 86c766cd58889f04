"""Chaos run: many streams while workers are killed and Redis restarts at random.

    python ops/chaos.py            # about five minutes
    python ops/chaos.py --quick    # under two minutes

A private redis-server (AOF on, as ops/redis.conf runs it), several real
``python -m worker`` processes, and readers that open and pull streams. Meanwhile
a chaos loop SIGKILLs a worker's pool process (mid-window, most likely), SIGKILLs a
whole worker (its unacked messages are stranded until the sweep re-sends them) and
starts a replacement, or restarts Redis. Then it drains and checks every stream:

- lost:  a window that was admitted but never committed;
- twice: a window with more than one commit event in its stream's event log.

The last line printed is ``streams=N windows=N kills=N restarts=N lost=N twice=N``;
the exit status is non-zero when lost or twice is not 0. Redis restarts are clean
(SIGTERM: the AOF is flushed); a power cut can lose the last second of writes, which
README's "Guarantees" covers and this script does not simulate.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import logging  # noqa: E402

import redis  # noqa: E402
import structlog  # noqa: E402
from kombu.exceptions import OperationalError  # noqa: E402

from producer import RerankClient, load_settings  # noqa: E402
from producer.errors import StreamNotFound  # noqa: E402
from worker.embedded.redis_server import EmbeddedRedis  # noqa: E402

NAMESPACE = "chaos"
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OperationalError, OSError)


def retrying(call, *, give_up_s: float = 30.0):  # type: ignore[no-untyped-def]
    """Retry through a Redis restart: the client is at-least-once too (opens are idempotent)."""
    deadline = time.monotonic() + give_up_s
    while True:
        try:
            return call()
        except TRANSIENT:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Worker:
    def __init__(self, env: dict[str, str], log_dir: Path, index: int) -> None:
        self.log_path = log_dir / f"worker-{index}.log"
        with open(self.log_path, "wb") as log:
            # Its own session, so a "whole worker" kill takes its pool processes with it.
            self.proc = subprocess.Popen([sys.executable, "-m", "worker", "--device", "cpu", "--processes", "1"],
                                         env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class Chaos:
    def __init__(self, args: argparse.Namespace, server: EmbeddedRedis, log_dir: Path) -> None:
        self.args = args
        self.server = server
        self.log_dir = log_dir
        self.rng = random.Random(args.seed)
        self.env = worker_env(server.url, args)
        self.workers: list[Worker] = []
        self.kills = 0
        self.restarts = 0
        self.stop = threading.Event()

    def start_worker(self) -> None:
        self.workers.append(Worker(self.env, self.log_dir, len(self.workers)))

    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.args.chaos_every_s)):
            action = self.rng.choices(["child", "worker", "redis"], weights=[5, 2, 2])[0]
            live = self.live_workers()
            if action == "child" and live:
                children = self.rng.choice(live).children()
                if children:
                    os.kill(self.rng.choice(children), signal.SIGKILL)
                    self.kills += 1
            elif action == "worker" and len(live) > 1:
                self.rng.choice(live).kill()
                self.kills += 1
                self.start_worker()
            elif action == "redis":
                self.server.restart()
                self.restarts += 1

    def shutdown(self) -> None:
        for worker in self.workers:
            worker.stop()


def worker_env(url: str, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({
        "RERANKQ_REDIS_URL": url,
        "RERANKQ_NAMESPACE": NAMESPACE,
        "RERANKQ_REDELIVER_AFTER_S": str(args.redeliver_after_s),
        "RERANKQ_SWEEP_INTERVAL_S": "1",
        "RERANKQ_VISIBILITY_TIMEOUT_S": "60",
        # Chaos kills are not poison: leave room for several deaths per window.
        "RERANKQ_MAX_ATTEMPTS": "20",
        "RERANKQ_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    })
    if args.model == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_model import build_tiny_cross_encoder

        model_dir = build_tiny_cross_encoder(Path(tempfile.mkdtemp(prefix="rerankq-chaos-model-")))
        env.update({"RERANKQ_RERANKER_PROVIDER": "local", "RERANKQ_RERANKER_MODEL": str(model_dir),
                    "RERANKQ_TORCH_THREADS": "1"})
    else:
        env.update({"RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:FastProvider",
                    "RERANKQ_TEST_SLEEP_S": str(args.window_s)})
    return env


def reader(client: RerankClient, rng: random.Random, index: int, streams: list[tuple[str, int]],
           lock: threading.Lock, until: float) -> None:
    """Open streams and pull each to the end, as a pipeline would, through every restart."""
    n = 0
    while time.monotonic() < until:
        size = rng.randint(10, 60)
        key = f"r{index}-{n}"
        n += 1
        candidates = [{"id": f"c{i}", "text": f"payment gateway error number {i} {key}"} for i in range(size)]
        stream = retrying(lambda: client.open("payment gateway error", candidates, window_size=10,
                                              first_windows=rng.randint(1, 3), idempotency_key=key,
                                              allow_shallow=True))
        with lock:
            streams.append((stream, size))
        # Pull a page at a time, deeper and deeper: later windows are admitted by the reader.
        offset = 0
        while offset < size and time.monotonic() < until:
            page = retrying(lambda: client.pull(stream, offset, 10, timeout=2.0))
            offset += len(page.rows)
            if page.complete:
                break


def check(client: RerankClient, raw: redis.Redis, streams: list[tuple[str, int]],
          drain_until: float) -> tuple[int, int, int, int]:
    """Pull every stream whole (admitting its last windows), wait for all commits, then count."""
    pending = list(streams)
    while pending and time.monotonic() < drain_until:
        stream, size = pending[0]
        page = retrying(lambda: client.pull(stream, 0, size, timeout=1.0))
        if page.complete:
            pending.pop(0)
    windows = lost = twice = retried = 0
    for stream, size in streams:
        keys = client.store.keys.stream(stream)
        n_windows = -(-size // 10)
        windows += n_windows
        try:
            committed = set(retrying(lambda: client.store.snapshot(stream)).results)
        except StreamNotFound:
            committed = set()
        lost += n_windows - len(committed)
        events: dict[int, int] = {}
        for _, fields in raw.xrange(keys.events):
            events[int(fields[b"window"])] = events.get(int(fields[b"window"]), 0) + 1
        twice += sum(1 for count in events.values() if count > 1)
        retried += sum(1 for n in retrying(lambda: client.store.attempts(stream)).values() if n > 1)
    return windows, lost, twice, retried


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a run under two minutes")
    parser.add_argument("--duration-s", type=float, default=None, help="how long streams are opened under chaos")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--model", choices=["fast", "tiny"], default="fast",
                        help="fast: a deterministic provider with no torch; tiny: the tiny real cross-encoder")
    parser.add_argument("--window-s", type=float, default=0.2, help="how long the fast provider takes per window")
    parser.add_argument("--redeliver-after-s", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    # The readers' own info lines would drown the result; warnings (re-sends) stay.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    duration = args.duration_s or (50.0 if args.quick else 240.0)
    args.chaos_every_s = (1.0, 4.0)
    args.seed = args.seed if args.seed is not None else random.randrange(2**32)

    log_dir = Path(tempfile.mkdtemp(prefix="rerankq-chaos-"))
    print(f"chaos: seed={args.seed} duration={duration:.0f}s workers={args.workers} logs={log_dir}", flush=True)
    os.makedirs(log_dir / "redis")
    server = EmbeddedRedis(appendonly=True, directory=str(log_dir / "redis")).start()
    chaos = Chaos(args, server, log_dir)
    client = RerankClient(load_settings(chaos.env, namespace=NAMESPACE))
    raw = redis.Redis.from_url(server.url)
    streams: list[tuple[str, int]] = []
    lock = threading.Lock()
    try:
        for _ in range(args.workers):
            chaos.start_worker()
        time.sleep(3 if args.model == "fast" else 10)
        chaos_thread = threading.Thread(target=chaos.run, daemon=True)
        chaos_thread.start()
        until = time.monotonic() + duration
        reader_clients = [RerankClient(client.settings) for _ in range(args.readers)]
        readers = [threading.Thread(target=reader, args=(reader_clients[i], random.Random(args.seed + i),
                                                          i, streams, lock, until), daemon=True)
                   for i in range(args.readers)]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        for reader_client in reader_clients:
            reader_client.close()
        chaos.stop.set()
        chaos_thread.join()
        if not chaos.live_workers():
            chaos.start_worker()
        windows, lost, twice, retried = check(client, raw, streams, time.monotonic() + (40 if args.quick else 120))
        counters = client.store.counters()
        print(f"chaos: windows scored more than once={retried} re-sent by a sweep={counters.get('windows_redelivered', 0)}"
              f" poisoned={counters.get('windows_poisoned', 0)}", flush=True)
    finally:
        chaos.shutdown()
        client.close()
        server.stop()
    print(f"streams={len(streams)} windows={windows} kills={chaos.kills} restarts={chaos.restarts} "
          f"lost={lost} twice={twice}", flush=True)
    return 1 if lost or twice else 0


if __name__ == "__main__":
    sys.exit(main())
