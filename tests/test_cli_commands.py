"""The ``rerankq`` script as one click program: every command's help with examples, the
version, shell completion, and ``serve keygen`` making keys a real gateway accepts."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from cli_helpers import RERANKQ, rerankq
from conftest import ROOT
from gateway_helpers import GatewayProcess

from rerankq import COMMANDS


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_") and not k.startswith("_RERANKQ")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_version_is_the_installed_distributions() -> None:
    done = rerankq(["--version"], plain_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rerankq {importlib.metadata.version('rerankq')}"


@pytest.mark.parametrize("command", [*COMMANDS, "serve keygen"])
def test_every_command_has_its_own_help_with_examples(command: str) -> None:
    done = rerankq([*command.split(), "--help"], plain_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: rerankq {command} ")
    assert "Examples:" in done.stdout and f"rerankq {command}" in done.stdout.split("Examples:")[1]


@pytest.mark.parametrize(
    "program,command", [("producer.gateway", "serve"), ("producer.exporter", "exporter"), ("evaluation", "eval")]
)
def test_the_python_m_programs_run_the_same_commands(program: str, command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", program, "--help"], env=plain_env(), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    same = rerankq([command, "--help"], plain_env()).stdout
    assert done.stdout == same.replace(f"Usage: rerankq {command} ", f"Usage: python -m {program} ", 1)


def test_a_usage_error_exits_2_naming_the_option() -> None:
    done = rerankq(["eval", "--depths", "ten"], plain_env())
    assert done.returncode == 2 and "--depths" in done.stderr


def test_bash_completion_is_generated_and_completes_commands_and_options() -> None:
    script = rerankq([], plain_env(_RERANKQ_COMPLETE="bash_source"))
    assert script.returncode == 0 and "_rerankq_completion()" in script.stdout and "complete " in script.stdout
    commands = rerankq([], plain_env(_RERANKQ_COMPLETE="bash_complete", COMP_WORDS="rerankq se", COMP_CWORD="1"))
    assert "plain,serve" in commands.stdout.split()
    options = rerankq(
        [], plain_env(_RERANKQ_COMPLETE="bash_complete", COMP_WORDS="rerankq serve keygen --te", COMP_CWORD="3")
    )
    assert "plain,--tenant" in options.stdout.split()


# -- serve's start --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a port in use", "a host that does not resolve"])
def test_serve_that_cannot_listen_exits_3_at_once(redis_server, tmp_path: Path, where: str) -> None:
    """A real ``rerankq serve`` against a port really taken (or a host no resolver knows) says
    why and exits 3 within seconds, instead of hanging in its shutdown."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        host = "127.0.0.1" if where == "a port in use" else "999.1.1.1"
        env = plain_env(RERANKQ_REDIS_URL=redis_server.url, RERANKQ_NAMESPACE="k" + uuid.uuid4().hex[:10])
        started = time.monotonic()
        with subprocess.Popen(
            [str(RERANKQ), "serve", "--insecure-no-auth", "--host", host, "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as serve:
            try:
                out, _ = serve.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
                out, _ = serve.communicate()
                pytest.fail(f"rerankq serve still running 30 s after it could not listen:\n{out[-2000:]}")
        took = time.monotonic() - started
    assert serve.returncode == 3, out[-2000:]
    assert took < 20, f"took {took:.1f} s"
    assert "gateway_cannot_listen" in out and f"{host}:{port}" in out, out[-2000:]
    assert "Application startup" not in out  # it never started the app (no Redis connections to undo)


# -- serve keygen ---------------------------------------------------------------------------------


def keygen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return rerankq(["serve", "keygen", *args], env or plain_env())


def test_keygen_writes_then_appends_the_keys_file_and_the_gateway_accepts_each_key(redis_server, tmp_path) -> None:
    keys_file = tmp_path / "keys.json"
    first = keygen("--tenant", "acme", "--keys-file", str(keys_file))
    assert first.returncode == 0, first.stderr
    acme = first.stdout.strip()
    assert acme.startswith("rq_") and "\n" not in acme  # stdout is the key alone, for KEY=$(...)
    assert oct(keys_file.stat().st_mode & 0o777) == "0o600"
    # The file named by the gateway's own variable is the default.
    second = keygen("--tenant", "ops", "--devices", "cpu,gpu", env=plain_env(RERANKQ_GATEWAY_KEYS_FILE=str(keys_file)))
    assert second.returncode == 0, second.stderr
    ops = second.stdout.strip()
    stored = json.loads(keys_file.read_text())
    assert [(e["tenant"], e["devices"]) for e in stored] == [("acme", ["cpu"]), ("ops", ["cpu", "gpu"])]
    text = keys_file.read_text()
    assert acme not in text and ops not in text  # only digests
    assert acme not in first.stderr and ops not in second.stderr
    assert "shown once" in second.stderr and str(keys_file) in second.stderr

    namespace = "k" + uuid.uuid4().hex[:10]
    env = plain_env(
        RERANKQ_REDIS_URL=redis_server.url, RERANKQ_NAMESPACE=namespace, RERANKQ_GATEWAY_KEYS_FILE=str(keys_file)
    )
    gateway = GatewayProcess(env, tmp_path / "gateway.log", program=[str(RERANKQ), "serve"]).start()
    try:
        missing = "/v1/streams/s_" + "0" * 32
        for key in (acme, ops):  # authenticated: the stream is simply not there
            assert (
                httpx.get(gateway.url + missing, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code
                == 404
            )
        assert (
            httpx.get(gateway.url + missing, headers={"Authorization": "Bearer rq_unknown"}, timeout=10).status_code
            == 401
        )
    finally:
        gateway.stop()
    # rerankq renders the gateway's records (its modules configure no logging); no key is in them.
    log = gateway.log()
    assert " INFO uvicorn.error " in log and f"gateway_listening address='127.0.0.1:{gateway.port}'" in log
    assert acme not in log and ops not in log


def test_ten_keygens_at_once_on_one_file_keep_all_ten_keys(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    runs = [
        subprocess.Popen(
            [str(RERANKQ), "serve", "keygen", "--tenant", f"t{i}", "--keys-file", str(keys_file), "--json"],
            env=plain_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(10)
    ]
    printed = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        printed.append(json.loads(out)["entry"]["key_sha256"])
    kept = [entry["key_sha256"] for entry in json.loads(keys_file.read_text())]
    assert sorted(kept) == sorted(printed)  # every key printed is a key the gateway will accept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys.json"]  # no temporary or lock file left


def test_keygen_writes_through_a_symlinked_keys_file_to_its_target(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    target = tmp_path / "secrets" / "keys.json"
    target.write_text("[]\n")
    target.chmod(0o640)
    link = tmp_path / "keys.json"
    link.symlink_to(target)
    done = keygen("--tenant", "acme", "--keys-file", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and link.resolve() == target  # the link is still the link
    assert [e["tenant"] for e in json.loads(target.read_text())] == ["acme"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o640)  # the target keeps its mode
    assert sorted(p.name for p in (tmp_path / "secrets").iterdir()) == ["keys.json"]


def test_a_keys_file_that_is_a_fifo_is_refused_by_keygen_and_serve_at_once(redis_server, tmp_path: Path) -> None:
    fifo = tmp_path / "keys.json"
    os.mkfifo(fifo)
    env = plain_env(RERANKQ_REDIS_URL=redis_server.url, RERANKQ_GATEWAY_KEYS_FILE=str(fifo))
    for args in (["serve", "keygen", "--tenant", "acme"], ["serve", "--port", "1"]):
        try:
            done = rerankq(args, env, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rerankq {' '.join(args)} still waiting on the FIFO 60 s later")
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr and str(fifo) in done.stderr
        assert done.stdout == ""  # no key printed for a file it could not write


def test_keygen_leaves_a_file_that_is_not_a_keys_file_as_it_was(tmp_path: Path) -> None:
    other = tmp_path / "notes.json"
    other.write_text('{"not": "a list of keys"}\n')
    done = keygen("--tenant", "acme", "--keys-file", str(other))
    assert done.returncode == 2 and "left as it was" in done.stderr
    assert done.stdout == ""  # no key was made for a file it could not write
    assert other.read_text() == '{"not": "a list of keys"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


def test_keygen_without_a_file_prints_the_entry_to_add(tmp_path: Path) -> None:
    done = keygen("--tenant", "acme", "--chain", "private", env=plain_env(RERANKQ_CHAIN_PRIVATE="0"))
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    entry = json.loads(done.stderr.strip().splitlines()[-1])
    assert entry["tenant"] == "acme" and entry["chain"] == "private" and key not in done.stderr
    refused = keygen("--tenant", "acme", "--chain", "nope")
    assert refused.returncode == 2 and "RERANKQ_CHAIN_NOPE" in refused.stderr and refused.stdout == ""


def test_keygen_appends_beside_entries_bound_to_profiles_this_host_does_not_define(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    bound = {"key_sha256": "ab" * 32, "tenant": "acme", "chain": "private", "devices": ["gpu"]}
    keys_file.write_text(json.dumps([bound]))
    done = keygen("--tenant", "ops", "--keys-file", str(keys_file))  # no RERANKQ_CHAIN_PRIVATE here
    assert done.returncode == 0, done.stderr
    assert [e["tenant"] for e in json.loads(keys_file.read_text())] == ["acme", "ops"]
    assert json.loads(keys_file.read_text())[0] == bound  # kept as it was written
