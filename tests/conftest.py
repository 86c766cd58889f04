"""Shared fixtures: a private redis-server, a tiny real model, real Celery workers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rerank_servers import RerankServer

from devservers.rabbitmq_server import EmbeddedRabbitMQ, rabbitmq_server_binary
from devservers.tiny_model import build_tiny_cross_encoder
from kernel.settings import Settings
from producer import RerankClient, load_settings
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[EmbeddedRabbitMQ]:
    """A private RabbitMQ node (own name, ports, data), shared by the session's amqp tests."""
    if rabbitmq_server_binary() is None:
        pytest.skip("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server; .ci/run does)")
    server = EmbeddedRabbitMQ().start()
    yield server
    server.remove()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """Which broker a test's workers and clients use: ``redis`` unless parametrised
    (``@pytest.mark.parametrize("broker", BROKERS, indirect=True)``) with ``amqp``."""
    return getattr(request, "param", "redis")


#: Parametrise a test over both brokers (``indirect=True``): Redis, and RabbitMQ with Redis as the store.
BROKERS = ["redis", "amqp"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:10]


def queue_env_for(redis_url: str, namespace: str, model_dir: Path) -> dict[str, str]:
    """What a test's workers and clients are configured with: its Redis, its namespace and
    queues, the tiny model."""
    return {
        "RERANKQ_REDIS_URL": redis_url,
        "RERANKQ_NAMESPACE": namespace,
        "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
        "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
        "RERANKQ_ANY_QUEUE": f"{namespace}.any",
        "RERANKQ_RERANKER_PROVIDER": "local",
        "RERANKQ_RERANKER_MODEL": str(model_dir),
        "RERANKQ_TORCH_THREADS": "1",
        # auto picks bf16 on CPUs with native bf16, whose coarser scores tie and reorder with
        # batch shape; the queue's tests compare orders, so they pin fp32 (test_engine covers auto).
        "RERANKQ_PRECISION": "fp32",
        # auto runs OpenVINO where it is installed; the queue's tests are about the queue, so
        # they run torch (test_backends covers the exported backends, auto included).
        "RERANKQ_RERANKER_BACKEND": "torch",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def base_env(
    redis_server: EmbeddedRedis, namespace: str, tiny_model_dir: Path, broker: str, request: pytest.FixtureRequest
) -> dict[str, str]:
    """Environment for one test's workers and clients: own namespace, own queues, the test's broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(queue_env_for(redis_server.url, namespace, tiny_model_dir))
    if broker == "amqp":
        env["RERANKQ_BROKER_URL"] = request.getfixturevalue("rabbitmq_server").url
    return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every case on RabbitMQ, and every case on the oldest Redis supported (6.2), is a
    deployment shape, whichever file parametrises it."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        if callspec.params.get("broker") == "amqp" or callspec.params.get("redis_server") == "bundled-6.2":
            item.add_marker(pytest.mark.deployment)


#: Modules whose tests share a costly module-scoped fixture (a worker and gateway, the Redis
#: Cluster, the Sentinel set, the calibration run). Under pytest-xdist (`make test`) each runs
#: whole in one process, so that fixture starts once rather than once in every process. The
#: controller schedules from test ids alone, before any module is imported, so the list is here
#: rather than a mark in each module (xdist's own `xdist_group` mark is lost on pytest 9.2).
ONE_PROCESS_MODULES = frozenset(
    {
        "test_blank_documents.py",
        "test_calibration.py",
        "test_cluster.py",
        "test_flow.py",
        "test_front_door.py",
        "test_gateway.py",
        "test_gateway_doors.py",
        "test_sentinel.py",
        "test_worker_doors.py",
    }
)

#: Modules whose tests score on the shared tiny-model worker (`shared_client`). Under
#: pytest-xdist they go together to one process, so that worker starts once in the whole run
#: (a start with the model costs ~6 CPU-seconds, most of it importing sentence-transformers).
SHARED_WORKER_MODULES = frozenset(
    {
        "test_cache.py",
        "test_integration_haystack.py",
        "test_integration_langchain.py",
        "test_integration_llamaindex.py",
        "test_integration_pyterrier.py",
        "test_scoring_e2e.py",
    }
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``: the modules in ONE_PROCESS_MODULES go whole to one process,
    every other test to whichever process is free."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)  # an xdist_group mark, where it survives
            module = nodeid.split("::", 1)[0]
            if scope == nodeid and Path(module).name in SHARED_WORKER_MODULES:
                return "shared-worker"
            if scope == nodeid and Path(module).name in ONE_PROCESS_MODULES:
                return module
            return scope

    return SharedFixtureScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture
def start_worker(
    base_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real workers for this test; extra env and CLI args per call; all stopped after."""
    started: list[WorkerProcess] = []

    def start(
        env: dict[str, str] | None = None, args: list[str] | None = None, drop: tuple[str, ...] = ()
    ) -> WorkerProcess:
        full = {**base_env, **(env or {})}
        for key in drop:
            full.pop(key, None)
        worker = WorkerProcess.rerankq(
            full, tmp_path / f"worker-{len(started)}.log", *(args or ["--device", "cpu"]), cwd=ROOT
        )
        started.append(worker)
        return worker.start()

    yield start
    # Killed, not shut down warm: each test has its own namespace and queues, so nothing a
    # worker leaves behind reaches another test, and a warm shutdown costs 2-5 s a worker
    # (Celery's pool threads poll). A test about shutdown stops its worker itself.
    for worker in started:
        worker.kill()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for worker in started:
            print(f"--- {worker.log_path.name} ---\n{worker.log()[-6000:]}")


@pytest.fixture(scope="session")
def shared_worker(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One worker with the tiny model on the tests' defaults, started at the first test that
    asks for it (through `shared_client`) and shared by the process's tests that need no other
    worker. On a Redis of its own: it lives to the session's end, and Celery's remote control
    (Flower's worker list, a test's broadcast) reaches every worker on a broker."""
    server = EmbeddedRedis().start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(queue_env_for(server.url, "s" + uuid.uuid4().hex[:10], tiny_model_dir))
    log_path = tmp_path_factory.mktemp("shared-worker") / "worker.log"
    worker = WorkerProcess.rerankq(env, log_path, "--device", "cpu", cwd=ROOT)
    try:
        yield worker.start()
    finally:
        worker.kill()
        server.stop()


@pytest.fixture
def shared_client(shared_worker: WorkerProcess, request: pytest.FixtureRequest) -> Iterator[RerankClient]:
    """A client of the shared worker's deployment. The tests sharing it each ask their own query
    (`own_query`: the pair cache and the stream ids key on it, so no test reads another's
    scores) and count provider calls from where they started."""
    client = RerankClient(load_settings(shared_worker.env))
    yield client
    client.close()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print(f"--- shared worker ---\n{shared_worker.log()[-6000:]}")


@pytest.fixture
def own_query(request: pytest.FixtureRequest) -> str:
    """A query of this test's own, for a test on the shared worker."""
    return f"payment gateway 502 recovery ({request.node.name})"


@pytest.fixture
def make_client(base_env: dict[str, str]) -> Iterator[Callable[..., RerankClient]]:
    clients: list[RerankClient] = []

    def make(env: dict[str, str] | None = None, **overrides: Any) -> RerankClient:
        """A client of the test's deployment; ``env`` as the worker's (chain profiles are checked at open)."""
        client = RerankClient(load_settings({**base_env, **(env or {})}, **overrides))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def settings(base_env: dict[str, str]) -> Settings:
    return load_settings(base_env)


@pytest.fixture
def raw_redis(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def namespace_keys(client: redis.Redis, namespace: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{namespace}:*", count=1000))


def pipeline_keys(client: redis.Redis, namespace: str) -> list[bytes]:
    """The namespace's keys but a worker's own records: its card (what rerankq inspect reads),
    the queues it consumes (the no-worker warning) and the sweep's lock. A worker writes those
    from its own thread after Celery says it is ready, so a test comparing keys around a
    pipeline call reads these instead (a snapshot of all of them races the worker's start)."""
    own = (f"{namespace}:worker:", f"{namespace}:consumers:", f"{namespace}:sweep-lock")
    return [k for k in namespace_keys(client, namespace) if not k.decode().startswith(own)]


def make_candidates(
    n: int, *, prefix: str = "c", text: str = "payment gateway error number {i}"
) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "text": text.format(i=i)} for i in range(n)]


@pytest.fixture
def server() -> Iterator[Callable[[str], RerankServer]]:
    """Start loopback rerank servers of a given shape (tests/rerank_servers.py); all stopped after."""
    started: list[RerankServer] = []

    def start(shape: str) -> RerankServer:
        started.append(RerankServer(shape).start())
        return started[-1]

    yield start
    for s in started:
        s.stop()
