"""Hostile input and secrets: no pickle, no reaching another stream, passwords and TLS, redaction."""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery
from conftest import make_candidates, namespace_keys, pipeline_keys
from delivery_helpers import provider_env, pull_until_complete, wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from kernel.celery_config import TASK_NAME, broker_tls, celery_config
from kernel.settings import load_settings
from producer import ValidationError
from worker.embedded.redis_server import EmbeddedRedis
from worker.logs import log_formatter, redact_text


class RunsWhenUnpickled:
    """Unpickling this creates a file: proof that a worker executed attacker data."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.path), "w"))


def test_worker_refuses_pickle_and_hostile_stream_ids(
    start_worker, make_client, base_env, tmp_path, raw_redis, namespace
):
    worker = start_worker(env=provider_env("FastProvider"))
    settings = load_settings(base_env)
    sender = Celery("attacker", set_as_current=False)
    sender.conf.update(celery_config(settings))
    proof = tmp_path / "pwned"

    sender.send_task(
        TASK_NAME, args=[RunsWhenUnpickled(proof), 0], queue=settings.queues.cpu_queue, serializer="pickle"
    )
    # A JSON message whose stream id tries to reach outside its own keys.
    for hostile in ("s_x}:results", "k_*", "k_a}{b", "../" * 3):
        sender.send_task(TASK_NAME, args=[hostile, 0], queue=settings.queues.cpu_queue)
    wait_for(lambda: "reason=content" in worker.log(), 20, "the worker to refuse the pickle")
    wait_for(lambda: worker.log().count("reason=arguments") >= 4, 20, "the hostile ids to be refused")

    assert not proof.exists(), "the pickle payload was executed"
    assert pipeline_keys(raw_redis, namespace) == []  # no hostile id reached a key
    # The worker is still serving honest work.
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    assert pull_until_complete(client, stream, 10, timeout_s=20).total == 10
    sender.close()


def test_window_numbers_a_stream_does_not_have_are_refused_before_redis(start_worker, make_client, base_env, raw_redis):
    """score_window(legit, -1) once scored candidates, wrote results[-1] and bumped the counts."""
    worker = start_worker(env=provider_env("FastProvider"))
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(30), window_size=10)
    assert len(client.pull(stream, 0, 10, timeout=20).rows) == 10
    before = client.store.counters()
    sender = Celery("attacker", set_as_current=False)
    sender.conf.update(celery_config(load_settings(base_env)))

    hostile = [-1, -1000000, True, "0", 1.0, None, 10**12, [0]]
    for window in hostile:
        sender.send_task(TASK_NAME, args=[stream, window], queue=client.settings.queues.cpu_queue)
    sender.send_task(TASK_NAME, args=[stream, 2], queue=client.settings.queues.cpu_queue)  # real, never admitted
    wait_for(lambda: worker.log().count("reason=arguments") >= len(hostile), 20, "the hostile windows to be refused")
    wait_for(lambda: "window_not_admitted" in worker.log(), 20, "the unadmitted window to be turned away")

    assert client.store.counters() == before  # no provider call, no commit counted
    snapshot = client.store.snapshot(stream)
    assert list(snapshot.results) == [0] and snapshot.admitted == 1
    assert raw_redis.hget(client.store.keys.stream(stream).meta, "committed") == b"1"
    assert client.pull(stream, 0, 10, timeout=0).pending_windows == 0
    assert client.store.attempts(stream) == {0: 1}
    sender.close()


def test_idempotency_keys_and_stream_ids_are_tokens(make_client):
    client = make_client()
    for key in ("a}b", "a:b", "a*", "", "x" * 65, "a b", "é"):
        with pytest.raises(ValidationError) as err:
            client.open("q", make_candidates(3), idempotency_key=key, allow_shallow=True)
        assert err.value.field == "idempotency_key"
    for stream_id in ("s_" + "g" * 32, "k_a}b", "x", "s_abc"):
        with pytest.raises(ValidationError) as err:
            client.status(stream_id)
        assert err.value.field == "stream_id"


def test_password_protected_redis_end_to_end_and_the_password_is_never_logged(start_worker, make_client):
    password = "pw-" + uuid.uuid4().hex
    server = EmbeddedRedis(password=password).start()
    try:
        env = provider_env("FastProvider")
        env["RERANKQ_REDIS_URL"] = server.url
        worker = start_worker(env=env, args=["--device", "cpu", "--loglevel", "DEBUG"])
        client = make_client(redis_url=server.url)
        stream = client.open("payment gateway error", make_candidates(10), window_size=10)
        assert pull_until_complete(client, stream, 10, timeout_s=30).total == 10
        worker.stop()
        log = worker.log()
        assert "Connected to redis://:***@" in log or ":**@" in log
        assert password not in log
        # Without the password nothing is readable.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0)).get("x")
    finally:
        server.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_tls_redis_end_to_end(start_worker, make_client, tls_files):
    password = "pw-" + uuid.uuid4().hex
    server = EmbeddedRedis(password=password, tls=tls_files).start()
    try:
        assert server.url.startswith("rediss://")
        env = provider_env("FastProvider")
        env["RERANKQ_REDIS_URL"] = server.url
        worker = start_worker(env=env)
        client = make_client(redis_url=server.url)
        stream = client.open("payment gateway error", make_candidates(10), window_size=10)
        assert pull_until_complete(client, stream, 10, timeout_s=30).total == 10
        assert password not in worker.log()
    finally:
        server.stop()


def test_rediss_broker_verifies_certificates_unless_told_not_to():
    import ssl

    assert broker_tls("rediss://h:6380/0")["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert broker_tls("rediss://h:6380/0?ssl_cert_reqs=none")["ssl_cert_reqs"] == ssl.CERT_NONE
    assert broker_tls("redis://h:6379/0") is None


def test_redaction_covers_urls_bearer_tokens_and_stdlib_records():
    line = "connect rediss://user:hunter2@h:6380/0 and redis://:s3cret@h/0 with Authorization: Bearer abc.def"
    redacted = redact_text(line)
    for secret in ("hunter2", "s3cret", "abc.def"):
        assert secret not in redacted
    record = logging.LogRecord("kombu", logging.INFO, __file__, 1, "Connected to %s", ("redis://:p4ss@h/0",), None)
    line = log_formatter().format(record)
    assert "Connected to redis://" in line and "p4ss" not in line


def test_size_limits_refuse_before_anything_is_written(make_client, raw_redis, namespace):
    # The document budget within the text bound, as load requires (a budget past it fails every open).
    client = make_client(max_stream_bytes=4096, max_text_chars=1000, max_query_chars=50, document_budget=1000)
    cases = {
        "candidates": [{"id": f"c{i}", "text": "x" * 900} for i in range(10)],  # over the stream bound
        "candidates[0].text": [{"id": "c0", "text": "x" * 1001}],
        "candidates[0].metadata": [{"id": "c0", "metadata": {"blob": "x" * 2000}}],
        "candidates[0].embedding": [{"id": "c0", "embedding": [0.0] * 9000}],
    }
    for field, candidates in cases.items():
        with pytest.raises(ValidationError) as err:
            client.open("q", candidates, allow_shallow=True)
        assert err.value.field == field
    with pytest.raises(ValidationError) as err:
        client.open("q" * 51, [{"id": "a", "text": "t"}], allow_shallow=True)
    assert err.value.field == "query"
    assert namespace_keys(raw_redis, namespace) == []


def test_tracebacks_are_redacted_too(capsys):
    import structlog

    from worker.logs import configure_logging

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    configure_logging(level="INFO")
    try:
        try:
            raise ConnectionError("cannot reach redis://:tr4ceback@h:6379/0")
        except ConnectionError:
            logging.getLogger("kombu").exception("broker down")
            structlog.get_logger("rerankq.test").exception("sweep_failed")
    finally:
        # configure_logging is process-wide: give the rest of the session its logging back.
        structlog.reset_defaults()
        root.handlers[:], root.level = saved_handlers, saved_level
    err = capsys.readouterr().err
    assert "broker down" in err and "sweep_failed" in err
    assert "tr4ceback" not in err
