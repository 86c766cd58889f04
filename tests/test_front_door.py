"""Errors and warnings a person meets first: the URL tried (password masked) on every store
error, no claim about a stream that was not read, one line instead of a traceback from any
command, command-line words in command-line messages, a warning when no live worker consumes a
stream's device queue (from open, the gateway and rerankq status), and submit's progress at 80
columns."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid

import httpx
import pytest
from cli_helpers import rerankq
from conftest import ROOT
from delivery_helpers import patient
from gateway_helpers import GatewayProcess
from test_gateway import queue_env

from kernel import consumers
from kernel.errors import StoreUnavailable, mask_url
from producer import RerankClient, load_settings
from worker.embedded.redis_server import free_port
from worker.embedded.worker_process import WorkerProcess

FAST = "tests.delivery_providers:FastProvider"
PASSWORD = "hunter2-secret"


def dead_url() -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"


def candidates(n: int) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "text": f"payment gateway note {i}"} for i in range(n)]


def test_mask_url_hides_passwords_in_every_url_shape():
    assert mask_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert (
        mask_url("rediss://user:pw@h:6380/1?ssl_ca_certs=/ca.pem") == "rediss://user:***@h:6380/1?ssl_ca_certs=/ca.pem"
    )
    assert (
        mask_url("redis+sentinel://:pw@h1:26379,h2:26379/svc?sentinel_password=pw2")
        == "redis+sentinel://:***@h1:26379,h2:26379/svc?sentinel_password=***"
    )
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"
    assert "pw" not in mask_url("amqp://guest:pw@rabbit:5672//")
    # Every host's credentials of a multi-host URL, not only the first one's.
    assert (
        mask_url("redis+sentinel://:pw1@h1:26379,user:pw2@h2:26379/svc")
        == "redis+sentinel://:***@h1:26379,user:***@h2:26379/svc"
    )
    # Any secret-looking query parameter, its name read decoded; the rest kept as written.
    assert (
        mask_url("https://h/v1?x_api_key=k1&X-Api-Key=k2&key[]=k3&api%5Fkey=k4&region=eu#top")
        == "https://h/v1?x_api_key=***&X-Api-Key=***&key[]=***&api%5Fkey=***&region=eu#top"
    )
    assert mask_url("https://ghp_token@github.com/o/r") == "https://***@github.com/o/r"  # a bare user may be a key


@pytest.mark.slow
def test_every_store_error_names_the_url_tried_with_the_password_masked():
    url = dead_url()
    with RerankClient(load_settings({"RERANKQ_REDIS_URL": url})) as client:
        calls = {
            "open": lambda: client.open("q", candidates(3)),
            "pull": lambda: client.pull("s_" + "0" * 32, 0, 10, timeout=0),
            "status": lambda: client.status("k_doesnotexist"),
            "progress": lambda: client.progress(["k_doesnotexist"]),
        }
        for name, call in calls.items():
            with pytest.raises(StoreUnavailable) as err:
                call()
            said = str(err.value)
            assert mask_url(url) in said and PASSWORD not in said, (name, said)
            assert err.value.url == mask_url(url)
    # A read reached no stream: it must not say the stream exists.
    for name in ("pull", "status", "progress"):
        with RerankClient(load_settings({"RERANKQ_REDIS_URL": url})) as client, pytest.raises(StoreUnavailable) as err:
            calls_again = {
                "pull": lambda: client.pull("s_" + "0" * 32, 0, 10, timeout=0),
                "status": lambda: client.status("k_doesnotexist"),
                "progress": lambda: client.progress(["k_doesnotexist"]),
            }
            calls_again[name]()
        assert "the stream exists" not in str(err.value) and err.value.stream_written is None


@pytest.mark.parametrize(
    "args",
    [["status", "k_doesnotexist"], ["inspect", "--timeout", "0.5"], ["pull", "k_doesnotexist", "--timeout", "0"]],
    ids=lambda a: a[0],
)
def test_a_command_against_a_wrong_url_prints_one_line_naming_it(args, base_env):
    url = dead_url()
    done = rerankq(args, {**base_env, "RERANKQ_REDIS_URL": url}, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert mask_url(url) in done.stderr and PASSWORD not in done.stderr
    assert "RERANKQ_REDIS_URL" in done.stderr and "the stream exists" not in done.stderr


def test_submit_words_the_too_shallow_refusal_for_the_command_line_and_a_skip_run_says_it_finished(base_env, tmp_path):
    source = tmp_path / "jobs.jsonl"
    source.write_text(json.dumps({"id": "j1", "query": "payment", "candidates": candidates(3)}) + "\n")
    done = rerankq(
        ["submit", str(source), "--out", str(tmp_path / "out.jsonl"), "--keep", "10", "--on-error", "skip"], base_env
    )
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert "--allow-shallow" in said and "allow_shallow=True" not in said
    assert not done.stdout.startswith("stopped") and done.stdout.startswith("finished"), done.stdout


def test_submit_progress_at_80_columns_keeps_the_bar_n_of_m_and_the_eta():
    from rich.console import Console

    from rerankq.submit.progress import RichDisplay, Tally

    out = io.StringIO()
    tally = Tally(
        total=1000,
        done=237,
        in_flight=48,
        windows_total=1500,
        windows_committed=700,
        pairs=17_000,
        failovers=700,
        started=time.monotonic() - 60,
    )
    display = RichDisplay(out, console=Console(file=out, width=80, force_terminal=False, color_system=None))
    display.task = display.progress.add_task("submit", total=None, detail="", eta="-")
    display.update(tally)
    display.progress.console.print(display.progress.get_renderable())
    line = out.getvalue().rstrip("\n")
    assert "\n" not in line and len(line) <= 80, line
    assert "━" in line  # the bar
    assert "237/1000 jobs" in line
    assert "eta 0:03:" in line  # 763 jobs left at 237 a minute
    assert line.index("eta") < line.index("in flight")  # the detail comes after, and is what gets cut


@pytest.fixture(scope="module")
def one_cpu_worker(redis_server, tmp_path_factory):
    """A CPU worker and a gateway (no keys) in their own namespace; no GPU worker at all."""
    tmp = tmp_path_factory.mktemp("front-door")
    env = queue_env(
        redis_server.url, "f" + uuid.uuid4().hex[:10], RERANKQ_RERANKER_PROVIDER=FAST, RERANKQ_RERANKER_MODEL=""
    )
    worker = WorkerProcess.rerankq(env, tmp / "worker.log", "--device", "cpu", cwd=ROOT).start()
    gateway = GatewayProcess(env, tmp / "gateway.log", "--insecure-no-auth").start()
    client = RerankClient(load_settings(env))
    # The worker announces its queues a moment after it is ready.
    deadline = time.monotonic() + patient(30)
    while not consumers.live(client.store.client, client.store.keys, env["RERANKQ_CPU_QUEUE"]):
        assert time.monotonic() < deadline, "the worker never recorded the queues it consumes"
        time.sleep(0.2)
    try:
        yield env, client, gateway
    finally:
        client.close()
        gateway.stop()
        worker.stop()


def test_open_warns_when_no_live_worker_consumes_the_device_queue(one_cpu_worker, caplog):
    env, client, _ = one_cpu_worker
    with caplog.at_level(logging.WARNING, logger="rerankq.producer"):
        client.open("payment", candidates(3), device="cpu")
    assert not [r for r in caplog.records if "no_live_worker" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="rerankq.producer"):
        client.open("payment", candidates(3), device="gpu")
    warned = [r.getMessage() for r in caplog.records if "no_live_worker" in r.getMessage()]
    assert warned and env["RERANKQ_GPU_QUEUE"] in warned[0] and "rerankq worker --device gpu" in warned[0]


def test_rerankq_status_warns_about_a_stream_no_worker_serves(one_cpu_worker):
    env, client, _ = one_cpu_worker
    waiting = client.open("payment", candidates(3), device="gpu")
    served = client.open("payment", candidates(3), device="cpu")
    client.pull(served, 0, 3, timeout=30)
    done = rerankq(["status", waiting], env)
    assert done.returncode == 0, done.stderr
    assert "warning: no live worker consumes queue" in done.stderr and env["RERANKQ_GPU_QUEUE"] in done.stderr
    as_json = json.loads(rerankq(["status", waiting, "--json"], env).stdout)
    assert "no live worker" in as_json["warning"]
    quiet = rerankq(["status", served], env)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr


def test_the_gateway_says_no_worker_serves_the_device_instead_of_repeat_the_request(one_cpu_worker):
    _, _, gateway = one_cpu_worker
    body = {"model": "m", "query": "payment " + uuid.uuid4().hex, "documents": ["a note", "another note"]}
    answer = httpx.post(gateway.url + "/gpu/v2/rerank", json=body, headers={"X-Rerankq-Timeout": "1"}, timeout=30)
    # Answered at once as "not now" (a Cohere client backs off on 429 and Retry-After).
    assert answer.status_code == 429 and answer.headers["retry-after"]
    message = answer.json()["message"]
    assert "no live worker consumes queue" in message and "repeat the request" not in message
    served = httpx.post(gateway.url + "/cpu/v2/rerank", json=body, timeout=30)
    assert served.status_code == 200, served.text
