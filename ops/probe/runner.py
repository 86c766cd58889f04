"""What the probe modules share: a probe's failure, the check that raises it, and the loop that
runs each probe in turn and prints its one line."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


class ProbeFailed(Exception):
    pass


def check(condition: bool, why: str) -> None:
    if not condition:
        raise ProbeFailed(why)


def run_each(
    probes: Iterable[tuple[str, Callable[[T], None]]],
    subject: T,
    only: list[str] | None = None,
    still_up: Callable[[T], str | None] | None = None,
) -> int:
    """Run each probe (those in ``only``, when given) on ``subject``, printing
    ``probe <name>: ok`` or ``probe <name>: FAIL <why>``; ``still_up`` says why the subject
    is down after a probe, or None. The number of probes that failed."""
    failed = 0
    for name, probe in probes:
        if only and name not in only:
            continue
        try:
            probe(subject)
            down = still_up(subject) if still_up is not None else None
            check(down is None, down or "")
            print(f"probe {name}: ok", flush=True)
        except ProbeFailed as why:
            failed += 1
            print(f"probe {name}: FAIL {why}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes is a failure, reported
            failed += 1
            print(f"probe {name}: FAIL {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    return failed
