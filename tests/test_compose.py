"""docker-compose.yml and ops/Dockerfile, read (no Docker engine runs here) and checked against
what the worker, the exporter and Prometheus expect: each service's build target, command,
health check, volumes and environment."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from producer.exporter.main import exporter as exporter_command
from producer.settings import load_settings
from worker.cli.worker_command import worker as worker_command

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
WORKERS = {"worker-cpu": "cpu", "worker-gpu": "gpu"}


@dataclass
class Stage:
    name: str
    parent: str  # an image, or another stage's name
    env: dict[str, str] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    user: str | None = None


def dockerfile_stages(path: Path) -> dict[str, Stage]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())  # join continued lines
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            parts = rest.split()
            current = Stage(name=parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else parts[0], parent=parts[0])
            stages[current.name] = current
        elif current is None:
            continue
        elif instruction == "ENV":
            current.env.update(dict(part.split("=", 1) for part in shlex.split(rest)))
        elif instruction == "RUN":
            current.runs.append(rest)
        elif instruction == "USER":
            current.user = rest.strip()
    return stages


STAGES = dockerfile_stages(ROOT / "ops" / "Dockerfile")


def chain_of(target: str) -> list[Stage]:
    """The stage and every stage it is built on, base first."""
    chain = []
    name = target
    while name in STAGES:
        chain.insert(0, STAGES[name])
        name = STAGES[name].parent
    return chain


def image_env(target: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in chain_of(target):
        env.update(stage.env)
    return env


def compose_env(service: dict) -> dict[str, str]:
    """The service's environment with ``${VAR:-default}`` resolved as compose does, secrets filled in."""
    def resolve(value: str) -> str:
        value = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: "secret", str(value))
        return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)
    return {k: resolve(v) for k, v in service.get("environment", {}).items()}


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_worker_services_run_what_they_claim(name):
    service, device = SERVICES[name], WORKERS[name]
    build = service["build"]
    assert build["dockerfile"] == "ops/Dockerfile" and build["target"] in STAGES
    runs = " ".join(run for stage in chain_of(build["target"]) for run in stage.runs)
    if device == "gpu":
        # A CUDA build of torch, and a build that fails if it is not one.
        assert "whl/cpu" not in runs and "torch.version.cuda" in runs
    else:
        assert "download.pytorch.org/whl/cpu" in runs

    command = service["command"]
    assert command[:3] == ["python", "-m", "worker"]
    # What `python -m worker` accepts: the `rerankq worker` command's own parser.
    args = worker_command.make_context("worker", list(command[3:])).params
    assert args["device"] == device

    env = compose_env(service)
    settings = load_settings(env)
    assert settings.metrics.port is not None
    assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "worker.metrics.probe", "/readyz"]

    # The model cache volume is where the image's user downloads models.
    final = chain_of(build["target"])[-1]
    assert final.user == "rerankq"
    hf_home = image_env(build["target"])["HF_HOME"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert mounts.get(hf_home) == "hf-cache", (hf_home, mounts)
    assert any(hf_home in run and "chown" in run and "rerankq" in run for s in chain_of(build["target"])
               for run in s.runs)
    assert not any(target.startswith("/root") for target in mounts)


def test_the_default_image_is_the_cpu_worker():
    last = list(STAGES)[-1]
    assert last == "worker-cpu" and STAGES[last].user == "rerankq"


def exporter_options(args: list[str]) -> dict:
    """What ``python -m producer.exporter`` makes of these arguments: the command's own parser."""
    return exporter_command.make_context("exporter", list(args)).params


def test_exporter_service():
    service = SERVICES["exporter"]
    assert service["build"]["target"] in STAGES
    assert not any("torch" in run for stage in chain_of(service["build"]["target"]) for run in stage.runs)
    command = service["command"]
    assert command[:3] == ["python", "-m", "producer.exporter"]
    port = exporter_options(command[3:])["port"] or load_settings(compose_env(service)).exporter.port
    health = service["healthcheck"]["test"]
    assert health[:4] == ["CMD", "python", "-m", "producer.exporter"]
    checked = exporter_options(health[4:])
    assert checked["healthcheck"] and (checked["port"] or load_settings(compose_env(service)).exporter.port) == port
    assert load_settings(compose_env(service)).store.redis_url


def test_prometheus_scrapes_the_services_on_their_ports():
    service = SERVICES["prometheus"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert mounts["/etc/prometheus"] == "./ops/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in service["command"]
    config = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    exporter_port = exporter_options(SERVICES["exporter"]["command"][3:])["port"]
    assert jobs["rerankq-exporter"]["static_configs"][0]["targets"] == [f"exporter:{exporter_port}"]
    dns = jobs["rerankq-worker"]["dns_sd_configs"][0]
    assert set(dns["names"]) == set(WORKERS)
    for name in WORKERS:
        assert load_settings(compose_env(SERVICES[name])).metrics.port == dns["port"]


def test_flower_reads_the_same_broker():
    flower = SERVICES["flower"]
    assert flower["profiles"] == ["flower"]
    assert flower["environment"]["CELERY_BROKER_URL"] == SERVICES["worker-cpu"]["environment"]["RERANKQ_REDIS_URL"]
    assert "RERANKQ_TASK_EVENTS" in SERVICES["worker-cpu"]["environment"]


def test_the_amqp_profile_runs_rabbitmq_and_points_the_workers_and_the_exporter_at_it():
    rabbitmq = SERVICES["rabbitmq"]
    assert rabbitmq["profiles"] == ["amqp"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in rabbitmq["volumes"]}
    conf = dict(line.split(" = ", 1) for line in (ROOT / "ops" / "rabbitmq.conf").read_text().splitlines()
                if line and not line.startswith("#"))
    assert mounts["/etc/rabbitmq/conf.d/20-rerankq.conf"] == "./ops/rabbitmq.conf"
    user = rabbitmq["environment"]["RABBITMQ_DEFAULT_USER"]
    url = f"amqp://{user}:pw@rabbitmq:5672//"  # what the compose file's header says to set
    for name in [*WORKERS, "exporter"]:
        env = compose_env(SERVICES[name])
        assert load_settings(env).store.broker_kind == "redis"  # unset: Redis is the broker
        settings = load_settings({**env, "RERANKQ_BROKER_URL": url})
        assert settings.store.broker_kind == "amqp" and settings.store.redis_url
        # The server's timeout, the one rerankq asks for, and both above the window time limit.
        assert int(conf["consumer_timeout"]) == settings.queues.amqp_consumer_timeout_s * 1000
        assert settings.queues.amqp_consumer_timeout_s > settings.queues.redeliver_after_s


@pytest.mark.parametrize("profile,service", [("cluster", "worker-cpu-cluster"), ("sentinel", "worker-cpu-sentinel")])
def test_deployment_profiles_run_workers_on_their_shape(profile, service):
    worker = SERVICES[service]
    assert worker["profiles"] == [profile]
    assert worker["command"] == SERVICES["worker-cpu"]["command"]
    settings = load_settings(compose_env(worker))
    assert settings.store.redis_url.startswith(f"redis+{profile}://")
    if profile == "cluster":
        # Celery has no Redis Cluster transport: the broker stays the plain redis service.
        assert settings.store.broker_url.startswith("redis://") and "@redis:6379" in settings.store.broker_url
        nodes = [name for name, s in SERVICES.items() if name.startswith("redis-cluster-") and name[-1].isdigit()]
        assert len(nodes) == 6 and all(SERVICES[n]["profiles"] == ["cluster"] for n in nodes)
        assert all(f"{n}:6379" in settings.store.redis_url for n in ("redis-cluster-1", "redis-cluster-2", "redis-cluster-3"))
        init = " ".join(SERVICES["redis-cluster-init"]["command"])
        assert "--cluster create" in init and "--cluster-replicas 1" in init
    else:
        assert settings.store.broker_url == settings.store.redis_url and settings.store.redis_url.endswith("/rerankq/0")
        sentinels = [n for n in SERVICES if n.startswith("redis-sentinel-")]
        assert len(sentinels) == 3
        conf = " ".join(SERVICES["redis-sentinel-1"]["command"])
        assert "sentinel monitor rerankq redis 6379 2" in conf
        assert all(f"{n}:26379" in settings.store.redis_url for n in sentinels)
        # Both servers that can be master refuse writes without a replica in sync (the first one
        # when the profile's documented REDIS_MIN_REPLICAS_TO_WRITE=1 is set).
        replica = " ".join(SERVICES["redis-replica"]["command"])
        assert "--min-replicas-to-write 1 --min-replicas-max-lag 5" in replica
        master = " ".join(SERVICES["redis"]["command"])
        assert "--min-replicas-to-write ${REDIS_MIN_REPLICAS_TO_WRITE:-0} --min-replicas-max-lag 5" in master
