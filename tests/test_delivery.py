"""At-least-once delivery, exactly-once commit: a worker process SIGKILLed mid-window."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import BROKERS, make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete, wait_for

from kernel.celery_config import celery_config
from kernel.settings import load_settings

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_child_killed_mid_window_commits_once_and_stream_completes(
    start_worker, make_client, tmp_path, raw_redis, broker
):
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = start_worker(env=provider_env("SlowProvider", mark_dir=marks, sleep_s=2))
    client = make_client(redeliver_after_s=4)
    stream = client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2)

    # The first attempt at some window is in a prefork child: kill that child, not the worker.
    first = wait_for(lambda: sorted(marks.iterdir()), 30, "a window to start scoring")[0]
    child_pid = int(first.name.split(".")[0])
    assert child_pid != worker.proc.pid
    os.kill(child_pid, signal.SIGKILL)

    page = pull_until_complete(client, stream, 20, timeout_s=60)

    assert page.total == 20 and [r.kind for r in page.rows] == ["ranked"] * 20
    assert commits_per_window(raw_redis, client, stream) == {0: 1, 1: 1}
    status = client.status(stream)
    killed_window = int(first.name.split(".")[-1])
    # Requeued at once by reject_on_worker_lost, not after the visibility timeout or the sweep.
    assert status.windows[killed_window].attempts == 2
    assert worker.proc.poll() is None, "the worker itself survives its child's death"
    assert client.store.counters().get("windows_committed") == 2
    assert "WorkerLostError" in worker.log() or "SIGKILL" in worker.log()


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_duplicate_delivery_is_turned_away_without_counting(start_worker, make_client, tmp_path, raw_redis, broker):
    """A second message for a window another delivery is scoring: no attempt counted, one commit."""
    marks = tmp_path / "marks"
    marks.mkdir()
    start_worker(
        env=provider_env("SlowProvider", mark_dir=marks, sleep_s=2), args=["--device", "cpu", "--processes", "2"]
    )
    client = make_client(redeliver_after_s=4)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    wait_for(lambda: list(marks.iterdir()), 30, "the window to start scoring")
    client.dispatcher.send(stream, [0], "cpu")  # what a sweep's re-send looks like

    pull_until_complete(client, stream, 10, timeout_s=30)

    assert len(list(marks.iterdir())) == 1, "the duplicate never reached the provider"
    assert client.status(stream).windows[0].attempts == 1
    assert commits_per_window(raw_redis, client, stream) == {0: 1}


def test_delivery_settings_are_the_documented_ones(base_env):
    conf = celery_config(load_settings(base_env))
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1 and conf["worker_disable_prefetch"]
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"]
    assert conf["broker_connection_retry_on_startup"] and conf["broker_connection_max_retries"] is None
    assert conf["worker_soft_shutdown_timeout"] > 0 and not conf["worker_enable_soft_shutdown_on_idle"]
    # One visibility timeout, above the longest a window may run.
    timeout = conf["broker_transport_options"]["visibility_timeout"]
    assert conf["result_backend_transport_options"]["visibility_timeout"] == timeout
    assert conf["task_time_limit"] < timeout


def test_visibility_timeout_must_exceed_the_window_time_limit(base_env):
    from kernel.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_settings({**base_env, "RERANKQ_REDELIVER_AFTER_S": "600", "RERANKQ_VISIBILITY_TIMEOUT_S": "300"})
    assert err.value.variable == "RERANKQ_VISIBILITY_TIMEOUT_S"


def test_soft_shutdown_hands_a_running_window_back(start_worker, make_client, tmp_path, raw_redis, namespace):
    """SIGTERM (remapped to a soft shutdown) cancels the running window and requeues its message at once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = provider_env("SlowProvider", mark_dir=marks, sleep_s=30, soft_shutdown_s=1)
    env["REMAP_SIGTERM"] = "SIGQUIT"
    first = start_worker(env=env)
    client = make_client(redeliver_after_s=4)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    wait_for(lambda: list(marks.iterdir()), 30, "the window to start scoring")

    first.proc.terminate()
    first.proc.wait(timeout=20)  # bounded: soft_shutdown_s, then cancel; not the 30 s window

    # Back in the queue now, not after the visibility timeout (60 s here) or the sweep.
    wait_for(lambda: raw_redis.llen(f"{namespace}.cpu") == 1, 5, "the message to be requeued")
    start_worker(env=provider_env("FastProvider", mark_dir=marks, sweep_interval_s=3600))
    page = pull_until_complete(client, stream, 10, timeout_s=30)
    assert page.total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}


def test_a_replacement_process_that_loads_slowly_is_not_killed(start_worker, make_client, tmp_path, raw_redis):
    """Celery's default proc_alive_timeout (4 s) would kill a replacement still loading its model, forever."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = provider_env("SlowStartProvider", mark_dir=marks, sleep_s=1)
    env["TEST_PROVIDER_START_S"] = "6"
    worker = start_worker(env=env)
    client = make_client(redeliver_after_s=4)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    first = wait_for(lambda: list(marks.iterdir()), 30, "the window to start scoring")[0]
    os.kill(int(first.name.split(".")[0]), signal.SIGKILL)

    assert pull_until_complete(client, stream, 10, timeout_s=40).total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}
    assert "Timed out waiting for UP message" not in worker.log()
