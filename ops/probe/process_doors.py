"""Probe what a process is handed before it takes work, the way a careless or hostile operator
would hand it: the port it binds, the keys file it rewrites, the files its settings name, the
settings themselves, and what it prints of them.

    python -m ops.probe.process_doors [--keep] [--only NAME]

Starts its own private Redis on loopback and runs rerankq's own commands as subprocesses, each
bounded by a deadline (a process that would hang is a failure, never a hung probe):

- ``serve_port_in_use`` / ``serve_bad_host``: ``rerankq serve`` on a port already taken, or a
  host no resolver knows, exits 3 within seconds instead of hanging in its shutdown;
- ``keygen_parallel``: ten ``serve keygen`` at once on one keys file keep all ten keys;
- ``keygen_symlink``: a symlinked keys file stays a symlink and its target gets the key;
- ``config_masks_secrets``: ``rerankq config`` (table and ``--json``) shows no member URL's
  query secret and no Sentinel host's password;
- ``calibration_files``: ``RERANKQ_CALIBRATION`` naming ``/dev/zero``, a FIFO, a directory or
  a file over the size bound is refused at once, by ``rerankq config`` and by a worker's start;
- ``keys_and_settings_fifo``: a FIFO as the keys file (``serve``, ``serve keygen``) or as
  ``RERANKQ_CONFIG_FILE`` is refused at once;
- ``settings_bounds``: a setting outside the bounds of the option it feeds
  (``RERANKQ_STREAM_TTL_S=99999999999999999999``, ``_SWEEP_INTERVAL_S=inf``,
  ``_RERANKER_TIMEOUT_S=1e-300``, ...) makes ``rerankq config`` exit non-zero naming it.

One line per probe, ``probe <name>: ok`` or ``probe <name>: FAIL <why>``; exit status 1 when any
probe failed, 2 when the private Redis would not start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ops.probe.runner import ProbeFailed, check, run_each
from worker.embedded.redis_server import EmbeddedRedis
from worker.scoring.calibration import MAX_CALIBRATION_BYTES

ROOT = Path(__file__).resolve().parents[2]
#: How long a refusal may take: a start that reads, hangs or retries is past it.
REFUSED_WITHIN_S = 30.0


@dataclass
class Done:
    returncode: int
    out: str
    took_s: float


@dataclass
class Context:
    tmp: Path
    redis: EmbeddedRedis

    def env(self, **settings: str) -> dict[str, str]:
        """A plain environment: no RERANKQ_ variable of the caller's, this probe's Redis."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "RERANKQ_REDIS_URL": self.redis.url,
                "RERANKQ_NAMESPACE": "probe" + uuid.uuid4().hex[:6],
                "COLUMNS": "400",
            }
        )
        env.update(settings)
        return env

    def path(self, name: str) -> Path:
        """A fresh directory for one case, so no case sees another's files."""
        directory = self.tmp / f"{name}-{uuid.uuid4().hex[:6]}"
        directory.mkdir()
        return directory


def rerankq(args: list[str], env: dict[str, str], timeout_s: float = REFUSED_WITHIN_S) -> Done:
    """``rerankq ARGS`` to its end, stdout and stderr together; killed (and failed) past ``timeout_s``."""
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "rerankq", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            out, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            raise ProbeFailed(
                f"rerankq {' '.join(args)[:80]} still running after {timeout_s:.0f} s: {out[-200:]!r}"
            ) from None
    return Done(process.returncode, out, time.monotonic() - started)


# -- serve's start ----------------------------------------------------------------------------------


def serve_cannot_listen(c: Context, host: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = rerankq(["serve", "--insecure-no-auth", "--host", host, "--port", str(port)], c.env())
    check(done.returncode == 3, f"exited {done.returncode}, not 3: {done.out[-200:]!r}")
    check(done.took_s < 20, f"took {done.took_s:.1f} s")
    check("gateway_cannot_listen" in done.out, "it did not say it cannot listen")


def probe_serve_port_in_use(c: Context) -> None:
    serve_cannot_listen(c, "127.0.0.1")


def probe_serve_bad_host(c: Context) -> None:
    serve_cannot_listen(c, "999.1.1.1")


# -- serve keygen -----------------------------------------------------------------------------------


def probe_keygen_parallel(c: Context) -> None:
    keys_file = c.path("keygen") / "keys.json"
    env = c.env()
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "rerankq", "serve", "keygen", "--tenant", f"t{i}"]
            + ["--keys-file", str(keys_file), "--json"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(10)
    ]
    printed = []
    try:
        for run in runs:
            out, err = run.communicate(timeout=120)
            check(run.returncode == 0, f"a keygen exited {run.returncode}: {err[-200:]!r}")
            printed.append(json.loads(out)["entry"]["key_sha256"])
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    kept = [entry["key_sha256"] for entry in json.loads(keys_file.read_text())]
    check(sorted(kept) == sorted(printed), f"{len(printed)} keys printed, {len(set(kept) & set(printed))} kept")
    left = sorted(p.name for p in keys_file.parent.iterdir())
    check(left == ["keys.json"], f"left behind: {left}")


def probe_keygen_symlink(c: Context) -> None:
    directory = c.path("symlink")
    (directory / "secrets").mkdir()
    target = directory / "secrets" / "keys.json"
    target.write_text("[]\n")
    link = directory / "keys.json"
    link.symlink_to(target)
    done = rerankq(["serve", "keygen", "--tenant", "acme", "--keys-file", str(link)], c.env())
    check(done.returncode == 0, f"exited {done.returncode}: {done.out[-200:]!r}")
    check(link.is_symlink() and link.resolve() == target, "the symlink was replaced by a file")
    check([e["tenant"] for e in json.loads(target.read_text())] == ["acme"], "the target did not get the key")


# -- what config prints -----------------------------------------------------------------------------


def probe_config_masks_secrets(c: Context) -> None:
    secrets = ["s3cret-" + uuid.uuid4().hex[:8] for _ in range(6)]
    env = c.env(
        RERANKQ_REDIS_URL=f"redis+sentinel://:{secrets[0]}@h1:26379,:{secrets[1]}@h2:26379/svc",
        RERANKQ_BROKER_URL=f"redis://127.0.0.1:6379/1?password={secrets[2]}",
        RERANKQ_RERANKER_PROVIDER="http",
        RERANKQ_RERANKER_URL=f"https://rerank.example/v1?api_key={secrets[3]}&token={secrets[4]}&region=eu",
        RERANKQ_RERANKER_1_PROVIDER="tei",
        RERANKQ_RERANKER_1_URL=f"https://tei.example/?x-api-key={secrets[5]}",
    )
    for args in (["config"], ["config", "--json"]):
        done = rerankq(args, env)
        check(done.returncode == 0, f"{' '.join(args)} exited {done.returncode}: {done.out[-200:]!r}")
        shown = [i for i, secret in enumerate(secrets) if secret in done.out]
        check(not shown, f"{' '.join(args)} printed secrets {shown} in clear")
        check("region=eu" in done.out, f"{' '.join(args)} masked what is not secret")


# -- files a setting names --------------------------------------------------------------------------


def not_regular_files(directory: Path) -> dict[str, str]:
    """Paths no process can read as a file, by kind."""
    fifo = directory / "fifo"
    os.mkfifo(fifo)  # its reader waits for a writer that never comes
    oversize = directory / "oversize.json"
    with open(oversize, "wb") as fh:
        fh.truncate(MAX_CALIBRATION_BYTES + 1)  # sparse: costs no disk
    return {"/dev/zero": "/dev/zero", "fifo": str(fifo), "directory": str(directory), "oversize": str(oversize)}


def probe_calibration_files(c: Context) -> None:
    for kind, path in not_regular_files(c.path("calibration")).items():
        env = c.env(RERANKQ_CALIBRATION=path, RERANKQ_RERANKER_PROVIDER="rrf")
        for args in (["config"], ["worker", "--device", "cpu"]):
            done = rerankq(args, env)
            check(done.returncode != 0, f"{kind}: rerankq {args[0]} exited 0")
            check("RERANKQ_CALIBRATION" in done.out, f"{kind}: rerankq {args[0]} did not name RERANKQ_CALIBRATION")
            check("Traceback" not in done.out, f"{kind}: rerankq {args[0]} ended in a traceback")


def probe_keys_and_settings_fifo(c: Context) -> None:
    fifo = c.path("fifo") / "file"
    os.mkfifo(fifo)
    keys = c.env(RERANKQ_GATEWAY_KEYS_FILE=str(fifo))
    for args, env, named in [
        (["serve", "keygen", "--tenant", "acme"], keys, str(fifo)),
        (["serve", "--port", "1"], keys, str(fifo)),
        (["config"], c.env(RERANKQ_CONFIG_FILE=str(fifo)), "RERANKQ_CONFIG_FILE"),
    ]:
        done = rerankq(args, env)
        check(done.returncode != 0, f"rerankq {' '.join(args)} exited 0")
        check("not a regular file" in done.out and named in done.out, f"rerankq {' '.join(args)}: {done.out[-200:]!r}")


def probe_settings_bounds(c: Context) -> None:
    for variable, value in [
        ("RERANKQ_STREAM_TTL_S", "99999999999999999999"),
        ("RERANKQ_SWEEP_INTERVAL_S", "inf"),
        ("RERANKQ_SWEEP_INTERVAL_S", "nan"),
        ("RERANKQ_RERANKER_TIMEOUT_S", "1e-300"),
        ("RERANKQ_GATEWAY_TIMEOUT_S", "1e-300"),
        ("RERANKQ_CACHE_TTL_S", "99999999999999999999"),
        ("RERANKQ_MIN_SCORE", "1.5"),
        ("RERANKQ_DOCUMENT_BUDGET", "70000"),
    ]:
        done = rerankq(["config"], c.env(**{variable: value}))
        check(done.returncode != 0, f"{variable}={value}: rerankq config exited 0")
        check(variable in done.out, f"{variable}={value}: the refusal does not name it: {done.out[-200:]!r}")


def probes() -> list[tuple[str, Callable[[Context], None]]]:
    return [
        ("serve_port_in_use", probe_serve_port_in_use),
        ("serve_bad_host", probe_serve_bad_host),
        ("keygen_parallel", probe_keygen_parallel),
        ("keygen_symlink", probe_keygen_symlink),
        ("config_masks_secrets", probe_config_masks_secrets),
        ("calibration_files", probe_calibration_files),
        ("keys_and_settings_fifo", probe_keys_and_settings_fifo),
        ("settings_bounds", probe_settings_bounds),
    ]


@contextlib.contextmanager
def context(keep: bool) -> Iterator[Context]:
    tmp = Path(tempfile.mkdtemp(prefix="rerankq-probe-process-"))
    (tmp / "redis").mkdir()
    redis = EmbeddedRedis(directory=str(tmp / "redis")).start()
    try:
        yield Context(tmp, redis)
    finally:
        redis.stop()
        if keep:
            print(f"files kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.probe.process_doors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--keep", action="store_true", help="keep the probes' files")
    parser.add_argument("--only", action="append", help="run only this probe (repeatable)")
    args = parser.parse_args(argv)
    try:
        opened = context(args.keep)
        c = opened.__enter__()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported, not raised
        print(f"probe redis: FAIL {type(exc).__name__}: {str(exc)[:300]}")
        return 2
    try:
        failed = run_each(probes(), c, args.only)
    finally:
        opened.__exit__(None, None, None)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
