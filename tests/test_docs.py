"""README and docs/: every command and code block in README runs or parses, every link
resolves (file and GitHub-style anchor), and the quickstart runs as written."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: Pages another step generates (from kernel/settings.py); links to them are checked once they exist.
GENERATED = {ROOT / "docs" / "configuration.md"}
#: Programs README's shell lines may name besides rerankq and make: shell builtins and the usual tools.
KNOWN_PROGRAMS = {
    "redis-server",
    "redis-cli",
    "export",
    "until",
    "do",
    "done",
    "echo",
    "curl",
    "kill",
    "grep",
    "sleep",
    "python",
    "pip",
    "cd",
    ".",
    "docker",
    "jobs",
}


def blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def shell_commands(body: str) -> list[str]:
    """Each simple command of a shell block: comments dropped, lines joined at a trailing ``\\``,
    split at ``;``, ``&&``, ``||``, ``|``, ``&`` and ``$(...)``."""
    joined = re.sub(r"\\\n", " ", body)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words + [";"]:
            if word in {";", "&&", "||", "|", "&"} or word.endswith(";"):
                if word.endswith(";") and word != ";":
                    current.append(word[:-1])
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    out = []
    for words in commands:
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value cmd
            words = words[1:]
        if words:
            out.append(shlex.join(words))
    return out


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def rerankq_help(args: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rerankq", *args, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, f"rerankq {' '.join(args)} --help: {done.stdout}{done.stderr}"
    return done.stdout


def test_readme_python_blocks_compile():
    found = [body for lang, body in blocks(README.read_text()) if lang == "python"]
    assert found
    for body in found:
        compile(body, "README.md", "exec")


def test_readme_shell_lines_name_real_commands_targets_and_flags():
    helps: dict[tuple[str, ...], str] = {}
    targets = make_targets()
    for lang, body in blocks(README.read_text()):
        if lang not in {"sh", "bash", "shell"}:
            continue
        for command in shell_commands(body):
            words = shlex.split(command)
            program = words[0].lstrip("$(")
            if program == "make":
                assert set(words[1:]) <= targets, f"README: {command}: no such make target"
            elif program == "rerankq":
                path = tuple(
                    w
                    for w in words[1:3]
                    if not w.startswith("-")
                    and w
                    in {"worker", "demo", "submit", "status", "pull", "inspect", "serve", "exporter", "eval", "keygen"}
                )
                if path not in helps:
                    helps[path] = rerankq_help(list(path))
                for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
                    assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[path]), (
                        f"README: {command}: rerankq {' '.join(path)} has no {flag}"
                    )
            else:
                assert program in KNOWN_PROGRAMS, f"README: {command}: {program} is not a command README may use"
    assert ("worker",) in helps and ("serve",) in helps and ("submit",) in helps


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        heading = None if fence else re.match(r"^#{1,6} (.*)$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", [README, ROOT / "CHANGELOG.md", *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_links_to_a_missing_file_or_anchor(page):
    for link in links(page):
        if re.match(r"^[a-z]+:", link):
            continue  # http(s), mailto: not ours to check offline
        target, _, anchor = link.partition("#")
        dest = (page.parent / target).resolve() if target else page
        if dest in GENERATED and not dest.exists():
            continue
        assert dest.exists(), f"{page.name}: link to a missing file: {link}"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: link to a missing anchor: {link}"


def test_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for command in (
        "make demo",
        "make test",
        "make install",
        "rerankq worker",
        "rerankq submit",
        "rerankq serve",
        "rerankq serve keygen",
        "RerankClient",
    ):
        assert command in text, command


def quickstart_script(redis_port: int, gateway_port: int, folder: Path) -> str:
    """README's "Run it yourself" blocks as one script, in order: shell blocks as written (the
    ports swapped for free ones), each python block saved under the name its first line gives
    and run as README says (``python <name>``)."""
    text = README.read_text()
    section = text[text.index("## Run it yourself") : text.index("## Where next")]
    lines = ["set -euo pipefail"]
    for lang, body in blocks(section):
        if lang == "python":
            name = body.splitlines()[0].lstrip("# ").strip()
            (folder / name).write_text(body)
            assert f"python {name}" in section
            lines.append(f"python {name}")
        else:
            lines.append(body.replace("6390", str(redis_port)).replace("8080", str(gateway_port)))
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_readme_quickstart_runs_as_written(tmp_path):
    from worker.embedded.redis_server import free_port

    redis_port, gateway_port = free_port(), free_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `rerankq` and `python` as an activated install would have them, running this checkout's code.
    for name, command in (("rerankq", f"{sys.executable} -m rerankq"), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "quickstart.sh"
    script.write_text(quickstart_script(redis_port, gateway_port, tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update({"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=480)  # a first start measures the backends
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["redis-cli", "-p", str(redis_port), "shutdown", "nosave"], capture_output=True)
    assert proc.returncode == 0, out
    assert re.search(r"^1 m\d score=0\.\d+ final=0\.\d+ \d:\w+$", out, re.M), out
    assert "served the window" in out
    assert "done: 1 jobs written to reranked.jsonl" in out
    assert "workers alive: 1 cpu" in out
    assert '"relevance_score"' in out
    assert (tmp_path / "reranked.jsonl").read_text().count('"id":"q1"') == 1


def test_the_candidate_and_option_tables_are_the_structs():
    from producer.reference import PAGE, render

    assert render(PAGE.read_text()) == PAGE.read_text(), "docs/concepts.md is stale: python -m producer.reference"


def test_the_command_line_page_names_every_command():
    from rerankq import COMMANDS

    page = (ROOT / "docs" / "command-line.md").read_text()
    missing = [name for name in COMMANDS if f"rerankq {name}" not in page]
    assert not missing, f"docs/command-line.md does not name: {missing}"


def test_the_readme_install_table_names_every_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    table = README.read_text().split("| who | what to install |", 1)[1].split("\n\n", 1)[0]
    missing = [name for name in extras if name != "dev" and f"rerankq[{name}" not in table]
    assert not missing, f"README's install table does not name the extras {missing}"
