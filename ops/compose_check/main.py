"""The command: every image built, each profile checked, one line a profile and a totals line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ops import compose_check
from ops.compose_check.common import BUILT, PORTS, PROFILES, ROOT, CheckFailed, log, reachable, run
from ops.compose_check.engine import Engine, buildkit_client, compose_client, start_engine
from ops.compose_check.faults import check_profile
from ops.compose_check.images import build, ensure_hub_images, hub_images, image_size_mb
from ops.compose_check.profiles import COMPOSE_FILE, Stack, profiles, write_override
from ops.compose_check.wheels import host_pip_sources, serve_directory

# The package's docstring says what is checked; its first line is the command's description.
DESCRIPTION = (compose_check.__doc__ or "").splitlines()[0]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.compose_check", description=DESCRIPTION)
    parser.add_argument("profiles", nargs="*", metavar="PROFILE", help=f"of {', '.join(PROFILES)} (default: all)")
    parser.add_argument("--keep", action="store_true", help="leave the work directory (logs, outputs) in place")
    args = parser.parse_args()
    unknown = sorted(set(args.profiles) - set(PROFILES))
    if unknown:
        parser.error(f"unknown profiles {unknown}: choose from {', '.join(PROFILES)}")
    args.profiles = args.profiles or list(PROFILES)
    COMPOSE_FILE.update(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="rerankq-compose-check."))
    os.chmod(work, 0o755)
    engine: Engine | None = None
    results: list[tuple[str, bool, str, float]] = []
    try:
        started_pid = start_engine(work)
        docker = buildkit_client()
        compose, kind = compose_client()
        engine = Engine(docker, compose, kind, started_pid)
        log(
            f"engine: {run([*docker, 'version', '--format', '{{.Server.Version}}'], timeout=30).stdout.strip()}; "
            f"builds: {docker[0]} with BuildKit; compose: {kind}"
        )

        sources = host_pip_sources()
        cert_args = ["--secret", f"id=pip_cert,src={sources.cert}"] if sources.cert else []
        standins = ensure_hub_images(docker, work, hub_images(COMPOSE_FILE) + ["python:3.11-slim"], cert_args)
        for image in standins:
            log(f"stand-in: {image} is built here from Debian bookworm packages (no registry answered)")

        build_args = list(cert_args)
        torch_wheels = [w for d in sources.find_links for w in sorted(d.glob("torch-*+cpu-*.whl"))]
        with contextlib.ExitStack() as stack:
            if not reachable("https://download.pytorch.org/whl/cpu/"):
                if not torch_wheels:
                    raise CheckFailed(
                        "the PyTorch CPU index is unreachable and no local torch +cpu wheel is configured"
                    )
                wheel = torch_wheels[-1]
                version = wheel.name.split("-")[1]
                url = stack.enter_context(serve_directory(wheel.parent))
                log(
                    f"PyTorch index unreachable: torch=={version} from {wheel.parent} (served on {url}),"
                    " the rest from PyPI"
                )
                build_args += [
                    "--build-arg",
                    "TORCH_CPU_INDEX=https://pypi.org/simple",
                    "--build-arg",
                    f"TORCH_SPEC=torch=={version}",
                    "--build-arg",
                    f"PIP_BUILD_FIND_LINKS={url}",
                ]
            for target in BUILT:
                image = f"rerankq-{target}:latest"
                seconds = build(docker, ["-f", "ops/Dockerfile", "--target", target, *build_args, "-t", image, "."])
                log(f"built {image}: {image_size_mb(docker, image):.0f} MB in {seconds:.0f}s")
        cuda = run(
            [
                *docker,
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                "rerankq-worker-cpu:latest",
                "-c",
                (
                    "find / -xdev \\( -name 'libcudart*' -o -name 'libcublas*'"
                    " -o -name 'libnccl*' -o -name 'libcudnn*' \\)"
                    " 2>/dev/null | head -5"
                ),
            ],
            timeout=120,
        ).stdout.strip()
        if cuda:
            raise CheckFailed(f"the CPU worker image holds CUDA libraries: {cuda}")
        log("rerankq-worker-cpu: no CUDA libraries")

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
        key = json.loads(made.stdout.strip().splitlines()[-1])["key"]
        keys_file.chmod(0o644)
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
        for name in args.profiles:
            profile = profiles(password, rabbit_password)[name]
            host_env = {**os.environ, "RERANKQ_REDIS_URL": f"redis://:{password}@127.0.0.1:{PORTS['REDIS']}/0"}
            if name == "amqp":
                host_env["RERANKQ_BROKER_URL"] = f"amqp://rerankq:{rabbit_password}@127.0.0.1:{PORTS['RABBITMQ']}//"
            stack = Stack(engine, profile, work, env, override)
            t0 = time.monotonic()
            try:
                note = check_profile(stack, key, host_env, docker)
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
            down_s = time.monotonic() - down_began
            note += f"; down {down_s:.0f}s"
            results.append((name, ok, note, time.monotonic() - t0))
            print(f"PROFILE {name:9} {'PASS' if ok else 'FAIL'} {time.monotonic() - t0:5.0f}s  {note}", flush=True)
    except CheckFailed as exc:
        print(f"SETUP FAIL: {exc}", flush=True)
        results.append(("setup", False, str(exc), 0.0))
    finally:
        if engine is not None and engine.started_pid is not None:
            log("stopping the dockerd this check started")
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.started_pid, signal.SIGTERM)
            # dockerd stops its containerd before it exits: wait for that, as a supervisor would.
            deadline = time.monotonic() + 60
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(engine.started_pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                    time.sleep(0.5)
        if not args.keep and all(ok for _, ok, _, _ in results):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    passed = sum(ok for _, ok, _, _ in results)
    print(f"TOTAL {passed}/{len(results)} passed in {time.monotonic() - began:.0f}s", flush=True)
    return 0 if results and passed == len(results) else 1
