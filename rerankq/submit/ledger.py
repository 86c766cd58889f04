"""Which job ids this run has read, and which the output already holds, kept on disk.

Both sets grow with the input, so they live in a scratch SQLite file rather than in memory:
a run over a million jobs keeps the same footprint as one over a thousand. A job id read
twice is a bad line (its output would hold it twice); a job the output holds is not run again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path


class Ledger:
    def __init__(self, scratch: Path) -> None:
        self.db = sqlite3.connect(scratch / "ledger.sqlite")
        self.db.executescript(
            "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
            "CREATE TABLE seen (id TEXT PRIMARY KEY, place TEXT) WITHOUT ROWID;"
            "CREATE TABLE done (id TEXT PRIMARY KEY) WITHOUT ROWID;"
        )
        self.done_count = 0

    def add_done(self, ids: Iterable[str]) -> None:
        """Jobs the output already holds (from an earlier run of the same command)."""
        self.db.executemany("INSERT OR IGNORE INTO done VALUES (?)", ((i,) for i in ids))
        self.done_count = self.db.execute("SELECT count(*) FROM done").fetchone()[0]

    def is_done(self, job_id: str) -> bool:
        if not self.done_count:
            return False
        return self.db.execute("SELECT 1 FROM done WHERE id = ?", (job_id,)).fetchone() is not None

    def first_seen(self, job_id: str, place: str) -> str | None:
        """Records ``job_id`` as read at ``place``; returns where it was read before, if it was."""
        try:
            self.db.execute("INSERT INTO seen VALUES (?, ?)", (job_id, place))
        except sqlite3.IntegrityError:
            earlier: str = self.db.execute("SELECT place FROM seen WHERE id = ?", (job_id,)).fetchone()[0]
            return earlier
        return None

    def close(self) -> None:
        self.db.close()
