"""Whether a worker can score at all, decided before it takes a window from a device queue.

A worker whose chain has no member that scores (anything but ``rrf``) would commit its share
of every tenant's windows in fusion order, or as failed, and look ready doing it. It refuses
to start instead, in one line naming the fix, unless passthrough is what was asked for: a
chain configured with ``rrf`` members only, or ``RERANKQ_SERVE_WITHOUT_SCORING=true``.
"""

from __future__ import annotations

import subprocess
import sys

from kernel.settings import Settings, override, read_settings
from worker.providers.base import ProviderStartError

INSTALL_WORKER = "pip install 'rerankq[worker]'"
#: What the check's own process writes before its verdict (members log on stdout as well).
VERDICT = "rerankq-readiness: "


def passthrough_on_purpose(settings: Settings) -> bool:
    """Whether this worker was asked to serve without a scoring member (the default chain never is)."""
    configured = settings.chain.members
    rrf_only = bool(configured) and all(m.provider == "rrf" for m in configured)
    return rrf_only or settings.worker.serve_without_scoring


def cause(member: str, exc: ProviderStartError) -> str:
    """One member's failed start in words, with the fix when it is a missing install."""
    detail = f"{exc.reason}: {exc.detail}" if exc.detail else exc.reason
    if "No module named 'torch'" in exc.detail:
        return f"{member} needs torch, which is not installed ({INSTALL_WORKER})"
    return f"{member} cannot start ({detail})"


def no_scoring_problem(settings: Settings) -> str | None:
    """Start the chain's scoring members here, in order, until one is up; why none is, or None.

    Members are built as the worker builds them, without the pair cache or the breaker, and
    closed again: this only answers whether the worker could score.
    """
    from worker.chain import Chain

    chain = Chain.from_settings(settings, breaker=None)
    causes: list[str] = []
    try:
        for member in chain.members:
            if member.settings.provider == "rrf":
                continue
            try:
                member.provider()
            except ProviderStartError as exc:
                causes.append(cause(member.label, exc))
                continue
            return None
    finally:
        chain.close()
    return explain(causes)


def explain(causes: list[str]) -> str:
    if not causes:
        return "the chain has no member that scores (set RERANKQ_SERVE_WITHOUT_SCORING=true if fusion order is meant)"
    return (
        "no chain member that scores can start: "
        + "; ".join(causes)
        + " (or set RERANKQ_SERVE_WITHOUT_SCORING=true to serve fusion order on purpose)"
    )


def problem_in_subprocess(settings: Settings) -> str | None:
    """``no_scoring_problem`` in a process of its own, for a prefork worker: a parent that has
    run torch must not fork the pool (its thread pools do not survive a fork), and a model
    loaded here would stay in the parent's memory beside each child's copy."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker.readiness",
            settings.worker.device,
            str(settings.worker.torch_threads or 0),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode == 0:
        return None
    verdicts = [line[len(VERDICT) :] for line in done.stdout.splitlines() if line.startswith(VERDICT)]
    if verdicts:
        return verdicts[-1]
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"the check whether a chain member can score failed: {last}"


def main(argv: list[str]) -> int:
    from worker.logs import configure_logging

    configure_logging(level="CRITICAL")  # the worker's own processes log each member's start
    device, threads = argv
    settings = read_settings().settings
    settings = override(settings, device=device, **({"torch_threads": int(threads)} if int(threads) else {}))
    problem = no_scoring_problem(settings)
    if problem is None:
        return 0
    sys.stdout.write(VERDICT + problem + "\n")
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
