"""The command: every image built, each profile checked, one line a profile and a totals line."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ops import compose_check
from ops.compose_check.common import PORTS, PROFILES, ROOT, CheckFailed, log, run
from ops.compose_check.engine import Engine, open_engine, stop_engine
from ops.compose_check.faults import check_profile
from ops.compose_check.images import build_images
from ops.compose_check.profiles import COMPOSE_FILE, Stack, profiles, write_override

# The package's docstring says what is checked; its first line is the command's description.
DESCRIPTION = (compose_check.__doc__ or "").splitlines()[0]

#: A profile's outcome: its name, whether it passed, the note printed after it, its seconds.
Result = tuple[str, bool, str, float]


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.compose_check", description=DESCRIPTION)
    parser.add_argument("profiles", nargs="*", metavar="PROFILE", help=f"of {', '.join(PROFILES)} (default: all)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory (logs, outputs) in place")
    args = parser.parse_args()
    unknown = sorted(set(args.profiles) - set(PROFILES))
    if unknown:
        parser.error(f"unknown profiles {unknown}: choose from {', '.join(PROFILES)}")
    args.profiles = args.profiles or list(PROFILES)
    return args


def build_model(work: Path) -> Path:
    """The tiny cross-encoder the workers mount, built here so nothing is downloaded."""
    model = work / "tiny-cross-encoder"
    run(
        [
            sys.executable,
            "-c",
            (
                "import sys; from devservers.tiny_model import "
                "build_tiny_cross_encoder as b; from pathlib import Path; b(Path(sys.argv[1]))"
            ),
            str(model),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    run(["chmod", "-R", "a+rX", str(model)])
    return model


def gateway_key(work: Path) -> tuple[Path, str]:
    """A keys file for the gateway with one tenant's key, and that key."""
    keys_file = work / "gateway-keys.json"
    made = run(
        [
            sys.executable,
            "-m",
            "producer.gateway",
            "keygen",
            "--tenant",
            "check",
            "--keys-file",
            str(keys_file),
            "--json",
        ],
        timeout=60,
        capture=True,
    )
    keys_file.chmod(0o644)
    return keys_file, json.loads(made.stdout.strip().splitlines()[-1])["key"]


def check_one(name: str, stack: Stack, key: str, host_env: dict[str, str], work: Path) -> Result:
    """One profile checked and brought down; its logs kept in ``work`` when it fails."""
    t0 = time.monotonic()
    try:
        note = check_profile(stack, key, host_env)
        ok = True
    except (CheckFailed, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
        ok, note = False, str(exc).strip().splitlines()[0][:400]
        log(f"{name} FAILED: {exc}")
        (work / f"{name}-logs.txt").write_text(
            stack.compose("logs", "--no-color", "--tail", "200", check=False).stdout or ""
        )
        log(f"{name}: container logs in {work / (name + '-logs.txt')}")
    down_began = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans", check=False, timeout=300)
    note += f"; down {time.monotonic() - down_began:.0f}s"
    print(f"PROFILE {name:9} {'PASS' if ok else 'FAIL'} {time.monotonic() - t0:5.0f}s  {note}", flush=True)
    return name, ok, note, time.monotonic() - t0


def check_profiles(engine: Engine, names: list[str], work: Path) -> list[Result]:
    """The images built, then each named profile checked in turn on free host ports."""
    build_images(engine.docker, work)
    model = build_model(work)
    keys_file, key = gateway_key(work)
    override = work / "override.yml"
    write_override(override, model)
    password, rabbit_password = secrets.token_hex(12), secrets.token_hex(12)
    env = {
        **os.environ,
        "RERANKQ_REDIS_PASSWORD": password,
        "RERANKQ_RABBITMQ_PASSWORD": rabbit_password,
        "RERANKQ_GATEWAY_KEYS_FILE": str(keys_file),
        **{f"RERANKQ_{name}_HOST_PORT": str(port) for name, port in PORTS.items()},
    }
    results = []
    for name in names:
        profile = profiles(password, rabbit_password)[name]
        host_env = {**os.environ, "RERANKQ_REDIS_URL": f"redis://:{password}@127.0.0.1:{PORTS['REDIS']}/0"}
        if name == "amqp":
            host_env["RERANKQ_BROKER_URL"] = f"amqp://rerankq:{rabbit_password}@127.0.0.1:{PORTS['RABBITMQ']}//"
        results.append(check_one(name, Stack(engine, profile, work, env, override), key, host_env, work))
    return results


def main() -> int:
    args = parse_arguments()
    COMPOSE_FILE.update(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rerankq-compose-check."))
    os.chmod(work, 0o755)
    engine: Engine | None = None
    results: list[Result] = []
    try:
        engine = open_engine(work)
        results = check_profiles(engine, args.profiles, work)
    except CheckFailed as exc:
        print(f"SETUP FAIL: {exc}", flush=True)
        results.append(("setup", False, str(exc), 0.0))
    finally:
        if engine is not None:
            stop_engine(engine)
        if not args.keep and all(ok for _, ok, _, _ in results):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    passed = sum(ok for _, ok, _, _ in results)
    print(f"TOTAL {passed}/{len(results)} passed in {time.monotonic() - began:.0f}s", flush=True)
    return 0 if results and passed == len(results) else 1
