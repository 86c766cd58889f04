"""What a profile must do: jobs submitted and every row of every window in the output, the gateway's
Cohere v2 answer, Prometheus's targets and rules."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from ops.compose_check.common import CANDIDATES, JOBS, KEEP, CheckFailed, http_json, run, url, wait_for
from ops.compose_check.profiles import Stack


def make_jobs(path: Path, prefix: str) -> None:
    words = [
        "payment",
        "gateway",
        "checkout",
        "error",
        "outage",
        "recovery",
        "restart",
        "certificate",
        "tls",
        "dns",
        "retry",
        "failover",
        "cache",
    ]
    with path.open("w") as out:
        for j in range(JOBS):
            candidates = [
                {"id": f"d{i}", "text": " ".join(words[(i + k) % len(words)] for k in range(8)) + f" {i}"}
                for i in range(CANDIDATES)
            ]
            out.write(
                json.dumps(
                    {
                        "id": f"{prefix}-{j}",
                        "query": f"{words[j % len(words)]} error recovery",
                        "candidates": candidates,
                    }
                )
                + "\n"
            )


def check_output(path: Path, prefix: str) -> int:
    """Every job present once with all its rows, all ranked, no failed window. Returns rows checked."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids = [line["id"] for line in lines]
    expected = {f"{prefix}-{j}" for j in range(JOBS)}
    if set(ids) != expected or len(ids) != len(expected):
        raise CheckFailed(f"{path.name}: jobs {sorted(set(ids) ^ expected)[:5]} missing or extra ({len(ids)} lines)")
    rows = 0
    for line in lines:
        got = {row["id"] for row in line["rows"]}
        if len(line["rows"]) != CANDIDATES or len(got) != CANDIDATES:
            raise CheckFailed(f"job {line['id']}: {len(line['rows'])} rows, {len(got)} distinct, expected {CANDIDATES}")
        bad = [row for row in line["rows"] if row["kind"] != "ranked"]
        if bad or line["failed_windows"]:
            raise CheckFailed(f"job {line['id']}: rows not ranked: {bad[:2]}")
        rows += len(line["rows"])
    return rows


class Submitter:
    """`rerankq submit` from this host (or from inside the gateway container when the host cannot reach the store)."""

    def __init__(self, stack: Stack, host_env: dict[str, str]) -> None:
        self.stack, self.host_env = stack, host_env

    def command(self, jobs: Path, out: Path) -> list[str]:
        args = ["submit", "--quiet", "--json", "--max-in-flight", "16", "--keep", str(KEEP)]
        if self.stack.profile.host_reaches_store:
            return [sys.executable, "-m", "rerankq", *args, str(jobs), "--out", str(out)]
        container = self.stack.container(self.stack.profile.gateway)
        run([*self.stack.engine.docker, "cp", str(jobs), f"{container}:/tmp/{jobs.name}"], timeout=60)
        return [
            *self.stack.engine.docker,
            "exec",
            container,
            "rerankq",
            *args,
            f"/tmp/{jobs.name}",
            "--out",
            f"/tmp/{out.name}",
        ]

    def start(self, jobs: Path, out: Path) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(jobs, out), env=self.host_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def finish(self, process: subprocess.Popen, jobs: Path, out: Path, timeout_s: float = 300) -> str:
        output, _ = process.communicate(timeout=timeout_s)
        if process.returncode != 0:
            raise CheckFailed(f"rerankq submit exited {process.returncode}: {output[-2000:]}")
        if not self.stack.profile.host_reaches_store:
            container = self.stack.container(self.stack.profile.gateway)
            run([*self.stack.engine.docker, "cp", f"{container}:/tmp/{out.name}", str(out)], timeout=60)
        return output

    def submit(self, jobs: Path, out: Path) -> str:
        return self.finish(self.start(jobs, out), jobs, out)


def cohere_v2(key: str) -> int:
    documents = [
        f"document {i} about payment gateway error recovery" if i % 3 == 0 else f"coffee break {i}" for i in range(30)
    ]
    reply = http_json(
        url("GATEWAY", "/v2/rerank"),
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
        body={"model": "rerankq", "query": "payment gateway error", "documents": documents, "top_n": 5},
    )
    results = reply["results"]
    if len(results) != 5 or len({r["index"] for r in results}) != 5:
        raise CheckFailed(f"cohere v2: {reply}")
    if not all(0 <= r["index"] < len(documents) and isinstance(r["relevance_score"], float) for r in results):
        raise CheckFailed(f"cohere v2 results out of shape: {results}")
    return len(results)


def check_prometheus() -> str:
    def targets_up() -> object:
        active = http_json(url("PROMETHEUS", "/api/v1/targets"))["data"]["activeTargets"]
        jobs = {t["labels"]["job"] for t in active}
        down = [t["scrapeUrl"] for t in active if t["health"] != "up"]
        return f"{len(active)} targets up" if {"rerankq-exporter", "rerankq-worker"} <= jobs and not down else None

    summary = wait_for("Prometheus targets all up (exporter and workers)", targets_up, 150, 5)
    groups = http_json(url("PROMETHEUS", "/api/v1/rules"))["data"]["groups"]
    alerts = [r["name"] for g in groups for r in g["rules"] if r.get("type") == "alerting"]
    if not alerts:
        raise CheckFailed("Prometheus loaded no alert rule")
    return f"{summary}, {len(alerts)} alert rules"


def check_ready(stack: Stack) -> str:
    """Each worker ready over HTTP, and Prometheus's targets and rules; Prometheus's note."""
    profile = stack.profile
    # Each worker's /readyz, over HTTP on its container's address.
    for worker in profile.workers:
        with urllib.request.urlopen(f"http://{stack.address(worker)}:9191/readyz", timeout=5) as reply:
            if reply.status != 200:
                raise CheckFailed(f"{worker} /readyz {reply.status}")
    return check_prometheus()


def check_users_and_cache(stack: Stack) -> str:
    """Every service unprivileged, the first worker's caches in the model-cache volume; a marker
    file written there, whose path is returned, for the kill to find again."""
    profile = stack.profile
    # Unprivileged users.
    for service in [*profile.workers, "exporter", profile.gateway]:
        uid = stack.exec(service, "id", "-u").stdout.strip()
        if uid == "0":
            raise CheckFailed(f"{service} runs as root")
    # The model cache: the volume, the worker user's HF_HOME and export root inside it.
    worker = profile.workers[0]
    mounts = json.loads(stack.inspect(worker, "{{json .Mounts}}"))
    cache = next((m for m in mounts if m["Destination"] == "/home/rerankq/.cache"), None)
    if cache is None or cache["Type"] != "volume":
        raise CheckFailed(f"{worker}: no model-cache volume at /home/rerankq/.cache: {mounts}")
    where = stack.exec(
        worker,
        "python",
        "-c",
        "import os; from worker.engine.export import export_root; "
        "print(os.environ['HF_HOME'], export_root('org/model'))",
    ).stdout.split()
    if not all(p.startswith("/home/rerankq/.cache/") for p in where):
        raise CheckFailed(f"{worker}: caches outside the volume: {where}")
    marker = f"/home/rerankq/.cache/huggingface/check-{profile.name}"
    stack.exec(worker, "sh", "-c", f"echo {profile.name} > {marker}")
    return marker
