"""``rerankq submit`` against a Python loop, and interactive latency while a batch drains.

    python -m ops.bench.submit            # 2,000 jobs per arm, RSS at 2,000 and 20,000 lines
    python -m ops.bench.submit --quick

1. Throughput: the same 2,000 small jobs (25 candidates, one window each) through ``rrf`` on
   one CPU worker, once by ``rerankq submit`` (a subprocess, as a user runs it) and once by a
   Python loop that opens every job with ``RerankClient`` and then pulls each one and writes it
   out, alternated over rounds. Jobs per second side by side and their ratio, the median of the
   rounds' ratios (target >= 0.9). Submit's rate is taken from its first open to its last write
   (its own summary), like the loop's, which starts with a client already made; and, more
   strictly, from process start (interpreter, imports, connections) to exit.
2. Memory: peak RSS of ``rerankq submit`` on a 2,000-line and a 20,000-line input (target: flat).
3. Interactive latency: one-window streams (open, then pull the page) on the idle queue, and
   the same streams while a 2,000-job batch (``--lane batch``) drains on the same device
   queue, alternated over rounds; p50 side by side (target: within 2x of idle). Also the same
   batch sent in the interactive lane: what the lane saves. Twice: on the ``rrf`` worker, where
   every window is CPU work on the same cores as the batch client and Redis; and on a worker
   whose provider spends ``--window-ms`` per window off the CPU (a model on a GPU, a remote
   reranker), where the batch keeps a real backlog in the queue.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ops.bench.common import median_of_ratios, p50, percentile, print_table, rerankq_worker, worker_env, write_json
from producer import RerankClient, load_settings
from worker.embedded.redis_server import EmbeddedRedis

CANDIDATES = 25
RERANKQ = [sys.executable, "-m", "rerankq"]


def write_jobs(path: Path, n: int, tag: str) -> Path:
    with open(path, "w") as fh:
        for j in range(n):
            fh.write(
                json.dumps(
                    {
                        "id": f"{tag}-{j}",
                        "query": f"{tag} payment gateway outage {j}",
                        "candidates": [
                            {
                                "id": f"d{i}",
                                "text": f"incident note {i} for job {j}: the gateway "
                                "returned 502 after a certificate expired",
                            }
                            for i in range(CANDIDATES)
                        ],
                    }
                )
                + "\n"
            )
    return path


def run_submit(env: dict[str, str], jobs: Path, out: Path, *extra: str) -> tuple[dict, float]:
    """Runs submit to the end; returns its JSON summary and the wall time from start to exit."""
    start = time.perf_counter()
    done = subprocess.run(
        [*RERANKQ, "submit", str(jobs), "--out", str(out), "--keep", "5", "--quiet", "--json", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"submit failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    return json.loads(done.stdout), wall


def python_loop(client: RerankClient, jobs: Path, out: Path) -> float:
    """Open every job, then pull and write each one: what a pipeline would write by hand."""
    start = time.perf_counter()
    streams = []
    with open(jobs, "rb") as fh:
        for line in fh:
            job = json.loads(line)
            streams.append(
                (job["id"], client.open(job["query"], job["candidates"], window_size=CANDIDATES, keep=5, lane="batch"))
            )
    with open(out, "w") as fh:
        for job_id, stream in streams:
            page = client.pull(stream, 0, CANDIDATES, timeout=600)
            if not page.complete:
                raise RuntimeError(f"{stream} not complete")
            fh.write(
                json.dumps(
                    {
                        "id": job_id,
                        "stream": stream,
                        "rows": [
                            {"rank": r.rank, "id": r.id, "kind": r.kind, "score": r.score, "final_score": r.final_score}
                            for r in page.rows
                        ],
                    }
                )
                + "\n"
            )
    return time.perf_counter() - start


def peak_rss_mb(env: dict[str, str], jobs: Path, out: Path) -> float:
    """Peak RSS of a submit process: measured by a parent that waits for it (ru_maxrss of its children)."""
    probe = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *RERANKQ, "submit", str(jobs), "--out", str(out), "--keep", "5", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return int(done.stdout.strip()) / 1024


def interactive_ms(client: RerankClient, probe: object, queue: str, n: int, tag: str, depths: list[int]) -> list[float]:
    """Open-to-page times of ``n`` one-window streams, spaced; the queue depth seen before each."""
    times = []
    for i in range(n):
        depths.append(probe.depth([queue]))  # type: ignore[attr-defined]
        start = time.perf_counter()
        stream = client.open(
            f"{tag} {i} is anyone there",
            [{"id": f"c{k}", "text": f"doc {k} of {tag} {i}"} for k in range(CANDIDATES)],
            window_size=CANDIDATES,
        )
        page = client.pull(stream, 0, CANDIDATES, timeout=60)
        times.append((time.perf_counter() - start) * 1000)
        if not page.complete:
            raise RuntimeError(f"{stream} not complete")
        time.sleep(0.02)  # a person's requests arrive spaced, not back to back
    return times


def start_drain(env: dict[str, str], scratch: Path, name: str, lane: str) -> subprocess.Popen[str]:
    """A 2,000-job ``rerankq submit`` in ``lane``, running in the background."""
    return subprocess.Popen(
        [
            *RERANKQ,
            "submit",
            str(write_jobs(scratch / f"{name}.jsonl", 2000, name)),
            "--out",
            str(scratch / f"{name}.out"),
            "--keep",
            "5",
            "--quiet",
            "--json",
            "--lane",
            lane,
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_queued(probe: Any, queue: str) -> None:
    deadline = time.monotonic() + 60
    while probe.depth([queue]) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)  # the batch is queued and draining before the first interactive stream


def latency_figures(times: dict[str, list[float]], depths: dict[str, list[int]]) -> dict[str, object]:
    idle = p50(times["idle"])
    return {
        arm: {
            "n": len(t),
            "p50": p50(t),
            "p90": percentile(t, 0.9),
            "max": max(t),
            "ratio": p50(t) / idle,
            "queued_p50": p50(depths[arm]),
        }
        for arm, t in times.items()
    }


def latency(
    env: dict[str, str], client: RerankClient, scratch: Path, *, rounds: int, per_block: int, tag: str
) -> dict[str, object]:
    """Idle and busy blocks alternate over rounds, so load from elsewhere on the host hits both."""
    from kernel.broker_queues import QueueProbe
    from kernel.store import connect

    probe = QueueProbe(connect(env["RERANKQ_REDIS_URL"]))
    queue = env["RERANKQ_CPU_QUEUE"]
    times: dict[str, list[float]] = {"idle": [], "batch": [], "interactive": []}
    depths: dict[str, list[int]] = {"idle": [], "batch": [], "interactive": []}
    try:
        interactive_ms(client, probe, queue, 5, f"{tag} warm", [])
        for r in range(rounds):
            times["idle"] += interactive_ms(client, probe, queue, per_block, f"{tag} idle{r}", depths["idle"])
            # The batch in its lane, then the same batch in the interactive lane: what the lane saves.
            for lane in ("batch", "interactive"):
                drain = start_drain(env, scratch, f"{tag}-drain{r}{lane}", lane)
                wait_queued(probe, queue)
                times[lane] += interactive_ms(client, probe, queue, per_block, f"{tag} busy{r}{lane}", depths[lane])
                drained = json.loads(drain.communicate(timeout=3600)[0])
                if drained["jobs"]["done"] != 2000:
                    raise RuntimeError(f"the batch did not finish: {drained}")
    finally:
        probe.client.close()
    return latency_figures(times, depths)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=None, help="jobs per throughput arm (default 2000)")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds of each arm (default 5)")
    parser.add_argument("--rss-lines", type=int, nargs=2, default=None, help="input sizes for the RSS step")
    parser.add_argument("--window-ms", type=float, default=10.0, help="the off-CPU provider's time per window")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


@dataclasses.dataclass
class Throughput:
    """Jobs per second per round: submit by its own summary, submit from process start, the Python loop."""

    submit: list[float] = dataclasses.field(default_factory=list)
    submit_wall: list[float] = dataclasses.field(default_factory=list)
    loop: list[float] = dataclasses.field(default_factory=list)


def throughput_rounds(
    env: dict[str, str], client: RerankClient, scratch: Path, *, n_jobs: int, rounds: int
) -> Throughput:
    run_submit(env, write_jobs(scratch / "warm.jsonl", 50, "warm"), scratch / "warm.out")
    rates = Throughput()
    for r in range(rounds):
        summary, wall = run_submit(
            env, write_jobs(scratch / f"submit{r}.jsonl", n_jobs, f"s{r}"), scratch / f"submit{r}.out"
        )
        if summary["jobs"]["done"] != n_jobs:
            raise RuntimeError(summary)
        rates.submit.append(n_jobs / summary["elapsed_s"])
        rates.submit_wall.append(n_jobs / wall)
        loop_jobs = write_jobs(scratch / f"loop{r}.jsonl", n_jobs, f"l{r}")
        rates.loop.append(n_jobs / python_loop(client, loop_jobs, scratch / f"loop{r}.out"))
        print(
            f"round {r}: submit {rates.submit[-1]:.0f} jobs/s ({rates.submit_wall[-1]:.0f} from process start), "
            f"loop {rates.loop[-1]:.0f} jobs/s",
            flush=True,
        )
    return rates


def peak_rss(env: dict[str, str], scratch: Path, sizes: list[int]) -> dict[int, float]:
    rss = {
        n: peak_rss_mb(env, write_jobs(scratch / f"rss{n}.jsonl", n, f"m{n}"), scratch / f"rss{n}.out") for n in sizes
    }
    print(f"peak RSS: {', '.join(f'{n} lines {mb:.0f} MB' for n, mb in rss.items())}", flush=True)
    return rss


@dataclasses.dataclass
class Measured:
    rates: Throughput
    rss: dict[int, float]
    cpu_bound: dict[str, object]
    off_cpu: dict[str, object]


def measure(args: argparse.Namespace, *, n_jobs: int, rounds: int, rss_sizes: list[int], per_block: int) -> Measured:
    """Throughput, peak RSS and latency on the rrf worker, then latency on the paced (off-CPU) worker."""
    redis_server = EmbeddedRedis().start()
    scratch = Path(tempfile.mkdtemp(prefix="rerankq-bench-submit-"))
    ns = "bs" + uuid.uuid4().hex[:6]
    env = worker_env(redis_server.url, ns, RERANKQ_RERANKER_PROVIDER="rrf", RERANKQ_PAIR_CACHE="false")
    paced_env = {
        **env,
        "RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:PacedProvider",
        "BENCH_WINDOW_S": str(args.window_ms / 1000),
    }
    client = RerankClient(load_settings(env))
    worker = rerankq_worker(env, scratch / "worker.log", "--processes", "1").start()
    try:
        rates = throughput_rounds(env, client, scratch, n_jobs=n_jobs, rounds=rounds)
        rss = peak_rss(env, scratch, rss_sizes)
        cpu_bound = latency(env, client, scratch, rounds=rounds, per_block=per_block, tag="rrf")
        worker.stop()
        worker = rerankq_worker(paced_env, scratch / "paced-worker.log", "--processes", "1").start()
        off_cpu = latency(paced_env, client, scratch, rounds=rounds, per_block=per_block, tag="paced")
    finally:
        client.close()
        worker.stop()
        redis_server.stop()
    return Measured(rates, rss, cpu_bound, off_cpu)


def print_throughput(rates: Throughput, rss: dict[int, float], n_jobs: int) -> None:
    print_table(
        f"submit: {n_jobs} jobs of {CANDIDATES} candidates (one window) through rrf, one CPU worker process",
        ["arm", "jobs/s (median of rounds)", "rounds"],
        [
            ["rerankq submit (first open to last write)", statistics.median(rates.submit), len(rates.submit)],
            ["rerankq submit (process start to exit)", statistics.median(rates.submit_wall), len(rates.submit_wall)],
            ["Python loop with RerankClient", statistics.median(rates.loop), len(rates.loop)],
            ["ratio submit / loop (median of rounds)", median_of_ratios(rates.submit, rates.loop), ""],
            ["ratio, from process start", median_of_ratios(rates.submit_wall, rates.loop), ""],
        ],
    )
    print_table("submit: peak RSS", ["input lines", "peak RSS MB"], [[n, mb] for n, mb in rss.items()])


LANE_LABELS = {
    "idle": "idle queue",
    "batch": "2,000-job batch draining, batch lane (submit's default)",
    "interactive": "the same batch in the interactive lane (no lanes)",
}


def print_latency(measured: Measured, *, rounds: int, window_ms: float) -> None:
    for title, view in (
        ("on the rrf worker (CPU-bound: worker, batch client and Redis share the cores)", measured.cpu_bound),
        (f"on a worker whose provider spends {window_ms:g} ms per window off the CPU", measured.off_cpu),
    ):
        print_table(
            f"interactive one-window streams, open to page, ms, {rounds} alternated rounds: {title}",
            ["queue", "n", "p50", "p90", "max", "p50 / idle", "windows queued (p50)"],
            [
                [LANE_LABELS[arm], v["n"], v["p50"], v["p90"], v["max"], v["ratio"], v["queued_p50"]]
                for arm, v in view.items()
            ],
        )


def main() -> None:
    args = parse_arguments()
    n_jobs = args.jobs or (600 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 5)
    rss_sizes = args.rss_lines or ([1000, 4000] if args.quick else [2000, 20000])
    per_block = 20 if args.quick else 30
    measured = measure(args, n_jobs=n_jobs, rounds=rounds, rss_sizes=rss_sizes, per_block=per_block)
    rates = measured.rates
    print_throughput(rates, measured.rss, n_jobs)
    print_latency(measured, rounds=rounds, window_ms=args.window_ms)
    write_json(
        args.json_path,
        {
            "jobs": n_jobs,
            "rounds": rounds,
            "submit_jobs_per_s": statistics.median(rates.submit),
            "submit_wall_jobs_per_s": statistics.median(rates.submit_wall),
            "loop_jobs_per_s": statistics.median(rates.loop),
            "ratio": median_of_ratios(rates.submit, rates.loop),
            "ratio_wall": median_of_ratios(rates.submit_wall, rates.loop),
            "submit_rounds": rates.submit,
            "loop_rounds": rates.loop,
            "peak_rss_mb": {str(n): mb for n, mb in measured.rss.items()},
            "latency_rrf": measured.cpu_bound,
            "latency_off_cpu": measured.off_cpu,
            "window_ms": args.window_ms,
        },
    )


if __name__ == "__main__":
    main()
