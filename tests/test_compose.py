"""docker-compose.yml and ops/Dockerfile, read (no Docker engine runs here) and checked against
what the worker, the exporter, the gateway and Prometheus expect: each service's build target,
command, health check, volumes and environment. ops/compose_check.sh runs them for real; what
that run found wrong is pinned here (COPY sources, health check programs, ports, users)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from kernel.settings import load_settings
from producer.exporter.main import exporter as exporter_command
from worker.command import worker as worker_command

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
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults
    copies: list[str] = field(default_factory=list)  # COPY sources from the build context


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
        elif instruction == "ARG":
            name, _, default = rest.partition("=")
            current.args[name.strip()] = default.strip().strip('"')
        elif instruction == "COPY" and "--from" not in rest:
            current.copies.extend(shlex.split(rest)[:-1])
    return stages


STAGES = dockerfile_stages(ROOT / "ops" / "Dockerfile")
STANDINS = dockerfile_stages(ROOT / "ops" / "standins" / "Dockerfile")
BUILT_SERVICES = {name: s for name, s in SERVICES.items() if "build" in s}
WORKER_SERVICES = {name: s for name, s in SERVICES.items() if s.get("command", [])[:3] == ["python", "-m", "worker"]}


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
    chain = chain_of(build["target"])
    runs = " ".join(run for stage in chain for run in stage.runs)
    args = {k: v for stage in chain for k, v in stage.args.items()}
    assert "torch.version.cuda" in runs  # the build fails on the wrong torch either way
    if device == "gpu":
        # A CUDA build of torch: its index a build argument, by default PyPI's CUDA wheels.
        assert '--index-url "${TORCH_CUDA_INDEX}"' in runs and "whl/cpu" not in args["TORCH_CUDA_INDEX"]
    else:
        # The CPU build, from an index a build argument names; by default PyTorch's CPU index.
        assert '--index-url "${TORCH_CPU_INDEX}"' in runs
        assert args["TORCH_CPU_INDEX"] == "https://download.pytorch.org/whl/cpu"
        # ... and nothing else brings CUDA in: PyPI's nvidia-* wheels fail the build.
        assert "grep -i '^nvidia-'" in runs

    command = service["command"]
    assert command[:3] == ["python", "-m", "worker"]
    # What `python -m worker` accepts: the `rerankq worker` command's own parser.
    args = worker_command.make_context("worker", list(command[3:])).params
    assert args["device"] == device

    env = compose_env(service)
    settings = load_settings(env)
    assert settings.metrics.port is not None
    # Prometheus scrapes over the compose network: the metrics server listens beyond loopback.
    assert settings.metrics.host == "0.0.0.0"
    assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "worker.metrics.probe", "/readyz"]

    # The model cache volume is the image user's ~/.cache: Hugging Face downloads (HF_HOME)
    # and the exports (worker.engine.export: ~/.cache/rerankq/exports) both land in it, in a
    # directory the image creates and gives that user, so the empty volume starts out theirs.
    final = chain_of(build["target"])[-1]
    assert final.user == "rerankq"
    hf_home = image_env(build["target"])["HF_HOME"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    assert mounts.get("/home/rerankq/.cache") == "model-cache", mounts
    assert hf_home.startswith("/home/rerankq/.cache/")
    assert any(
        "useradd --create-home" in run and "chown -R rerankq:rerankq /home/rerankq/.cache" in run and hf_home in run
        for s in chain
        for run in s.runs
    )
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
    assert chain_of(service["build"]["target"])[-1].user == "rerankq"
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
    # Every worker service of every profile, or that profile's workers go unwatched.
    assert set(dns["names"]) == set(WORKER_SERVICES)
    for name in WORKER_SERVICES:
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
    conf = dict(
        line.split(" = ", 1)
        for line in (ROOT / "ops" / "rabbitmq.conf").read_text().splitlines()
        if line and not line.startswith("#")
    )
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
        assert all(
            f"{n}:6379" in settings.store.redis_url for n in ("redis-cluster-1", "redis-cluster-2", "redis-cluster-3")
        )
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


def test_the_gateway_service_serves_beyond_loopback_with_its_keys_file_mounted():
    from producer.gateway.config import load_gateway_settings
    from producer.gateway.main import serve

    for name in ("gateway", "gateway-cluster", "gateway-sentinel"):
        service = SERVICES[name]
        target = service["build"]["target"]
        assert target == "gateway" and chain_of(target)[-1].user == "rerankq"
        assert not any("torch" in run or "[worker]" in run for stage in chain_of(target) for run in stage.runs)
        assert any("[gateway]" in run for run in STAGES[target].runs)
        command = service["command"]
        assert command[:3] == ["python", "-m", "producer.gateway"]
        # What `python -m producer.gateway` accepts: the `rerankq serve` command's own parser.
        args = serve.make_context("serve", list(command[3:])).params
        env = compose_env(service)
        config = load_gateway_settings(env, host=args["host"], port=args["port"])
        assert config.host == "0.0.0.0"
        volumes = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", v) for v in service["volumes"]]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in volumes}
        assert mounts.get(config.keys_file) == "./gateway-keys.json" and volumes[0].endswith(":ro"), volumes
        published = service["ports"][0].rsplit(":", 1)[1]
        assert int(published) == config.port
        assert f"127.0.0.1:{config.port}/ready" in " ".join(service["healthcheck"]["test"])
        assert load_settings(env).store.redis_url


@pytest.mark.parametrize("profile", ["cluster", "sentinel"])
def test_each_profile_gateway_opens_streams_where_its_workers_read(profile):
    gateway = load_settings(compose_env(SERVICES[f"gateway-{profile}"]))
    worker = load_settings(compose_env(SERVICES[f"worker-cpu-{profile}"]))
    assert (gateway.store.redis_url, gateway.store.broker) == (worker.store.redis_url, worker.store.broker)
    assert SERVICES[f"gateway-{profile}"]["profiles"] == [profile]


def test_services_built_from_one_target_share_one_image():
    images: dict[str, set[str]] = {}
    for service in BUILT_SERVICES.values():
        images.setdefault(service["build"]["target"], set()).add(service["image"])
    assert all(len(names) == 1 for names in images.values()), images
    assert {target: next(iter(names)).split(":")[0] for target, names in images.items()} == {
        target: f"rerankq-{target}" for target in images
    }


def test_published_ports_are_loopback_and_movable():
    """The check runs beside a Redis on 6379: every published port can be moved by a variable."""
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:${RERANKQ_") and "_HOST_PORT:-" in port, (name, port)


def test_rabbitmq_keeps_its_node_name_across_re_creates():
    assert SERVICES["rabbitmq"]["hostname"] == "rabbitmq"


def dockerignored() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_every_copy_source_is_in_the_build_context():
    """Whatever pyproject.toml names (readme, license-files) is copied: setuptools warns today, and
    will refuse later, a build whose license-files match nothing."""
    ignored = dockerignored()
    copied = {source for stage in STAGES.values() for source in stage.copies}
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not any(source == pattern or source.startswith(pattern.rstrip("/") + "/") for pattern in ignored), source
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {pyproject["readme"], *pyproject.get("license-files", [])}
    for target in {s["build"]["target"] for s in BUILT_SERVICES.values()}:
        assert needed <= {c for stage in chain_of(target) for c in stage.copies}, target


# The program each health check runs, and what puts it in the image: the Dockerfile stage's
# base (python) or the package its stand-in installs from Debian, as the hub image ships it.
HEALTH_PROGRAMS = {"redis-cli": "redis-tools", "rabbitmq-diagnostics": "rabbitmq-server", "wget": "wget"}


def health_program(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return shlex.split(test[1])[0] if test[0] == "CMD-SHELL" else test[1]


@pytest.mark.parametrize("name", sorted(n for n, s in SERVICES.items() if "healthcheck" in s))
def test_every_health_check_runs_a_program_its_image_has(name):
    service = SERVICES[name]
    program, test = health_program(service), service["healthcheck"]["test"]
    if "build" in service:
        # Built images: python from the base image, running a module this repository installs.
        assert program == "python"
        if test[2] == "-m":
            module = ROOT / Path(*test[3].split("."))
            assert module.with_suffix(".py").exists() or (module / "__main__.py").exists(), test[3]
            assert test[3].split(".")[0] in {c for stage in chain_of(service["build"]["target"]) for c in stage.copies}
        else:
            assert test[2] == "-c" and "import urllib.request" in test[3]
        return
    repository = service["image"].rsplit(":", 1)[0]
    target = {"redis": "redis", "rabbitmq": "rabbitmq", "prom/prometheus": "prometheus"}[repository]
    installs = " ".join(STANDINS[target].runs)
    assert re.search(rf"apt-get install .*\b{re.escape(HEALTH_PROGRAMS[program])}\b", installs), (program, target)


def test_every_hub_image_has_a_stand_in_run_as_compose_runs_it():
    stand_ins = {"redis": "redis", "rabbitmq": "rabbitmq", "prom/prometheus": "prometheus", "mher/flower": "flower"}
    for name, service in SERVICES.items():
        if "build" in service:
            continue
        stage = STANDINS[stand_ins[service["image"].rsplit(":", 1)[0]]]
        assert stage.user not in (None, "root"), name
    # The rabbitmq service's command execs the hub image's entrypoint script.
    assert "docker-entrypoint.sh" in " ".join(SERVICES["rabbitmq"]["command"])
    assert "docker-entrypoint.sh" in " ".join(STANDINS["rabbitmq"].runs)
