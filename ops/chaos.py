"""Chaos run: streams opened and read while workers die, Redis restarts and messages are lost.

    python -m ops.chaos                  # about five minutes
    python -m ops.chaos --quick          # about two minutes
    python -m ops.chaos --break sweep    # purpose-made breakage: the run must fail
    python -m ops.chaos --broker amqp    # RabbitMQ as the broker (ops/chaos_faults/amqp_broker.py)
    python -m ops.chaos --store cluster  # the store on a Redis Cluster; a master killed, its replica promoted
    python -m ops.chaos --store sentinel # store and broker on Sentinel; failovers (``ops/chaos_faults/stores.py``)

A private redis-server (AOF on, ``appendfsync everysec``), several real
``python -m worker --device cpu --json-logs`` processes, and readers that open streams
(retrying each open with its idempotency key through restarts) and pull them page by
page. Readers only open and read: recovery must come from the workers' sweep. Meanwhile,
at random, the fault loop

- SIGKILLs a worker's pool process, most likely mid-window (Celery requeues its message);
- SIGKILLs a whole worker with its pool and starts a replacement (its unacked messages
  stay in kombu's unacked hash until the visibility timeout, so only the sweep recovers
  them within the run);
- restarts Redis with SIGTERM, or SIGKILLs it and starts it again on its AOF;
- sends a duplicate for a window (an exact copy of a message still waiting, or a fresh
  message for a committed window), as at-least-once delivery does;
- deletes a waiting message whose window has no other one waiting (a lost message).

Then it drains (pulls every stream whole, within less than the visibility timeout) and
audits every attempted open and every admitted window (``ops/chaos_faults/audit.py``).
A canary checks that Redis kept every write it acknowledged through each restart.

The last line is ``streams=N windows=N kills=N restarts=N lost=N twice=N failed=N
changed=N resent=N`` (resent: windows the sweep re-sent); the exit status is non-zero on
any violation: lost, twice, failed (the provider is healthy), changed, an open that gave
up, or an acknowledged Redis write that a restart lost.

``--break sweep|provider|commit-check`` breaks the system on purpose, from here only:
the workers' sweep effectively off, a provider that raises on every window with nothing
to fail open to, or the store script without its "already committed?" checks. Each must
make the run fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from kombu.exceptions import OperationalError

from kernel.dispatch import Dispatcher
from kernel.redis_clients import broker_client
from kernel.settings import Settings
from ops.chaos_faults.audit import Findings, audit, drain
from ops.chaos_faults.canary import AcknowledgedWrites
from ops.chaos_faults.commit_check import MARKER, without_commit_checks
from ops.chaos_faults.processes import Worker, kill_pool_process, restart_redis
from ops.chaos_faults.queue_faults import QueueFaults
from ops.chaos_faults.readers import Ledger, read_streams
from ops.chaos_faults.stores import SHAPES, FailoverLosses, StoreShape, attribute, canary_clients, start_shape
from producer import RerankClient, load_settings

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "chaos"
BREAKAGES = ("sweep", "provider", "commit-check")
OVERLAY = ROOT / "ops" / "chaos_faults" / "overlay"
# Each fault's share of the draws. Drawn from a shuffled deck, so every kind happens
# within every round of draws, even in a short run.
FAULTS = {"pool_process": 4, "worker": 2, "redis_sigterm": 1, "redis_sigkill": 1, "duplicate": 3, "lost_message": 3}
# What a Redis restart looks like to the fault loop's own calls: that fault is skipped.
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OperationalError, OSError)


class Fleet:
    """The workers of the run: every one started, so every log can be read at the end."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.started: list[Worker] = []
        self.lock = threading.Lock()

    def start(self) -> Worker:
        with self.lock:
            worker = Worker(self.env, self.log_dir / f"worker-{len(self.started)}.log", ROOT)
            self.started.append(worker)
            return worker

    def serving(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.started if w.alive and w.ready()]

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                live = [w for w in self.started if w.alive]
                dead = [w for w in self.started if not w.alive]
            if dead and not live:
                raise RuntimeError(f"workers exited; see {dead[0].log_path}")
            if live and all(w.ready() for w in live):
                return
            time.sleep(0.2)
        raise RuntimeError(f"workers not ready after {timeout_s:.0f} s; see {self.log_dir}")

    def log_paths(self) -> list[Path]:
        return [w.log_path for w in self.started]

    def stop(self) -> None:
        for worker in self.started:
            worker.stop(timeout_s=5.0)


class FaultLoop(threading.Thread):
    """Injects one fault every ``every_s`` (a random interval) until stopped, and counts them."""

    def __init__(
        self,
        fleet: Fleet,
        shape: StoreShape,
        queues: QueueFaults,
        ledger: Ledger,
        rng: random.Random,
        every_s: tuple[float, float],
        extra: dict[str, tuple[int, Callable[[], str | None]]] | None = None,
    ) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.fleet = fleet
        self.shape = shape
        self.server = shape.restartable
        self.weights = shape.fault_weights(FAULTS)
        self.queues = queues
        self.ledger = ledger
        self.rng = rng
        self.every_s = every_s
        self.stop = threading.Event()
        self.done: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._deck: list[str] = []
        #: A broker's own faults (weight, action), drawn beside the rest; each is a restart.
        self.extra = extra or {}

    @property
    def kills(self) -> int:
        return self.done["pool_process"] + self.done["worker"]

    @property
    def restarts(self) -> int:
        return sum(n for kind, n in self.done.items() if kind.startswith(("redis_", "cluster_", "sentinel_"))) + sum(
            self.done[k] for k in self.extra
        )

    def _draw(self) -> str:
        if not self._deck:
            weights = {**self.weights, **{kind: weight for kind, (weight, _) in self.extra.items()}}
            self._deck = [kind for kind, weight in weights.items() for _ in range(weight)]
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.every_s)):
            kind = self._draw()
            try:
                done = self.extra[kind][1]() if kind in self.extra else getattr(self, kind)()
            except TRANSIENT:
                done = None  # Redis was down for the fault loop's own calls
            if done:
                self.done[done] += 1
            else:
                self.skipped[kind] += 1

    def pool_process(self) -> str | None:
        serving = self.fleet.serving()
        if serving and kill_pool_process(self.rng.choice(serving), self.rng.choice):
            return "pool_process"
        return None

    def worker(self) -> str | None:
        serving = self.fleet.serving()
        if not serving:
            return None
        self.rng.choice(serving).kill()
        self.fleet.start()
        return "worker"

    def redis_sigterm(self) -> str:
        restart_redis(self.server, sigkill=False)
        return "redis_sigterm"

    def redis_sigkill(self) -> str:
        restart_redis(self.server, sigkill=True)
        return "redis_sigkill"

    def store_failover(self) -> str:
        return self.shape.failover(self.rng.random() < 0.5)

    def duplicate(self) -> str | None:
        if self.rng.random() < 0.5 and self.queues.copy_waiting(self.rng):
            return "duplicate_waiting"
        committed = self.ledger.committed()
        if committed:
            self.queues.resend_committed(self.rng.choice(committed))
            return "duplicate_committed"
        return "duplicate_waiting" if self.queues.copy_waiting(self.rng) else None

    def lost_message(self) -> str | None:
        # Wait a little for a message to be waiting: under a light load the queue drains fast.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not self.stop.is_set():
            if self.queues.lose_one(self.rng):
                return "lost_message"
            time.sleep(0.05)
        return None


def worker_env(url: str, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(
        {
            "RERANKQ_REDIS_URL": url,
            "RERANKQ_NAMESPACE": NAMESPACE,
            "RERANKQ_CPU_QUEUE": f"{NAMESPACE}.cpu",
            "RERANKQ_GPU_QUEUE": f"{NAMESPACE}.gpu",
            "RERANKQ_ANY_QUEUE": f"{NAMESPACE}.any",
            # Short leases and a fast sweep, so lost messages are recovered within the run; a
            # visibility timeout well above the drain time, so kombu's own restore of a killed
            # worker's unacked messages cannot stand in for the sweep at the end.
            "RERANKQ_REDELIVER_AFTER_S": str(args.redeliver_after_s),
            "RERANKQ_SWEEP_INTERVAL_S": "1",
            "RERANKQ_VISIBILITY_TIMEOUT_S": "60",
            # Chaos kills are not poison: leave room for several deaths per window.
            "RERANKQ_MAX_ATTEMPTS": "20",
            "RERANKQ_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
    )
    if args.model == "tiny":
        from devservers.tiny_model import build_tiny_cross_encoder

        model_dir = build_tiny_cross_encoder(Path(tempfile.mkdtemp(prefix="rerankq-chaos-model-")))
        env.update(
            {
                "RERANKQ_RERANKER_PROVIDER": "local",
                "RERANKQ_RERANKER_MODEL": str(model_dir),
                "RERANKQ_TORCH_THREADS": "1",
            }
        )
    else:
        env.update(
            {
                "RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:NoopProvider",
                "TEST_PROVIDER_SLEEP_S": str(args.window_s),
            }
        )
    break_workers(env, args.breakage)
    return env


def break_workers(env: dict[str, str], breakage: str | None) -> None:
    """The workers' side of ``--break``: environment only, no production knob."""
    if breakage == "sweep":
        env["RERANKQ_SWEEP_INTERVAL_S"] = "1000000"  # the first sweep would come in 11 days
    elif breakage == "provider":
        # The only member: nothing to fail open to.
        env["RERANKQ_RERANKER_PROVIDER"] = "ops.chaos_faults.providers:RaisingProvider"
        env.pop("RERANKQ_RERANKER_MODEL", None)
    elif breakage == "commit-check":
        import kernel.store

        without_commit_checks(kernel.store._SCRIPT)  # refuse to run if the patch would not apply
        env["PYTHONPATH"] = os.pathsep.join([str(OVERLAY), env["PYTHONPATH"]])


def stop_on_sigterm() -> None:
    """A SIGTERM unwinds like Ctrl-C, so no worker or redis-server outlives the run."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def client_logging(log_dir: Path) -> None:
    """The readers' library log lines (windows not sent during a restart...) go to a file."""
    handler = logging.FileHandler(log_dir / "readers.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def report(
    findings: Findings,
    faults: FaultLoop,
    counters: dict[str, int],
    canaries: list[AcknowledgedWrites],
    ledger: Ledger,
    incomplete: int,
    fleet: Fleet,
    args: argparse.Namespace,
) -> bool:
    """Print what happened; True when anything was violated."""
    print_counts(findings, faults, counters, ledger, incomplete)
    restarts = [c for c in canaries if c.name == "restarts"]
    for canary in restarts:
        print(
            f"chaos: redis canary: writes acknowledged={canary.acknowledged}, lost by restarts={canary.lost}",
            flush=True,
        )
    violated = bool(
        findings.lost
        or findings.twice
        or findings.failed
        or findings.changed
        or findings.gave_up
        or any(c.lost for c in restarts)
    )
    if findings.windows and not findings.logged_windows:
        print("chaos: no window_committed line in any worker log: the log check saw nothing", flush=True)
        violated = True
    if args.breakage == "commit-check":
        unapplied = commit_check_unapplied(fleet)
        violated = violated or unapplied
    return violated


def print_counts(
    findings: Findings, faults: FaultLoop, counters: dict[str, int], ledger: Ledger, incomplete: int
) -> None:
    acknowledged = sum(1 for a in ledger.opens.values() if a.acknowledged)
    print(
        f"chaos: faults {' '.join(f'{k}={v}' for k, v in sorted(faults.done.items()))}"
        f" (skipped: {' '.join(f'{k}={v}' for k, v in sorted(faults.skipped.items())) or 'none'})",
        flush=True,
    )
    print(
        f"chaos: opens attempted={findings.streams} acknowledged={acknowledged} gave_up={findings.gave_up}"
        f" vanished={findings.vanished}; streams still incomplete after the drain={incomplete}",
        flush=True,
    )
    print(
        f"chaos: twice by commit events={len(findings.twice_events)} by worker log lines={len(findings.twice_logs)}"
        f" (windows logged committed={findings.logged_windows}, first read by a reader={len(ledger.first_read)})",
        flush=True,
    )
    print(
        "chaos: counters "
        + " ".join(
            f"{k}={counters.get(k, 0)}"
            for k in ("windows_committed", "windows_failed", "windows_poisoned", "windows_redelivered")
        ),
        flush=True,
    )


def commit_check_unapplied(fleet: Fleet) -> bool:
    """Whether --break commit-check reached no worker (a run that then passes proves nothing)."""
    applied = sum(1 for p in fleet.log_paths() if MARKER.encode() in p.read_bytes())
    print(f"chaos: --break commit-check applied in {applied} of {len(fleet.started)} workers", flush=True)
    return applied == 0


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a run of about two minutes")
    parser.add_argument("--duration-s", type=float, default=None, help="how long streams are opened under chaos")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--readers", type=int, default=6)
    parser.add_argument(
        "--model",
        choices=["fast", "tiny"],
        default="fast",
        help="fast: a deterministic provider with no torch; tiny: the tiny real cross-encoder",
    )
    parser.add_argument("--window-s", type=float, default=0.2, help="how long the fast provider takes per window")
    parser.add_argument("--redeliver-after-s", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--store",
        choices=SHAPES,
        default="single",
        help="the store's deployment: one Redis, a Redis Cluster, or Sentinel (store and broker)",
    )
    parser.add_argument(
        "--break",
        dest="breakage",
        choices=BREAKAGES,
        default=None,
        help="break the system on purpose; the run must then fail",
    )
    parser.add_argument(
        "--broker",
        choices=["redis", "amqp"],
        default="redis",
        help="redis: the store's Redis is the broker too; amqp: a private RabbitMQ node",
    )
    return parser.parse_args(argv)


@dataclasses.dataclass
class Outcome:
    """What the drain and the audit found."""

    findings: Findings
    counters: dict[str, int]
    incomplete: int
    losses: FailoverLosses


class ChaosRun:
    """The store shape, the broker, the fleet, the canaries and the fault loop of one run."""

    def __init__(self, args: argparse.Namespace, log_dir: Path, seed: int) -> None:
        self.shape = start_shape(args.store, log_dir, redis_broker=args.broker == "redis")
        env = {**worker_env(self.shape.store_url, args), "RERANKQ_BROKER_URL": self.shape.broker_url}
        self.broker = None
        if args.broker == "amqp":
            from ops.chaos_faults.amqp_broker import AmqpBroker

            self.broker = AmqpBroker(log_dir).start()
            self.broker.configure(env)
        self.settings: Settings = load_settings(env)
        self.fleet = Fleet(env, log_dir)
        self.canaries = [
            AcknowledgedWrites(client=c, key=key, name=what) for what, c, key in canary_clients(self.shape)
        ]
        self.client = RerankClient(self.settings)
        self.dispatcher = Dispatcher(self.settings)
        queue_faults = (
            self.broker.queue_faults(self.settings.queues.all_queues(), self.dispatcher)
            if self.broker is not None
            else QueueFaults(broker_client(self.shape.broker_url), self.settings.queues.all_queues(), self.dispatcher)
        )
        self.faults = FaultLoop(
            self.fleet,
            self.shape,
            queue_faults,
            Ledger(),
            random.Random(seed),
            (1.0, 3.0),  # type: ignore[arg-type]
            extra=self.broker.faults() if self.broker is not None else None,
        )
        self.ledger = self.faults.ledger

    def under_chaos(self, args: argparse.Namespace, seed: int, duration: float) -> None:
        """Start the canaries and workers, then read streams for ``duration`` while the fault loop runs."""
        for canary in self.canaries:
            canary.start()
        for _ in range(args.workers):
            self.fleet.start()
        self.fleet.wait_ready(120 if args.model == "fast" else 300)
        until = time.monotonic() + duration
        reader_clients = [RerankClient(self.settings) for _ in range(args.readers)]
        readers = [
            threading.Thread(
                target=read_streams,
                name=f"chaos-reader-{i}",
                daemon=True,
                args=(reader_clients[i], self.ledger, random.Random(seed + 1 + i), i, until),
                kwargs={"give_up_s": 60.0},
            )
            for i in range(args.readers)
        ]
        self.faults.start()
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        self.faults.stop.set()
        self.faults.join()
        for reader_client in reader_clients:
            reader_client.close()

    def drain_and_audit(self, drain_s: float) -> Outcome:
        incomplete = drain(self.client, self.ledger, time.monotonic() + drain_s)
        self.fleet.stop()
        findings = audit(self.client, self.ledger, self.fleet.log_paths())
        counters = self.client.store.counters()
        for canary in self.canaries:
            canary.stop.set()
            canary.join()
        windows_of = {a.stream_id: a.n_windows for a in self.ledger.opens.values()}
        losses = attribute(findings, self.shape, self.client.store.keys, windows_of)
        losses.canary = sum(c.lost for c in self.canaries if c.name == "failovers")
        return Outcome(findings, counters, incomplete, losses)

    def print_failover_losses(self, losses: FailoverLosses) -> None:
        failover_writes = sum(c.acknowledged for c in self.canaries if c.name == "failovers")
        print(
            f"chaos: acknowledged writes lost by store failovers ({len(self.shape.failovers)} failovers; documented,"
            f" not repaired): canary={losses.canary} of {failover_writes}"
            f" streams vanished={losses.streams_vanished} ({losses.windows_of_vanished} windows)"
            f" windows committed again={losses.committed_again} results changed={losses.changed}",
            flush=True,
        )

    def close(self) -> None:
        self.faults.stop.set()
        for canary in self.canaries:
            canary.stop.set()
        self.fleet.stop()
        self.dispatcher.close()
        self.client.close()
        self.shape.stop()
        if self.broker is not None:
            self.broker.stop()

    def summary_line(self, outcome: Outcome) -> str:
        findings = outcome.findings
        return (
            f"streams={findings.streams} windows={findings.windows} kills={self.faults.kills} "
            f"restarts={self.faults.restarts} lost={findings.lost} twice={findings.twice} failed={findings.failed} "
            f"changed={findings.changed} resent={outcome.counters.get('windows_redelivered', 0)}"
            + (f" failover_lost={outcome.losses.total}" if self.shape.name != "single" else "")
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    duration = args.duration_s if args.duration_s is not None else (100.0 if args.quick else 270.0)
    # Well under the 60 s visibility timeout: a stranded message is the sweep's to recover.
    drain_s = 30.0 if args.quick else 45.0
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    stop_on_sigterm()

    log_dir = Path(tempfile.mkdtemp(prefix="rerankq-chaos-"))
    client_logging(log_dir)
    print(
        f"chaos: seed={seed} duration={duration:.0f}s workers={args.workers} readers={args.readers}"
        f" model={args.model} break={args.breakage or 'none'} store={args.store} broker={args.broker}"
        f" logs={log_dir}",
        flush=True,
    )
    run = ChaosRun(args, log_dir, seed)
    try:
        run.under_chaos(args, seed, duration)
        outcome = run.drain_and_audit(drain_s)
        violated = report(
            outcome.findings,
            run.faults,
            outcome.counters,
            run.canaries,
            run.ledger,
            outcome.incomplete,
            run.fleet,
            args,
        )
        if run.shape.name != "single":
            run.print_failover_losses(outcome.losses)
    finally:
        run.close()
    print(run.summary_line(outcome), flush=True)
    return 1 if violated else 0


if __name__ == "__main__":
    sys.exit(main())
