"""The output file: one job at a time, whole lines only, and what an earlier run left in it.

JSONL holds one line per job (its id, stream, query, and every field of every row, kind and
reason included); TREC holds one line per row, ``qid Q0 docid rank score tag``. Each job's
bytes go out in one unbuffered write as it completes, so a run stopped at any point leaves
whole jobs, plus at worst one torn last line. Reading the file back at start says which jobs
are done: a torn last line is cut off, and in TREC the last query's lines are cut off too (a
row count is not in the format, so they are written again), which costs a read of a
committed stream, never a provider call.

An existing file is resumed only if it is this command's output: every whole line a job line
of its own (JSONL: an object with ``id``, ``stream`` and ``rows``; TREC: ``qid Q0 docid rank
score tag`` with integer rank and score and this run's ``--tag``), and a torn last line that
begins like one. Anything else (a file with no newline at all, the input itself, a run of
another system, a symbolic link to an unrelated file) is refused before a byte of it changes;
so is a dangling symbolic link, or anything but a regular file.

The TREC score column is ``rows - rank + 1``: ``trec_eval`` orders a query's lines by score,
and rerankq's order (windows in order, each window by final score) is not always the order of
final scores across windows. The JSONL rows carry the scores.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from kernel.wire import Page
from rerankq.render import row_json

FORMATS = ("jsonl", "trec")


class _JobLine(msgspec.Struct):
    """What a JSONL line of ours has, whatever else it carries."""

    id: str
    stream: str
    rows: list[Any]


_decode_job_line = msgspec.json.Decoder(_JobLine).decode
#: How every JSONL line of ours begins (the job's id comes first).
_JSONL_START = b'{"id"'
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
        """Make the file end on a whole job and yield the ids of the jobs it holds.

        Raises ``OutputError`` (before anything changes) when the file is not this command's.
        """
        self._check_path()
        if not self.path.exists():
            return
        done: list[str] = []
        try:
            with open(self.path, "r+b") as fh:
                data_end = _last_line_end(fh)
                fh.seek(0)
                keep = 0  # the offset up to which the file stays
                last_group: tuple[str, int] | None = None  # TREC: (qid, offset of its first line)
                for number, line in enumerate(iter(fh.readline, b""), 1):
                    if fh.tell() > data_end:
                        self._check_torn(line, whole_lines=number > 1)
                        break
                    if self.fmt == "jsonl":
                        try:
                            done.append(_decode_job_line(line).id)
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            raise self._foreign(number, "is not a job line of rerankq submit's JSONL output") from None
                        keep = fh.tell()
                        continue
                    qid = self._trec_line(number, line)
                    if last_group is None or last_group[0] != qid:
                        if last_group is not None:
                            done.append(last_group[0])
                        last_group = (qid, fh.tell() - len(line))
                if self.fmt == "trec":
                    keep = last_group[1] if last_group is not None else 0
                fh.truncate(keep)
        except OSError as exc:
            raise OutputError(f"--out {self.path}: {exc.strerror or exc}") from None
        yield from done

    def _check_path(self) -> None:
        if self.path.is_symlink() and not self.path.exists():
            raise OutputError(
                f"--out {self.path} is a symbolic link to {os.readlink(self.path)}, which does not "
                "exist; point --out at a file"
            )
        if self.path.exists() and not self.path.is_file():
            raise OutputError(f"--out {self.path} is not a regular file; point --out at a file")

    def _foreign(self, number: int, what: str) -> OutputError:
        return OutputError(
            f"{self.path}:{number} {what}: --out holds a file this command did not write, and it "
            "is left as it is; choose another --out"
        )

    def _trec_line(self, number: int, line: bytes) -> str:
        parts = line.split()
        if len(parts) != 6 or parts[1] != b"Q0" or not (parts[3].isdigit() and parts[4].isdigit()):
            raise self._foreign(number, "is not a line of rerankq submit's TREC run (qid Q0 docid rank score tag)")
        if parts[5].decode(errors="replace") != self.tag:
            raise self._foreign(
                number,
                f"ends in run tag {parts[5].decode(errors='replace')[:40]!r}, not "
                f"--tag {self.tag!r} (a run this command wrote with another --tag resumes "
                "with that --tag)",
            )
        return parts[0].decode()

    def _check_torn(self, tail: bytes, *, whole_lines: bool) -> None:
        """The file's last bytes after its last newline: a write this command began, or refused.
        With no whole line before them there is less to go on, so they must say more."""
        if self.fmt == "jsonl":
            ours = tail.startswith(_JSONL_START) or (whole_lines and _JSONL_START.startswith(tail))
        else:
            parts = tail.split()
            ending = tail[-1:].isspace()
            fields = [(p, i == len(parts) - 1 and not ending) for i, p in enumerate(parts)]
            ours = (
                len(parts) <= 6
                and (whole_lines or len(parts) >= 3)
                and all(
                    _trec_field_ok(index, value, partial, self.tag.encode())
                    for index, (value, partial) in enumerate(fields)
                )
            )
        if not ours:
            where = "its last line" if whole_lines else "it has no complete line, and what it holds"
            raise OutputError(
                f"{self.path}: {where} does not begin like a line of rerankq submit's "
                f"{self.fmt.upper()} output: --out holds a file this command did not write, and it "
                "is left as it is; choose another --out"
            )

    def open(self) -> Output:
        self._check_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise OutputError(f"--out {self.path}: {exc.strerror or exc}") from None
        return self

    def write_job(self, job_id: str, query: str, page: Page, extra: dict[str, Any]) -> int:
        """Append one completed job; returns the rows written."""
        if self.fmt == "jsonl":
            record = {
                "id": job_id,
                "stream": page.stream_id,
                "query": query,
                **extra,
                "rows": [row_json(row) for row in page.rows],
            }
            data = _encode(record) + b"\n"
        else:
            n = len(page.rows)
            data = "".join(
                f"{job_id} Q0 {row.id} {row.rank} {n - row.rank + 1} {self.tag}\n" for row in page.rows
            ).encode()
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


def _trec_field_ok(index: int, value: bytes, partial: bool, tag: bytes) -> bool:
    """Whether field ``index`` of a TREC line of ours can be ``value`` (or begin with it, if ``partial``)."""
    if index == 1:
        return b"Q0".startswith(value) if partial else value == b"Q0"
    if index in (3, 4):
        return value.isdigit()
    if index == 5:
        return tag.startswith(value) if partial else value == tag
    return True


def _last_line_end(fh: BinaryIO) -> int:
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
