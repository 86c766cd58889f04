"""``python -m worker`` (and the ``rerankq-worker`` script): an alias of ``rerankq worker``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from worker.cli import main as rerankq

    return rerankq(["worker", *(sys.argv[1:] if argv is None else argv)], prog_name="rerankq")


if __name__ == "__main__":
    raise SystemExit(main())
