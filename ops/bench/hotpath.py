"""Where one window's time goes: the per-step costs behind ``queue.py``'s overhead figure.

Two views of a one-window stream (25 candidates, the no-op provider) on a private Redis:

1. In one process, step by step, in the order a real stream takes them: the producer's
   open (checks, the store's script, the Celery publish, its log line); the reader's pull,
   which finds nothing and waits; the worker's task body (begin, decode, the chain with the
   pair cache and the meter, decide, commit, its log lines), run as that wait begins and
   shown on its own, its time taken out of the pull's; the wait returning and the page.
   Then deep pulls of a committed 300-candidate stream.
   Each step's time (p50 over the windows, inclusive of the steps indented under it) and
   its Redis round trips (redis-py sends, a pipeline counting once). The worker logs as
   ``rerankq worker`` does (INFO, console lines, to a file); the producer as a host with no
   logging configured.
2. Through a real worker (``rerankq worker``, prefork, one process): every command Redis
   ran per stream (MONITOR), by side: this process (the producer: open, publish, pull) and
   the worker (Celery's fetch and ack, the task), scripts' inner calls counted apart.
   MONITOR shows commands, not round trips: a pipeline's commands count one each.

Celery's own receive and dispatch are not split out: they are the same for the raw Celery
round trip that ``queue.py`` subtracts.

    python -m ops.bench.queue --profile          (or: python -m ops.bench.hotpath)
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.bench.common import candidates, p50, print_table, rerankq_worker, worker_env, write_json

WINDOW = 25


class StepClock:
    """Inclusive time and Redis round trips per step, keyed by where it ran (its enclosing steps)."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, ...], list[float]] = defaultdict(list)
        self.trips: Counter[tuple[str, ...]] = Counter()
        self.order: list[tuple[str, ...]] = []  # step paths, in first-seen order
        self._local = threading.local()
        self._counting = False

    @property
    def _stack(self) -> list[list[Any]]:
        """This thread's running steps: [path, time taken by steps run apart inside it]."""
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def step(self, label: str, fn: Callable[..., Any], *, apart: bool = False) -> Callable[..., Any]:
        """``fn`` timed as a step. A step ``apart`` is shown on its own (not under the step it
        runs in) and its time is taken out of every step it runs in."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._stack
            path = (label,) if apart or not stack else (*stack[-1][0], label)
            frame = [path, 0.0]
            stack.append(frame)
            if self._counting and path not in self.times:
                self.order.append(path)
                self.times[path] = []
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                stack.pop()
                if self._counting:
                    self.times[path].append((elapsed - frame[1]) * 1000)
                if apart:
                    for outer in stack:
                        outer[1] += elapsed

        return timed

    def wrap(self, owner: Any, name: str, label: str) -> None:
        setattr(owner, name, self.step(label, getattr(owner, name)))

    def count_round_trips(self) -> None:
        """Count every redis-py send (one per command, one per pipeline) against the step running."""
        import redis.connection

        clock = self
        original = redis.connection.AbstractConnection.send_packed_command

        def send_packed_command(conn: Any, command: Any, check_health: bool = True) -> Any:
            if clock._counting:
                stack = clock._stack
                clock.trips[stack[-1][0] if stack else ("(outside any step)",)] += 1
            return original(conn, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]

    def counting(self, on: bool) -> None:
        self._counting = on

    def rows(self, n: int) -> list[list[Any]]:
        """One row per step path: p50 ms (per call) and round trips per window (its own, not its children's)."""
        children: dict[tuple[str, ...], list[tuple[str, ...]]] = defaultdict(list)
        for path in self.order:
            children[path[:-1]].append(path)
        ordered: list[tuple[str, ...]] = []

        def visit(parent: tuple[str, ...]) -> None:
            for path in children.get(parent, []):
                ordered.append(path)
                visit(path)

        visit(())
        self.order = ordered
        out = []
        for path in self.order:
            values = self.times[path]
            out.append(["  " * (len(path) - 1) + path[-1], round(p50(values), 4), round(self.trips[path] / n, 2)])
        return out


class TimedLogger:
    """A structlog logger whose calls (and those of the loggers it binds) are one step."""

    def __init__(self, inner: Any, clock: StepClock, label: str) -> None:
        self._inner, self._clock, self._label = inner, clock, label

    def bind(self, **kw: Any) -> TimedLogger:
        return TimedLogger(self._inner.bind(**kw), self._clock, self._label)

    def __getattr__(self, name: str) -> Any:
        return self._clock.step(self._label, getattr(self._inner, name))


def worker_logging(log_path: Path) -> None:
    """The worker's logging (INFO, console renderer), its lines into a file as a worker's go to its
    log; the producer's as in a host that configured nothing for it: its INFO lines off."""
    import logging

    from worker.logs import configure_logging

    log_file = open(log_path, "w")  # noqa: SIM115 - lives as long as the handler
    saved_stderr, sys.stderr = sys.stderr, log_file
    try:
        configure_logging(level="INFO")
    finally:
        sys.stderr = saved_stderr
    logging.getLogger("rerankq.producer").setLevel(logging.WARNING)


def wrap_producer(clock: StepClock, client: Any) -> list[str]:
    """Time the producer's open and the reader's pull, step by step; return the store's wait methods."""
    import producer.client as client_module

    clock.wrap(client, "open", "producer: open")
    clock.wrap(client.store, "open", "store.open (script)")
    if hasattr(client, "fair_share"):  # the older producer had no fair-share ledger
        clock.wrap(client.fair_share, "enter", "fair share: enter (script)")
    clock.wrap(client, "_send", "send (Celery publish)")
    client_module.log = TimedLogger(client_module.log, clock, "log line")
    clock.wrap(client, "pull", "reader: pull (page)")
    clock.wrap(client.store, "snapshot", "snapshot (pipeline)")
    clock.wrap(client_module, "build_page", "build page (decode results)")
    waits = [name for name in ("wait_for_commit", "wait_and_snapshot") if hasattr(client.store, name)]
    for name, label in (
        ("wait_for_commit", "wait for commit (XREAD)"),
        ("wait_and_snapshot", "wait for commit + snapshot (pipeline)"),
    ):
        if name in waits:  # the older reader waited, then read
            clock.wrap(client.store, name, label)
    return waits


def worker_runs_in_wait(client: Any, scorer: Any, waits: list[str]) -> dict[str, str]:
    """Make the task body run where a real one would: as the reader begins to wait for it. Returns
    the streams whose window is to run so (stream id: delivery tag), for the caller to fill."""
    waiting_for_worker: dict[str, str] = {}

    def worker_runs_first(wait: Callable[..., Any]) -> Callable[..., Any]:
        def call(stream_id: str, *args: Any, **kwargs: Any) -> Any:
            delivery = waiting_for_worker.pop(stream_id, None)
            if delivery is not None:
                scorer.process(stream_id, 0, delivery=delivery)
            return wait(stream_id, *args, **kwargs)

        return call

    for name in waits:
        setattr(client.store, name, worker_runs_first(getattr(client.store, name)))
    return waiting_for_worker


def wrap_worker(clock: StepClock, runtime: Any) -> None:
    """Time the worker's task body, step by step, shown apart from the pull it runs in."""
    import worker.chain.chain as chain_module
    import worker.windows as windows_module

    scorer, store = runtime.scorer, runtime.store
    scorer.process = clock.step("worker: task body", scorer.process, apart=True)
    clock.wrap(store, "begin", "store.begin (script)")
    clock.wrap(windows_module, "decode_window", "decode spec + candidates")
    clock.wrap(windows_module, "assemble", "assemble documents")
    clock.wrap(runtime.chain, "run", "chain.run")
    chain_module.check_scores = clock.step("check scores", chain_module.check_scores)
    wrap_chain_members(clock, runtime.chain.members)
    clock.wrap(windows_module, "decide", "decide")
    clock.wrap(store, "commit", "store.commit (script)")
    windows_module.log = TimedLogger(windows_module.log, clock, "log lines")


def wrap_chain_members(clock: StepClock, members: Any) -> None:
    from worker.chain.cache import CachedProvider
    from worker.chain.metering import MeteredProvider

    for member in members:
        layer = member.provider()
        while layer is not None:
            if isinstance(layer, CachedProvider):
                clock.wrap(layer, "_read", "pair cache read")
                clock.wrap(layer, "_write", "pair cache write (script)")
            elif isinstance(layer, MeteredProvider):
                clock.wrap(layer, "_count", "provider_calls counter")
                clock.wrap(layer.inner, "score", "provider.score (checked no-op)")
            layer = getattr(layer, "inner", None)


def profile_streams(
    clock: StepClock, client: Any, scorer: Any, waiting_for_worker: dict[str, str], n_windows: int
) -> None:
    """Count the steps of ``n_windows`` one-window streams (after ten unmeasured), then of as many deep pulls."""

    def one(i: int) -> None:
        # A real stream's calls in their order: open and send; the reader's pull, which finds
        # nothing and waits; the worker's task body, run as the wait begins (its time is shown
        # on its own, not in the pull's); the wait then returns at once and the page is read.
        stream = client.open(f"query {i}", candidates(WINDOW, f"q{i}"), window_size=WINDOW)
        waiting_for_worker[stream] = f"profile-{i}"
        page = client.pull(stream, 0, WINDOW, timeout=5)
        assert stream not in waiting_for_worker and len(page.rows) == WINDOW, len(page.rows)

    for i in range(10):
        one(-i - 1)
    clock.counting(True)
    for i in range(n_windows):
        one(i)
    clock.counting(False)
    # Deep pull: a page of committed windows, read alone.
    deep = client.open("deep pull", candidates(300, "deep"), window_size=WINDOW, first_windows=300 // WINDOW)
    clock.counting(False)
    for w in range(300 // WINDOW):
        scorer.process(deep, w, delivery=f"deep-{w}")
    client.pull(deep, 0, 10, timeout=5)  # the first pull after open, as the bench's
    deep_pull = clock.step("reader: deep pull page (10 of 300)", client.pull)
    clock.counting(True)
    for i in range(n_windows):
        deep_pull(deep, (i * 37) % 290, 10, timeout=5)
    clock.counting(False)


def in_process_profile(redis_url: str, n_windows: int, log_path: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    """Step 1: one process plays producer, worker (its task body) and reader, window by window."""
    from kernel.settings import load_settings
    from producer import RerankClient
    from worker.runtime import Runtime

    env = worker_env(redis_url, "hp", RERANKQ_RERANKER_PROVIDER="ops.bench.noop_provider:NoopProvider")
    settings = load_settings(env)
    worker_logging(log_path)

    clock = StepClock()
    clock.count_round_trips()
    client = RerankClient(settings)
    runtime = Runtime(settings)
    runtime.warm_up()
    waits = wrap_producer(clock, client)
    waiting_for_worker = worker_runs_in_wait(client, runtime.scorer, waits)
    wrap_worker(clock, runtime)
    try:
        profile_streams(clock, client, runtime.scorer, waiting_for_worker, n_windows)
    finally:
        runtime.close()
        client.close()
    rows = clock.rows(n_windows)
    return rows, {" / ".join(path): {"ms_p50": row[1], "round_trips": row[2]} for path, row in zip(clock.order, rows)}


def watch_commands(redis_url: str, client: Any, n_streams: int) -> tuple[list[tuple[str | None, str]], set[str]]:
    """Every command Redis ran while ``n_streams`` streams were opened and read, each as (client
    address, or None inside a script; command), and this process's own addresses."""
    import psutil
    import redis

    lines: list[tuple[str | None, str]] = []
    monitor = redis.Redis.from_url(redis_url)
    stop = threading.Event()

    def listen() -> None:
        with monitor.monitor() as m:
            for entry in m.listen():
                lua = entry.get("client_type") == "lua"
                address = None if lua else f"{entry['client_address']}:{entry['client_port']}"
                lines.append((address, entry["command"]))
                if stop.is_set():
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    time.sleep(0.3)
    lines.clear()
    for i in range(n_streams):
        client.pull(client.open(f"query {i}", candidates(WINDOW, "m"), window_size=WINDOW), 0, WINDOW, timeout=30)
    time.sleep(0.3)
    own = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("tcp") if c.laddr}
    snapshot = list(lines)
    stop.set()
    client.store.client.ping()  # one more command, so the listener sees the stop
    return snapshot, own


def commands_by_side(
    snapshot: list[tuple[str | None, str]], own: set[str], n_streams: int
) -> tuple[list[list[Any]], dict[str, Any]]:
    sides: dict[str, Counter[str]] = {"producer": Counter(), "worker": Counter(), "inside scripts": Counter()}
    for address, command in snapshot:
        side = "inside scripts" if address is None else "producer" if address in own else "worker"
        name = command.split(" ", 1)[0].upper() if command else "?"
        if name in ("PING", "MONITOR"):
            continue
        sides[side][name] += 1
    rows = []
    for side, counts in sides.items():
        total = sum(counts.values())
        detail = ", ".join(f"{k} {v / n_streams:g}" for k, v in counts.most_common())
        rows.append([side, round(total / n_streams, 2), detail])
    return rows, {side: {k: v / n_streams for k, v in counts.items()} for side, counts in sides.items()}


def monitor_profile(redis_url: str, n_streams: int, logs: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    """Step 2: commands Redis ran per stream through a real worker, by side (MONITOR)."""
    from kernel.settings import load_settings
    from producer import RerankClient

    env = worker_env(redis_url, "hm", RERANKQ_RERANKER_PROVIDER="ops.bench.noop_provider:NoopProvider")
    worker = rerankq_worker(env, logs / "monitor-worker.log").start()
    client = RerankClient(load_settings(env))
    try:
        for i in range(5):
            client.pull(client.open(f"warm {i}", candidates(WINDOW, "w"), window_size=WINDOW), 0, WINDOW, timeout=30)
        time.sleep(0.5)
        snapshot, own = watch_commands(redis_url, client, n_streams)
    finally:
        client.close()
        worker.stop()
    return commands_by_side(snapshot, own, n_streams)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=200, help="one-window streams profiled in process")
    parser.add_argument("--streams", type=int, default=20, help="streams watched through a real worker")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    from worker.embedded.redis_server import EmbeddedRedis

    server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-hotpath-"))
    try:
        step_rows, steps = in_process_profile(server.url, args.windows, logs / "in-process-worker.log")
        monitor_rows, commands = monitor_profile(server.url, args.streams, logs)
    finally:
        server.stop()
    print_table(
        f"one window, step by step in one process ({args.windows} windows; p50 ms, inclusive)",
        ["step", "p50 ms", "redis round trips"],
        step_rows,
    )
    print_table(
        f"commands Redis ran per one-window stream through a real worker ({args.streams} streams)",
        ["side", "commands", "by command"],
        monitor_rows,
    )
    write_json(args.json_path, {"steps": steps, "commands_per_stream": commands})


if __name__ == "__main__":
    main()
