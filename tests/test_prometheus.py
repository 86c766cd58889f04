"""ops/prometheus and ops/autoscaling against the real Prometheus: promtool validates the
config and the alert rules and runs the rules' unit tests, and a real Prometheus server,
configured from ops/prometheus/prometheus.yml, scrapes a real worker and the exporter and
answers the autoscalers' queries through its HTTP API.

Needs Debian's ``prometheus`` package (``promtool`` and ``prometheus`` on PATH; .ci/run
installs it). Without it these tests are skipped with that reason, never passed silently.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, make_candidates
from delivery_helpers import provider_env, pull_until_complete, wait_for
from metrics_helpers import get, status_of

from worker.embedded.redis_server import free_port

pytestmark = pytest.mark.deployment

PROMETHEUS_DIR = ROOT / "ops" / "prometheus"
KEDA = ROOT / "ops" / "autoscaling" / "keda-workers.yaml"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (apt-get install prometheus)")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not on PATH (apt-get install prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_accepts_the_config_and_the_rules():
    config = promtool("check", "config", "ops/prometheus/prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    rules = promtool("check", "rules", "ops/prometheus/alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 7 rules found" in rules.stdout


@needs_promtool
def test_alert_rules_fire_as_their_unit_tests_say():
    result = promtool("test", "rules", "ops/prometheus/alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def keda_queries() -> dict[str, str]:
    """Each ScaledObject's trigger queries, by the Deployment it scales."""
    queries = {}
    for document in yaml.safe_load_all(KEDA.read_text()):
        target = document["spec"]["scaleTargetRef"]["name"]
        for i, trigger in enumerate(document["spec"]["triggers"]):
            assert trigger["type"] == "prometheus"
            queries[f"{target}#{i}"] = trigger["metadata"]["query"]
    return queries


def test_each_device_scales_on_its_own_queue():
    queries = keda_queries()
    assert set(queries) == {"rerankq-worker-cpu#0", "rerankq-worker-gpu#0", "rerankq-worker-gpu#1"}
    assert 'device=~"cpu|any"' in queries["rerankq-worker-cpu#0"] and "gpu" not in queries["rerankq-worker-cpu#0"]
    assert all('device="gpu"' in q and "cpu" not in q for k, q in queries.items() if "gpu" in k)


def local_config(tmp_path: Path, targets: dict[str, list[str]]) -> Path:
    """ops/prometheus/prometheus.yml with its jobs pointed at this test's processes, scraped every second."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == set(targets), jobs
    for job in config["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs")]:
            del job[key]
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def prometheus(tmp_path) -> Iterator[Callable[[Path], int]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> int:
        assert PROMETHEUS is not None
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")
        started.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        wait_for(lambda: status_of(port, "/-/ready") == 200 or started[-1].poll() is not None, 60, "prometheus")
        assert started[-1].poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        return port

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=30)


def api(port: int, path: str, **params: str) -> dict:
    status, body = get(port, f"{path}?{urllib.parse.urlencode(params)}")
    reply = json.loads(body)
    assert status == 200 and reply["status"] == "success", reply
    return reply["data"]


def query(port: int, expr: str) -> list[tuple[dict[str, str], float]]:
    return [(r["metric"], float(r["value"][1])) for r in api(port, "/api/v1/query", query=expr)["result"]]


@needs_prometheus
def test_prometheus_scrapes_a_worker_and_the_exporter(prometheus, start_worker, make_client, base_env, tmp_path):
    worker_port, exporter_port = free_port(), free_port()
    start_worker(
        env={
            **provider_env("FastProvider"),
            "RERANKQ_METRICS_PORT": str(worker_port),
            "RERANKQ_METRICS_DIR": str(tmp_path / "metrics"),
        }
    )
    exporter = subprocess.Popen(
        [sys.executable, "-m", "producer.exporter", "--host", "127.0.0.1", "--port", str(exporter_port)],
        env=base_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: status_of(exporter_port, "/healthz") == 200, 30, "the exporter")
        client = make_client()
        served = client.open("gateway error", make_candidates(30), window_size=10, first_windows=3)
        pull_until_complete(client, served, 30)
        # A GPU backlog no worker serves: what the GPU autoscaler sees.
        client.open("waiting for a gpu", make_candidates(50, prefix="g"), window_size=10, first_windows=5, device="gpu")

        port = prometheus(
            local_config(
                tmp_path,
                {
                    "rerankq-exporter": [f"127.0.0.1:{exporter_port}"],
                    "rerankq-worker": [f"127.0.0.1:{worker_port}"],
                },
            )
        )

        def scraped() -> bool:
            targets = api(port, "/api/v1/targets")["activeTargets"]
            return (
                len(targets) == 2
                and all(t["health"] == "up" for t in targets)
                and bool(query(port, "rerankq_queue_messages") and query(port, "rerankq_windows_committed_total"))
            )

        wait_for(scraped, 60, "both targets scraped", interval_s=0.5)
        gpu = query(port, 'rerankq_queue_messages{device="gpu"}')
        assert [(m["job"], m["queue"], v) for m, v in gpu] == [
            ("rerankq-exporter", f"{client.settings.queues.gpu_queue}", 5)
        ]
        assert query(port, 'rerankq_windows_uncommitted{device="gpu"}')[0][1] == 5
        committed = query(port, "sum(rerankq_windows_committed_total)")
        assert committed[0][1] == client.store.counters()["windows_committed"] == 3
        assert query(port, 'rerankq_worker_ready{job="rerankq-worker"}')[0][1] == 1

        # The autoscalers' queries, as KEDA would send them.
        values = {name: query(port, expr) for name, expr in keda_queries().items()}
        assert values["rerankq-worker-gpu#0"][0][1] == 5
        assert values["rerankq-worker-cpu#0"][0][1] == 0
        assert values["rerankq-worker-gpu#1"][0][1] > 0  # the oldest GPU window's age

        # Every alert rule loaded and evaluates.
        def rules() -> list[dict]:
            return [r for g in api(port, "/api/v1/rules")["groups"] for r in g["rules"]]

        wait_for(lambda: all(r["health"] != "unknown" for r in rules()), 30, "a rule evaluation")
        assert len(rules()) == 7 and all(r["health"] == "ok" for r in rules()), rules()
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
