"""An export's manifest (``<file>.rerankq.json``): what the export was made from, and a digest of each file.

The export is reused only while it is what was made: each file's size and sha256 are recorded
when it is made, and checked before it is reused. Reading every byte at every start would
cost a start the time of hashing the model again (``docs/performance.md`` gives the figures),
so the manifest also keeps each file's *seal*, its inode, size, mtime and ctime when it was
last hashed and found whole. A later start that finds the same seal reads no byte. That
is enough because the kernel sets a file's ctime to the current time on every write to it,
and on every ``utime`` that restores its mtime, and nothing lets a process set it back:
overwritten bytes of the same size under the old mtime still move the ctime. A seal is only
taken of a file whose ctime is older than ``SEAL_AGE_NS`` (file times come from a coarse
clock, so a write in the same tick as the hash would keep its ctime); a younger file is
hashed again at the next start, which seals it.

A file whose digest does not match (overwritten, cut short, missing) makes the export be made
again (``export.cached``); the manifest protects against damage, not against someone who may
write the model's directory, who could rewrite the manifest too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat as stat_module
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

log = structlog.get_logger("rerankq.export")

#: How old a file's last change must be before its seal is trusted: past a local file system's
#: timestamp tick (a jiffy on Linux; FAT's 2 s tick is not covered, nor a clock set back).
SEAL_AGE_NS = 2_000_000_000
#: A manifest lists a few files; one far larger is not ours.
MAX_MANIFEST_BYTES = 1 << 20
_CHUNK = 1 << 20


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".rerankq.json")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as file:
        while n := file.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def _seal(stat: os.stat_result) -> list[int]:
    return [stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


class _Recorded(msgspec.Struct, forbid_unknown_fields=True):
    size: int
    sha256: str


class _Kept(msgspec.Struct, forbid_unknown_fields=True):
    made_from: dict[str, Any]
    files: dict[str, _Recorded]
    seals: dict[str, Any] = {}


def _record_ok(record: _Recorded) -> bool:
    return record.size >= 0 and re.fullmatch(r"[0-9a-f]{64}", record.sha256) is not None


def _plain_name(name: str) -> bool:
    """A file beside the export, named as ``make`` names its files: no directory, no way out."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def _seal_ok(seal: Any) -> bool:
    return isinstance(seal, list) and len(seal) == 4 and all(type(v) is int for v in seal)


def _bounded_read(path: Path) -> bytes:
    """The manifest's bytes: a regular file of at most ``MAX_MANIFEST_BYTES`` (a FIFO or a
    device where the manifest belongs is refused, not read until memory runs out or forever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb", buffering=0) as file:
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = file.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise OSError(f"{path} is over {MAX_MANIFEST_BYTES} bytes")
    return data


@dataclass
class Manifest:
    #: What the export was made from (weights, tool versions, options): compared as a whole.
    made_from: dict[str, Any]
    #: Each file by name: its size and sha256 when made.
    files: dict[str, dict[str, Any]]
    #: Each file's seal when it was last hashed and found whole (absent: hash it at the next start).
    seals: dict[str, list[int]]

    @classmethod
    def read(cls, path: Path) -> Manifest | None:
        """The manifest kept for the export at ``path``; None when there is none this version can
        read: an older rerankq's (it recorded no digests), an unreadable file, or one that is not
        what rerankq writes (a file entry that is not a plain name with a size and a sha256: a
        name outside the export's directory is never read). A malformed seal is dropped: the
        file is hashed again."""
        try:
            kept = msgspec.json.decode(_bounded_read(manifest_path(path)), type=_Kept)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        if not kept.files or not all(_plain_name(n) and _record_ok(r) for n, r in kept.files.items()):
            return None
        files = {name: {"size": r.size, "sha256": r.sha256} for name, r in kept.files.items()}
        seals = {name: seal for name, seal in kept.seals.items() if name in files and _seal_ok(seal)}
        return cls(kept.made_from, files, seals)

    @classmethod
    def of_files(cls, made_from: dict[str, Any], files: Sequence[Path]) -> Manifest:
        """The manifest of files just made: each one hashed (they are in the page cache)."""
        return cls(made_from, {f.name: {"size": f.stat().st_size, "sha256": sha256_of(f)} for f in files}, {})

    def write(self, path: Path) -> None:
        """Beside ``path``, atomically (a reader sees the old manifest or this one)."""
        target = manifest_path(path)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        body = {"made_from": self.made_from, "files": self.files, "seals": self.seals}
        partial.write_text(json.dumps(body, sort_keys=True, indent=1))
        os.replace(partial, target)

    def damage(self, path: Path) -> str | None:
        """Why the files of the export at ``path`` are not the ones this manifest recorded, or
        None when they are. A file hashed here and old enough is sealed, and the manifest kept
        with its seal (where the directory is read-only, it is hashed again next start)."""
        hashed, resealed, started = 0, False, time.perf_counter()
        for name, recorded in sorted(self.files.items()):
            file = path.parent / name
            try:
                stat = file.stat()
            except OSError:
                return f"{name} is missing"
            if stat.st_size != recorded.get("size"):
                return f"{name} is {stat.st_size} bytes, {recorded.get('size')} when made"
            if self.seals.get(name) == _seal(stat):
                continue  # not written since it was hashed and found whole
            if sha256_of(file) != recorded.get("sha256"):
                return f"{name}'s sha256 is not the one recorded when it was made"
            hashed += stat.st_size
            # Sealed only if nothing wrote it while it was read, and its last change is past a tick.
            after = file.stat()
            if _seal(after) == _seal(stat) and time.time_ns() - after.st_ctime_ns >= SEAL_AGE_NS:
                self.seals[name], resealed = _seal(after), True
        if hashed:
            log.info(
                "export_hashed",
                path=str(path),
                mb=round(hashed / 2**20, 1),
                seconds=round(time.perf_counter() - started, 3),
                sealed=resealed,
            )
        if resealed:
            with contextlib.suppress(OSError):
                self.write(path)
        return None
