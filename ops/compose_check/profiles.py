"""The compose profiles: what each starts, a stack brought up and down, the compose file read and
overridden."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ops.compose_check.common import HEALTH_TIMEOUT_S, PROJECT, ROOT, CheckFailed, run, wait_for
from ops.compose_check.engine import Engine


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


# docker-compose.yml as read by main, once: the jobs look its services up here.
COMPOSE_FILE: dict = {}


def stack_service(name: str) -> dict:
    return COMPOSE_FILE["services"][name]


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
    workers = [name for name, s in COMPOSE_FILE["services"].items() if s.get("build", {}).get("target") == "worker-cpu"]
    override = {
        "services": {
            name: {"environment": worker_env, "volumes": [f"{model}:/models/tiny-cross-encoder:ro"]} for name in workers
        }
    }
    if not COMPOSE_FILE.get("version"):
        path.write_text(yaml.safe_dump(override))
    else:
        path.write_text(yaml.safe_dump({"version": COMPOSE_FILE["version"], **override}))
