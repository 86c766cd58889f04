"""The images: those the registry cannot give replaced by stand-ins built on a debootstrap base, ours
built."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ops.compose_check.common import BUILT, ROOT, CheckFailed, log, run
from ops.compose_check.profiles import COMPOSE_FILE
from ops.compose_check.wheels import host_pip_sources, torch_build_args

STANDIN_TARGETS = {
    "python": "python",
    "redis": "redis",
    "rabbitmq": "rabbitmq",
    "prom/prometheus": "prometheus",
    "mher/flower": "flower",
}


STANDIN_LABEL = "org.rerankq.standin"


def image_exists(docker: list[str], name: str) -> bool:
    return run([*docker, "image", "inspect", name], check=False, timeout=30).returncode == 0


def is_standin(docker: list[str], name: str) -> bool:
    """Built here rather than pulled: an image from a registry has a repository digest."""
    digests = run([*docker, "image", "inspect", "--format", "{{len .RepoDigests}}", name], timeout=30).stdout.strip()
    return digests == "0"


def debian_base(docker: list[str], work: Path) -> str:
    for name in ("debian:bookworm-slim", "rerankq-base:bookworm"):
        if image_exists(docker, name):
            return name
    if run([*docker, "pull", "debian:bookworm-slim"], check=False, timeout=120).returncode == 0:
        return "debian:bookworm-slim"
    if not shutil.which("debootstrap"):
        raise CheckFailed("no registry answers and debootstrap is not installed (apt-get install debootstrap)")
    mirror = apt_mirror()
    rootfs = work / "rootfs"
    log(f"no registry: making a Debian bookworm base with debootstrap from {mirror}")
    run(["nice", "-n", "10", "debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=1800)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for child in (rootfs / junk).glob("*"):
            if child.is_file():
                child.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        [*docker, "import", "-", "rerankq-base:bookworm"], stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL
    )
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    return "rerankq-base:bookworm"


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 or one-line sources), else deb.debian.org."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            text = path.read_text()
            for match in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s", text):
                return match.group(1)
    return "http://deb.debian.org/debian"


def hub_images(compose_file: dict) -> list[str]:
    images = {s["image"] for s in compose_file["services"].values() if "image" in s and "build" not in s}
    return sorted(images)


def ensure_hub_images(docker: list[str], work: Path, images: list[str], cert_args: list[str]) -> list[str]:
    """Pull each; where the registry does not answer, build the Debian stand-in of the same name."""
    standins = []
    for image in images:
        repository = image.rsplit(":", 1)[0]
        if image_exists(docker, image):
            if is_standin(docker, image):
                standins.append(image)
            continue
        if run([*docker, "pull", image], check=False, timeout=300).returncode == 0:
            continue
        target = STANDIN_TARGETS.get(repository)
        if target is None:
            raise CheckFailed(f"{image}: cannot be pulled and has no stand-in")
        base = debian_base(docker, work)
        log(f"{image}: no registry answers; building a stand-in from Debian packages ({target})")
        build(
            docker,
            [
                "-f",
                "ops/standins/Dockerfile",
                "--build-arg",
                f"BASE={base}",
                "--target",
                target,
                "--label",
                f"{STANDIN_LABEL}=debian-bookworm",
                *cert_args,
                "-t",
                image,
                "ops/standins",
            ],
        )
        standins.append(image)
    return standins


def build(docker: list[str], args: list[str]) -> float:
    started = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    result = subprocess.run(
        check=False,
        args=["nice", "-n", "10", *docker, "build", "--network", "host", "--progress", "plain", *args],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=3600,
    )
    if result.returncode != 0:
        raise CheckFailed(f"docker build {' '.join(args)} failed:\n{result.stdout[-4000:]}")
    return time.monotonic() - started


def image_size_mb(docker: list[str], name: str) -> float:
    return int(run([*docker, "image", "inspect", "--format", "{{.Size}}", name], timeout=30).stdout.strip()) / 1e6


def build_images(docker: list[str], work: Path) -> None:
    """The hub images (or their stand-ins) and ours, built with the host's pip settings; the CPU
    worker image checked to hold no CUDA library."""
    sources = host_pip_sources()
    cert_args = ["--secret", f"id=pip_cert,src={sources.cert}"] if sources.cert else []
    standins = ensure_hub_images(docker, work, hub_images(COMPOSE_FILE) + ["python:3.11-slim"], cert_args)
    for image in standins:
        log(f"stand-in: {image} is built here from Debian bookworm packages (no registry answered)")
    with contextlib.ExitStack() as stack:
        build_args = [*cert_args, *torch_build_args(sources, stack)]
        for target in BUILT:
            image = f"rerankq-{target}:latest"
            seconds = build(docker, ["-f", "ops/Dockerfile", "--target", target, *build_args, "-t", image, "."])
            log(f"built {image}: {image_size_mb(docker, image):.0f} MB in {seconds:.0f}s")
    check_no_cuda(docker)


def check_no_cuda(docker: list[str]) -> None:
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
