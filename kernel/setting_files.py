"""Files a setting names (a calibration file, a keys file, the settings file), read as what
they claim to be: a regular file of bounded size.

A path is the operator's, and may be anything: ``/dev/zero`` read whole never ends (the
process grows until it is killed), a FIFO blocks its reader until a writer comes (a worker
that never starts and never says why), a directory or a 10 GB file is a mistake to say at
once. So the file is opened without blocking, checked with ``fstat`` on that descriptor (no
race with a rename), and read up to its bound: anything else is a ``ConfigError`` naming the
variable, the same wherever the file is read (a worker's start, ``rerankq config``, the
gateway, ``serve keygen``).
"""

from __future__ import annotations

import os
import stat

from kernel.errors import ConfigError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def read_regular_file(path: str, *, limit: int, variable: str) -> bytes:
    """The bytes of the regular file at ``path`` (symbolic links followed), at most ``limit``;
    any failure is a ``ConfigError`` naming ``variable``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(variable, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd)
        if not stat.S_ISREG(mode.st_mode):
            raise ConfigError(variable, f"{path} is not a regular file ({_kind(mode.st_mode)})")
        if mode.st_size > limit:
            raise ConfigError(variable, f"{path} is larger than {limit} bytes ({mode.st_size})")
        chunks, size = [], 0
        while size <= limit:  # the file may have grown since fstat: read one byte past the bound at most
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(variable, f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(variable, f"{path} is larger than {limit} bytes")
    return b"".join(chunks)
