"""Run docker-compose.yml for real: build its images, bring up each profile, push real jobs
through it under faults, and print one line per profile and a totals line (exit 1 on any failure).

In each profile:
- a ``rerankq submit`` of a JSONL file of jobs and a Cohere v2 call to the gateway, every job
  and every row checked in the output;
- the workers' ``/readyz`` (over HTTP, on each container's address), Prometheus's targets (all
  up, exporter and workers among them) and its alert rules loaded;
- ``docker kill`` of a worker container while a run is in flight: the restart policy brings it
  back and the run loses nothing; a restart of the broker's container (Redis, or RabbitMQ);
- every built image runs as the unprivileged user; the model cache is the volume, and what the
  worker's user writes there survives the worker's restart;
- ``stop`` while a run is in flight ends inside the grace periods, and after ``start`` the same
  (resumable) run finishes with every window; ``down`` ends inside the grace periods.

Images the registry cannot give are replaced by stand-ins of the same name built from Debian
packages (ops/standins/Dockerfile) on a base made with debootstrap, and the output says so. The
pip settings of this host (its wheel directories, its CA bundle) are handed to the build
without being written into any image. Model weights: a tiny cross-encoder built here
(devservers/tiny_model.py) and mounted into the workers, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("default", "amqp", "cluster", "sentinel", "flower")
BUILT = ("worker-cpu", "exporter", "gateway")  # the Dockerfile targets docker-compose.yml names
STANDIN_TARGETS = {
    "python": "python",
    "redis": "redis",
    "rabbitmq": "rabbitmq",
    "prom/prometheus": "prometheus",
    "mher/flower": "flower",
}
STANDIN_LABEL = "org.rerankq.standin"
PROJECT = "rerankqcheck"
# 4 windows of 25 per job; keeping 25 of 100 admits them all (the over-fetch rule: 4 x 25), so
# every row of every window is in the output.
JOBS, CANDIDATES, KEEP = 12, 100, 25
HEALTH_TIMEOUT_S = 240
WHEELS_PORT = 18765


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(
    cmd: list[str],
    *,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float | None = 900,
    capture: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cmd,
        check=False,
        env=env,
        timeout=timeout,
        text=True,
        input=input,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
    )
    if check and result.returncode != 0:
        tail = (result.stdout or "")[-3000:]
        raise CheckFailed(f"{' '.join(cmd[:6])} ... exited {result.returncode}\n{tail}")
    return result


def wait_for(what: str, probe: Callable[[], object], timeout_s: float, every_s: float = 2.0) -> object:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - keep polling; the last reason is reported
            last = exc
        time.sleep(every_s)
    raise CheckFailed(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def http_json(url: str, *, body: object = None, headers: dict[str, str] | None = None, timeout: float = 10) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read() or b"null")


# --- the engine and its clients -------------------------------------------------------------


@dataclass
class Engine:
    docker: list[str]  # a client that builds with BuildKit
    compose: list[str]
    compose_kind: str
    started_pid: int | None = None


def start_engine(work: Path) -> int | None:
    if run(["docker", "info"], check=False, timeout=30).returncode == 0:
        return None
    dockerd = shutil.which("dockerd")
    if not dockerd or os.geteuid() != 0:
        raise CheckFailed("no Docker engine answers, and dockerd is not installed or this is not root")
    log(f"starting dockerd (log: {work / 'dockerd.log'})")
    with (work / "dockerd.log").open("w") as dockerd_log:
        process = subprocess.Popen([dockerd], stdout=dockerd_log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for("dockerd", lambda: run(["docker", "info"], check=False, timeout=10).returncode == 0, 60, 1)
    return process.pid


def buildkit_client() -> list[str]:
    """A docker client whose `build` uses BuildKit: one with buildx, or one older than 23 with DOCKER_BUILDKIT=1."""
    candidates = dict.fromkeys(filter(None, [shutil.which("docker"), "/usr/bin/docker"]))
    for client in candidates:
        if not Path(client).exists():
            continue
        if run([client, "buildx", "version"], check=False, timeout=30).returncode == 0:
            return [client]
        version = run([client, "version", "--format", "{{.Client.Version}}"], check=False, timeout=30).stdout.strip()
        if re.match(r"^(1\d|20|21|22)\.", version):
            return [client]
    raise CheckFailed(
        "no docker client builds with BuildKit (install buildx, or a client before 23 for DOCKER_BUILDKIT=1)"
    )


def compose_client() -> tuple[list[str], str]:
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"], "docker compose (v2)"
    legacy = shutil.which("docker-compose")
    if legacy:
        version = run([legacy, "version", "--short"], check=False, timeout=30).stdout.strip()
        major_minor = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        if major_minor >= (1, 29):
            return [legacy], f"docker-compose {version} (v1)"
        raise CheckFailed(f"docker-compose {version} is too old: profiles need 1.28, depends_on conditions 1.29")
    raise CheckFailed("neither `docker compose` nor `docker-compose` is installed")


# --- what the build may use from this host ---------------------------------------------------


@dataclass
class PipSources:
    find_links: list[Path] = field(default_factory=list)
    cert: Path | None = None


def host_pip_sources() -> PipSources:
    """Wheel directories and the CA bundle this host's pip uses (`pip config list` and PIP_* variables)."""
    found = PipSources()
    listed = run([sys.executable, "-m", "pip", "config", "list"], check=False, timeout=60).stdout or ""
    values: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values.setdefault(key.split(".", 1)[-1], []).append(value.strip().strip("'\""))
    for name in ("find-links",):
        for value in values.get(name, []) + [os.environ.get("PIP_FIND_LINKS", "")]:
            for item in value.split():
                path = Path(item.removeprefix("file://"))
                if path.is_dir() and path not in found.find_links:
                    found.find_links.append(path)
    for value in [os.environ.get("PIP_CERT", ""), *values.get("cert", [])]:
        if value and Path(value).is_file():
            found.cert = Path(value)
            break
    return found


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """The directory over HTTP on loopback, for a `--network host` build's pip --find-links."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    # A fixed port where it is free: the URL is a build argument, and the same one keeps the
    # build's layer cache across runs.
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORTS = {name: free_port() for name in ("REDIS", "RABBITMQ", "GATEWAY", "PROMETHEUS", "FLOWER")}


def url(name: str, path: str) -> str:
    return f"http://127.0.0.1:{PORTS[name]}{path}"


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except urllib.error.HTTPError:
        return True
    except Exception:  # noqa: BLE001 - any failure is "not reachable"
        return False


# --- images ----------------------------------------------------------------------------------


def image_exists(docker: list[str], name: str) -> bool:
    return run([*docker, "image", "inspect", name], check=False, timeout=30).returncode == 0


def is_standin(docker: list[str], name: str) -> bool:
    """Built here rather than pulled: an image from a registry has a repository digest."""
    digests = run([*docker, "image", "inspect", "--format", "{{len .RepoDigests}}", name], timeout=30).stdout.strip()
    return digests == "0"


def debian_base(docker: list[str], work: Path) -> str:
    for name in ("debian:bookworm-slim", "rerankq-base:bookworm"):
        if image_exists(docker, name):
            return name
    if run([*docker, "pull", "debian:bookworm-slim"], check=False, timeout=120).returncode == 0:
        return "debian:bookworm-slim"
    if not shutil.which("debootstrap"):
        raise CheckFailed("no registry answers and debootstrap is not installed (apt-get install debootstrap)")
    mirror = apt_mirror()
    rootfs = work / "rootfs"
    log(f"no registry: making a Debian bookworm base with debootstrap from {mirror}")
    run(["nice", "-n", "10", "debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=1800)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for child in (rootfs / junk).glob("*"):
            if child.is_file():
                child.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        [*docker, "import", "-", "rerankq-base:bookworm"], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL
    )
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    return "rerankq-base:bookworm"


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            text = path.read_text()
            for match in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s", text):
                return match.group(1)
    return "http://deb.debian.org/debian"


def hub_images(compose_file: dict) -> list[str]:
    images = {s["image"] for s in compose_file["services"].values() if "image" in s and "build" not in s}
    return sorted(images)


def ensure_hub_images(docker: list[str], work: Path, images: list[str], cert_args: list[str]) -> list[str]:
    """Pull each; where the registry does not answer, build the Debian stand-in of the same name."""
    standins = []
    for image in images:
        repository = image.rsplit(":", 1)[0]
        if image_exists(docker, image):
            if is_standin(docker, image):
                standins.append(image)
            continue
        if run([*docker, "pull", image], check=False, timeout=300).returncode == 0:
            continue
        target = STANDIN_TARGETS.get(repository)
        if target is None:
            raise CheckFailed(f"{image}: cannot be pulled and has no stand-in")
        base = debian_base(docker, work)
        log(f"{image}: no registry answers; building a stand-in from Debian packages ({target})")
        build(
            docker,
            [
                "-f",
                "ops/standins/Dockerfile",
                "--build-arg",
                f"BASE={base}",
                "--target",
                target,
                "--label",
                f"{STANDIN_LABEL}=debian-bookworm",
                *cert_args,
                "-t",
                image,
                "ops/standins",
            ],
        )
        standins.append(image)
    return standins


def build(docker: list[str], args: list[str]) -> float:
    started = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    result = subprocess.run(
        check=False,
        args=["nice", "-n", "10", *docker, "build", "--network", "host", "--progress", "plain", *args],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=3600,
    )
    if result.returncode != 0:
        raise CheckFailed(f"docker build {' '.join(args)} failed:\n{result.stdout[-4000:]}")
    return time.monotonic() - started


def image_size_mb(docker: list[str], name: str) -> float:
    return int(run([*docker, "image", "inspect", "--format", "{{.Size}}", name], timeout=30).stdout.strip()) / 1e6


# --- one profile -----------------------------------------------------------------------------


@dataclass
class Profile:
    name: str
    args: list[str]  # after `compose`, before `up`
    up_args: list[str]
    workers: list[str]
    gateway: str
    broker_service: str
    env: dict[str, str] = field(default_factory=dict)
    host_reaches_store: bool = True  # else jobs are submitted from inside the gateway container


def profiles(password: str, rabbit_password: str) -> dict[str, Profile]:
    amqp = f"amqp://rerankq:{rabbit_password}@rabbitmq:5672//"
    return {
        "default": Profile("default", [], [], ["worker-cpu"], "gateway", "redis"),
        "amqp": Profile(
            "amqp", ["--profile", "amqp"], [], ["worker-cpu"], "gateway", "rabbitmq", env={"RERANKQ_BROKER_URL": amqp}
        ),
        "cluster": Profile(
            "cluster",
            ["--profile", "cluster"],
            ["--scale", "worker-cpu=0", "--scale", "gateway=0"],
            ["worker-cpu-cluster"],
            "gateway-cluster",
            "redis",
            host_reaches_store=False,
        ),
        "sentinel": Profile(
            "sentinel",
            ["--profile", "sentinel"],
            ["--scale", "worker-cpu=0", "--scale", "gateway=0"],
            ["worker-cpu-sentinel"],
            "gateway-sentinel",
            "redis",
            env={"REDIS_MIN_REPLICAS_TO_WRITE": "1"},
            host_reaches_store=False,
        ),
        "flower": Profile(
            "flower",
            ["--profile", "flower"],
            [],
            ["worker-cpu"],
            "gateway",
            "redis",
            env={"RERANKQ_TASK_EVENTS": "true"},
        ),
    }


class Stack:
    def __init__(self, engine: Engine, profile: Profile, work: Path, env: dict[str, str], override: Path) -> None:
        self.engine, self.profile, self.work = engine, profile, work
        self.env = {**env, **profile.env}
        self.base = [
            *engine.compose,
            "-p",
            PROJECT,
            "-f",
            str(ROOT / "docker-compose.yml"),
            "-f",
            str(override),
            *profile.args,
        ]

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        return run([*self.base, *args], env=self.env, check=check, timeout=timeout)

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        if not ids:
            raise CheckFailed(f"{service}: no container")
        return ids[0]

    def inspect(self, service: str, template: str) -> str:
        return run(
            [*self.engine.docker, "inspect", "--format", template, self.container(service)], timeout=30
        ).stdout.strip()

    def health(self, service: str) -> str:
        return self.inspect(service, "{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}")

    def wait_healthy(self, services: list[str], timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        for service in services:
            wait_for(f"{service} healthy", lambda s=service: self.health(s) == "healthy", timeout_s)

    def address(self, service: str) -> str:
        return self.inspect(service, "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}").split()[0]

    def exec(self, service: str, *cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return run([*self.engine.docker, "exec", self.container(service), *cmd], check=check, timeout=timeout)


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


def crash(stack: Stack, service: str) -> None:
    """SIGKILL the container's main process from the host, as the kernel's OOM killer would.

    Not `docker kill`: Docker counts that as a manual stop, and no restart policy restarts a
    container stopped by hand (the container stays Exited (137)).
    """
    pid = int(stack.inspect(service, "{{.State.Pid}}"))
    if pid <= 0:
        raise CheckFailed(f"{service} is not running")
    os.kill(pid, signal.SIGKILL)


def check_profile(stack: Stack, key: str, host_env: dict[str, str], docker: list[str]) -> str:
    profile, work = stack.profile, stack.work / stack.profile.name
    work.mkdir(exist_ok=True)
    notes: list[str] = []
    stack.compose("up", "-d", "--no-build", *profile.up_args, timeout=900)
    stack.wait_healthy([*profile.workers, profile.gateway, "exporter"])

    # Each worker's /readyz, over HTTP on its container's address.
    for worker in profile.workers:
        with urllib.request.urlopen(f"http://{stack.address(worker)}:9191/readyz", timeout=5) as reply:
            if reply.status != 200:
                raise CheckFailed(f"{worker} /readyz {reply.status}")
    notes.append(check_prometheus())

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

    submitter = Submitter(stack, host_env)
    # 1. A run with a worker killed in the middle of it.
    jobs, out = work / "jobs-kill.jsonl", work / "out-kill.jsonl"
    make_jobs(jobs, f"{profile.name}-kill")
    started = time.monotonic()
    process = submitter.start(jobs, out)
    time.sleep(1.5)
    restarts = int(stack.inspect(worker, "{{.RestartCount}}"))
    crash(stack, worker)
    wait_for(
        f"{worker} restarted by its restart policy",
        lambda: int(stack.inspect(worker, "{{.RestartCount}}")) > restarts and stack.health(worker) == "healthy",
        HEALTH_TIMEOUT_S,
    )
    submitter.finish(process, jobs, out)
    rows = check_output(out, f"{profile.name}-kill")
    notes.append(f"kill: {rows} rows in {time.monotonic() - started:.0f}s")
    if stack.exec(worker, "cat", marker).stdout.strip() != profile.name:
        raise CheckFailed(f"{worker}: the cache volume lost {marker} across the restart")

    # 2. The broker's container restarted once, then a run and a gateway call.
    stack.compose("restart", profile.broker_service, timeout=120)
    stack.wait_healthy([profile.broker_service], 120)
    stack.wait_healthy([*profile.workers, profile.gateway], HEALTH_TIMEOUT_S)
    jobs, out = work / "jobs-broker.jsonl", work / "out-broker.jsonl"
    make_jobs(jobs, f"{profile.name}-broker")
    submitter.submit(jobs, out)
    rows = check_output(out, f"{profile.name}-broker")
    cohere_v2(key)
    notes.append(f"{profile.broker_service} restart: {rows} rows + cohere v2")

    if profile.name == "flower":
        # The dashboard's JSON, not /api: Flower 2 serves its API only with auth configured or
        # FLOWER_UNAUTHENTICATED_API set, and that API can shut workers down.
        def online() -> object:
            rows = http_json(url("FLOWER", "/workers?json=1&refresh=1"), timeout=20)["data"]
            return [r["hostname"] for r in rows if r.get("task-succeeded", 0) > 0]

        flower = wait_for("Flower lists the workers, with their task events", online, 120, 5)
        notes.append(f"flower sees task events from {len(flower)} worker(s)")

    # 3. stop while a run is in flight; start; the same run, resumed, has every window.
    jobs, out = work / "jobs-stop.jsonl", work / "out-stop.jsonl"
    make_jobs(jobs, f"{profile.name}-stop")
    # From inside the gateway container, the run dies with it; its ledger stays in the container.
    process = submitter.start(jobs, out)
    time.sleep(1.5)
    grace = max(parse_duration(stack_service(s).get("stop_grace_period", "10s")) for s in profile.workers)
    began = time.monotonic()
    stack.compose("stop", timeout=300)
    stop_s = time.monotonic() - began
    if stop_s > grace + 15:
        raise CheckFailed(f"stop took {stop_s:.0f}s, over the {grace:.0f}s grace period")
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=30)
    if process.poll() is None:
        process.kill()
        process.wait()
    stack.compose("up", "-d", "--no-build", *profile.up_args, timeout=900)
    stack.wait_healthy([*profile.workers, profile.gateway, "exporter"])
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    submitter.submit(jobs, out)  # the same run id: resumes, opens nothing twice
    rows = check_output(out, f"{profile.name}-stop")
    notes.append(f"stop {stop_s:.0f}s/{grace:.0f}s grace, resumed: {rows} rows")
    return "; ".join(notes)


_COMPOSE_FILE: dict = {}


def stack_service(name: str) -> dict:
    return _COMPOSE_FILE["services"][name]


def parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(text)))


def write_override(path: Path, model: Path) -> None:
    """The check's own settings for the workers: the tiny model mounted, faster redelivery."""
    worker_env = {
        "RERANKQ_RERANKER_PROVIDER": "local",
        "RERANKQ_RERANKER_MODEL": "/models/tiny-cross-encoder",
        "RERANKQ_RERANKER_BACKEND": "torch",
        "RERANKQ_WORKER_PROCESSES": "1",
        "RERANKQ_TORCH_THREADS": "1",
        "RERANKQ_REDELIVER_AFTER_S": "15",
        "RERANKQ_SWEEP_INTERVAL_S": "5",
    }
    workers = [
        name for name, s in _COMPOSE_FILE["services"].items() if s.get("build", {}).get("target") == "worker-cpu"
    ]
    override = {
        "services": {
            name: {"environment": worker_env, "volumes": [f"{model}:/models/tiny-cross-encoder:ro"]} for name in workers
        }
    }
    if not _COMPOSE_FILE.get("version"):
        path.write_text(yaml.safe_dump(override))
    else:
        path.write_text(yaml.safe_dump({"version": _COMPOSE_FILE["version"], **override}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="*", metavar="PROFILE", help=f"of {', '.join(PROFILES)} (default: all)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory (logs, outputs) in place")
    args = parser.parse_args()
    unknown = sorted(set(args.profiles) - set(PROFILES))
    if unknown:
        parser.error(f"unknown profiles {unknown}: choose from {', '.join(PROFILES)}")
    args.profiles = args.profiles or list(PROFILES)
    _COMPOSE_FILE.update(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rerankq-compose-check."))
    os.chmod(work, 0o755)
    engine: Engine | None = None
    results: list[tuple[str, bool, str, float]] = []
    try:
        started_pid = start_engine(work)
        docker = buildkit_client()
        compose, kind = compose_client()
        engine = Engine(docker, compose, kind, started_pid)
        log(
            f"engine: {run([*docker, 'version', '--format', '{{.Server.Version}}'], timeout=30).stdout.strip()}; "
            f"builds: {docker[0]} with BuildKit; compose: {kind}"
        )

        sources = host_pip_sources()
        cert_args = ["--secret", f"id=pip_cert,src={sources.cert}"] if sources.cert else []
        standins = ensure_hub_images(docker, work, hub_images(_COMPOSE_FILE) + ["python:3.11-slim"], cert_args)
        for image in standins:
            log(f"stand-in: {image} is built here from Debian bookworm packages (no registry answered)")

        build_args = list(cert_args)
        torch_wheels = [w for d in sources.find_links for w in sorted(d.glob("torch-*+cpu-*.whl"))]
        with contextlib.ExitStack() as stack:
            if not reachable("https://download.pytorch.org/whl/cpu/"):
                if not torch_wheels:
                    raise CheckFailed(
                        "the PyTorch CPU index is unreachable and no local torch +cpu wheel is configured"
                    )
                wheel = torch_wheels[-1]
                version = wheel.name.split("-")[1]
                url = stack.enter_context(serve_directory(wheel.parent))
                log(
                    f"PyTorch index unreachable: torch=={version} from {wheel.parent} (served on {url}),"
                    " the rest from PyPI"
                )
                build_args += [
                    "--build-arg",
                    "TORCH_CPU_INDEX=https://pypi.org/simple",
                    "--build-arg",
                    f"TORCH_SPEC=torch=={version}",
                    "--build-arg",
                    f"PIP_BUILD_FIND_LINKS={url}",
                ]
            for target in BUILT:
                image = f"rerankq-{target}:latest"
                seconds = build(docker, ["-f", "ops/Dockerfile", "--target", target, *build_args, "-t", image, "."])
                log(f"built {image}: {image_size_mb(docker, image):.0f} MB in {seconds:.0f}s")
        cuda = run(
            [
                *docker,
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                "rerankq-worker-cpu:latest",
                "-c",
                (
                    "find / -xdev \\( -name 'libcudart*' -o -name 'libcublas*'"
                    " -o -name 'libnccl*' -o -name 'libcudnn*' \\)"
                    " 2>/dev/null | head -5"
                ),
            ],
            timeout=120,
        ).stdout.strip()
        if cuda:
            raise CheckFailed(f"the CPU worker image holds CUDA libraries: {cuda}")
        log("rerankq-worker-cpu: no CUDA libraries")

        model = work / "tiny-cross-encoder"
        run(
            [
                sys.executable,
                "-c",
                (
                    "import sys; from devservers.tiny_model import "
                    "build_tiny_cross_encoder as b; from pathlib import Path; b(Path(sys.argv[1]))"
                ),
                str(model),
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
        run(["chmod", "-R", "a+rX", str(model)])
        keys_file = work / "gateway-keys.json"
        made = run(
            [
                sys.executable,
                "-m",
                "producer.gateway",
                "keygen",
                "--tenant",
                "check",
                "--keys-file",
                str(keys_file),
                "--json",
            ],
            timeout=60,
            capture=True,
        )
        key = json.loads(made.stdout.strip().splitlines()[-1])["key"]
        keys_file.chmod(0o644)
        override = work / "override.yml"
        write_override(override, model)

        password, rabbit_password = secrets.token_hex(12), secrets.token_hex(12)
        env = {
            **os.environ,
            "RERANKQ_REDIS_PASSWORD": password,
            "RERANKQ_RABBITMQ_PASSWORD": rabbit_password,
            "RERANKQ_GATEWAY_KEYS_FILE": str(keys_file),
            **{f"RERANKQ_{name}_HOST_PORT": str(port) for name, port in PORTS.items()},
        }
        for name in args.profiles:
            profile = profiles(password, rabbit_password)[name]
            host_env = {**os.environ, "RERANKQ_REDIS_URL": f"redis://:{password}@127.0.0.1:{PORTS['REDIS']}/0"}
            if name == "amqp":
                host_env["RERANKQ_BROKER_URL"] = f"amqp://rerankq:{rabbit_password}@127.0.0.1:{PORTS['RABBITMQ']}//"
            stack = Stack(engine, profile, work, env, override)
            t0 = time.monotonic()
            try:
                note = check_profile(stack, key, host_env, docker)
                ok = True
            except (CheckFailed, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
                ok, note = False, str(exc).strip().splitlines()[0][:400]
                log(f"{name} FAILED: {exc}")
                (work / f"{name}-logs.txt").write_text(
                    stack.compose("logs", "--no-color", "--tail", "200", check=False).stdout or ""
                )
                log(f"{name}: container logs in {work / (name + '-logs.txt')}")
            down_began = time.monotonic()
            stack.compose("down", "-v", "--remove-orphans", check=False, timeout=300)
            down_s = time.monotonic() - down_began
            note += f"; down {down_s:.0f}s"
            results.append((name, ok, note, time.monotonic() - t0))
            print(f"PROFILE {name:9} {'PASS' if ok else 'FAIL'} {time.monotonic() - t0:5.0f}s  {note}", flush=True)
    except CheckFailed as exc:
        print(f"SETUP FAIL: {exc}", flush=True)
        results.append(("setup", False, str(exc), 0.0))
    finally:
        if engine is not None and engine.started_pid is not None:
            log("stopping the dockerd this check started")
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.started_pid, signal.SIGTERM)
            # dockerd stops its containerd before it exits: wait for that, as a supervisor would.
            deadline = time.monotonic() + 60
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(engine.started_pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                    time.sleep(0.5)
        if not args.keep and all(ok for _, ok, _, _ in results):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    passed = sum(ok for _, ok, _, _ in results)
    print(f"TOTAL {passed}/{len(results)} passed in {time.monotonic() - began:.0f}s", flush=True)
    return 0 if results and passed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
