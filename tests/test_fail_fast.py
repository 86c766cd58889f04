"""A worker that cannot score takes no window: it exits at start, in one line naming the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from conftest import ROOT, make_candidates

pytestmark = pytest.mark.slow


def shim_without_torch(tmp_path: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes ``import torch`` fail as on an install without it."""
    shim = tmp_path / "no-torch"
    (shim / "torch").mkdir(parents=True)
    (shim / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    return shim


def queued(client: redis.Redis, namespace: str) -> int:
    return sum(int(client.llen(f"{namespace}.{kind}")) for kind in ("cpu", "gpu", "any"))


def run_worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "--device", "cpu", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def cannot_score_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if "worker_cannot_score" in line]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_without_torch_exits_and_leaves_the_window_queued(
    base_env, make_client, raw_redis, namespace, tmp_path, pool
):
    client = make_client()
    client.open("payment gateway error", make_candidates(4), window_size=4)
    waiting = queued(raw_redis, namespace)
    assert waiting >= 1
    env = {**base_env, "PYTHONPATH": f"{shim_without_torch(tmp_path)}:{ROOT}"}
    env.pop("RERANKQ_RERANKER_PROVIDER")
    env.pop("RERANKQ_RERANKER_MODEL")  # the default chain, as on a fresh install

    done = run_worker(env, "--pool", pool)

    assert done.returncode != 0
    [line] = cannot_score_lines(done)
    assert "pip install 'rerankq[worker]'" in line and "0:local" in line
    assert "chain_warmed_up" not in done.stdout + done.stderr
    assert queued(raw_redis, namespace) == waiting


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_whose_model_is_not_there_exits_naming_the_path(
    base_env, make_client, raw_redis, namespace, tmp_path, pool
):
    client = make_client()
    client.open("payment gateway error", make_candidates(4), window_size=4)
    waiting = queued(raw_redis, namespace)
    missing = tmp_path / "models" / "nope"

    done = run_worker({**base_env, "RERANKQ_RERANKER_MODEL": str(missing)}, "--pool", pool)

    assert done.returncode != 0
    [line] = cannot_score_lines(done)
    assert str(missing) in line and "RERANKQ_SERVE_WITHOUT_SCORING" in line
    assert "chain_warmed_up" not in done.stdout + done.stderr
    assert queued(raw_redis, namespace) == waiting


def test_a_chain_of_rrf_alone_serves_fusion_order_on_purpose(start_worker, make_client):
    worker = start_worker(env={"RERANKQ_RERANKER_PROVIDER": "rrf"})
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(3), window_size=3)

    page = client.pull(stream, 0, 3, timeout=60)

    assert [r.served_by for r in page.rows] == ["0:rrf"] * 3
    assert "chain_warmed_up" in worker.log() and "passthrough_on_purpose" in worker.log()


def test_an_offline_first_member_is_said_once_and_counted_apart_from_failovers(
    start_worker, make_client, base_env, tiny_model_dir, tmp_path
):
    # The offline default chain's shape: a cross-encoder that is not there, then a model that is.
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_MODEL": str(tmp_path / "not-downloaded"),
            "RERANKQ_RERANKER_1_PROVIDER": "local",
            "RERANKQ_RERANKER_1_MODEL": str(tiny_model_dir),
            "RERANKQ_RERANKER_2_PROVIDER": "rrf",
            "RERANKQ_MEMBER_RESTART_S": "0.001",  # retried at every window, failing as before each time
        }
    )
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(9), window_size=3, first_windows=3)

    page = client.pull(stream, 0, 9, timeout=60)

    assert {r.served_by for r in page.rows} == {"1:local"}
    log = worker.log()
    # rerankq's own warnings: a library's (transformers on an export) is not the worker speaking.
    warnings = [line for line in log.splitlines() if "[warning" in line and "[rerankq." in line]
    assert [line for line in warnings if "member_start_failed" in line and "0:local" in line][:1] and len(
        warnings
    ) == 1, warnings
    assert "reranker_failover" not in log and "celery.redirected" not in log
    counters = client.store.counters()
    assert counters.get("members_not_started:0:local", 0) >= 3 and counters.get("failovers", 0) == 0
    done = subprocess.run(
        [sys.executable, "-m", "rerankq", "inspect", "--timeout", "2"],
        env=base_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "0 failovers" in done.stdout and "members_not_started:0:local" in done.stdout, done.stdout + done.stderr


# -- every command fails fast, in one line ----------------------------------------------------


def rerankq(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rerankq", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_serve_without_a_redis_says_so_in_one_line(base_env):
    env = {k: v for k, v in base_env.items() if k not in ("RERANKQ_REDIS_URL", "RERANKQ_BROKER_URL")}
    done = rerankq(env, "serve", "--insecure-no-auth", "--port", "0", timeout=60)
    assert done.returncode == 2  # docs/gateway.md: a setting that is wrong
    [line] = (done.stdout + done.stderr).strip().splitlines()
    assert "RERANKQ_REDIS_URL" in line and "is not set" in line


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("starlette", ["serve", "--insecure-no-auth", "--port", "0"], "gateway"),
        ("ir_measures", ["eval", "--limit", "1"], "eval"),
        ("sklearn", ["calibrate", "--out", "never-written.json"], "eval"),
    ],
)
def test_a_command_without_its_extra_names_the_extra(base_env, tmp_path, module, args, extra):
    shim = tmp_path / "without"
    (shim / module).mkdir(parents=True)
    (shim / module / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    done = rerankq({**base_env, "PYTHONPATH": f"{shim}:{ROOT}"}, *args)
    assert done.returncode != 0
    said = [line for line in (done.stdout + done.stderr).splitlines() if module in line]
    assert len(said) == 1 and f"pip install 'rerankq[{extra}]'" in said[0], done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_eval_against_workers_without_its_profiles_exits_2_saying_what_to_change(start_worker, base_env, tmp_path):
    start_worker()  # a worker of the configured Redis, without RERANKQ_CHAIN_EVAL<i>
    out = tmp_path / "report.json"
    done = rerankq(base_env, "eval", "--limit", "1", "--depths", "5", "--json", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "unset RERANKQ_REDIS_URL" in line and "RERANKQ_CHAIN_EVAL0=0" in line
    assert not out.exists()


def test_a_prefork_worker_is_ready_only_once_a_pool_process_scores(start_worker):
    # The pool process loads the chain and says so before the consumer starts: Celery's "ready"
    # (what orchestrators and start_worker wait for) means a window can be scored now.
    log = start_worker().log()
    assert "chain_warmed_up" in log and log.index("chain_warmed_up") < log.index(" ready.")
