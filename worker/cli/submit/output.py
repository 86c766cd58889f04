"""The output file: one job at a time, whole lines only, and what an earlier run left in it.

JSONL holds one line per job (its id, stream, query, and every field of every row, kind and
reason included); TREC holds one line per row, ``qid Q0 docid rank score tag``. Each job's
bytes go out in one unbuffered write as it completes, so a run stopped at any point leaves
whole jobs, plus at worst one torn last line. Reading the file back at start says which jobs
are done: a torn last line is cut off, and in TREC the last query's lines are cut off too (a
row count is not in the format, so they are written again), which costs a read of a
committed stream, never a provider call.

The TREC score column is ``rows - rank + 1``: ``trec_eval`` orders a query's lines by score,
and rerankq's order (windows in order, each window by final score) is not always the order of
final scores across windows. The JSONL rows carry the scores.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from producer.wire import Page
from worker.cli.render import row_json

FORMATS = ("jsonl", "trec")


class _JobId(msgspec.Struct):
    id: str


_decode_job_id = msgspec.json.Decoder(_JobId).decode
_encode = msgspec.json.Encoder().encode


class OutputError(Exception):
    """The output file is not one this command wrote."""


class Output:
    def __init__(self, path: Path, fmt: str, *, tag: str = "rerankq") -> None:
        if fmt not in FORMATS:
            raise ValueError(fmt)
        self.path = path
        self.fmt = fmt
        self.tag = tag
        self._fd: int | None = None

    def resume(self) -> Iterator[str]:
        """Make the file end on a whole job and yield the ids of the jobs it holds."""
        if not self.path.exists():
            return
        with open(self.path, "r+b") as fh:
            data_end = _last_line_end(fh)
            fh.seek(0)
            keep = 0  # the offset up to which the file stays
            last_group: tuple[str, int] | None = None  # TREC: (qid, offset of its first line)
            for number, line in enumerate(iter(fh.readline, b""), 1):
                if fh.tell() > data_end:
                    break  # the torn last line
                if self.fmt == "jsonl":
                    try:
                        yield _decode_job_id(line).id
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        raise OutputError(f"{self.path}:{number} is not a job line of rerankq submit's JSONL "
                                          "output; choose another --out") from None
                    keep = fh.tell()
                    continue
                parts = line.split()
                if len(parts) != 6:
                    raise OutputError(f"{self.path}:{number} is not a TREC run line; choose another --out")
                qid = parts[0].decode()
                if last_group is None or last_group[0] != qid:
                    if last_group is not None:
                        yield last_group[0]
                    last_group = (qid, fh.tell() - len(line))
            if self.fmt == "trec":
                keep = last_group[1] if last_group is not None else 0
            fh.truncate(keep)

    def open(self) -> Output:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self

    def write_job(self, job_id: str, query: str, page: Page, extra: dict[str, Any]) -> int:
        """Append one completed job; returns the rows written."""
        if self.fmt == "jsonl":
            record = {"id": job_id, "stream": page.stream_id, "query": query, **extra,
                      "rows": [row_json(row) for row in page.rows]}
            data = _encode(record) + b"\n"
        else:
            n = len(page.rows)
            data = "".join(f"{job_id} Q0 {row.id} {row.rank} {n - row.rank + 1} {self.tag}\n"
                           for row in page.rows).encode()
        self._write_all(data)
        return len(page.rows)

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _last_line_end(fh: Any) -> int:
    """The offset just past the file's last newline (0 when it has none)."""
    size = fh.seek(0, os.SEEK_END)
    position = size
    while position > 0:
        step = min(65536, position)
        fh.seek(position - step)
        chunk = fh.read(step)
        found = chunk.rfind(b"\n")
        if found >= 0:
            return position - step + found + 1
        position -= step
    return 0
