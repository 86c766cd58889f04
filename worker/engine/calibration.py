"""Real windows to calibrate static int8 on, and to hold a backend to parity with.

``RERANKQ_RERANKER_CALIBRATION`` names a JSON-lines file, one window a line:
``{"query": "...", "documents": ["...", ...]}`` (what a stream's windows look like, e.g.
exported from a day of traffic). Three windows in four calibrate the quantiser; every
fourth is held out, and the parity probe ranks it with torch fp32 and with the candidate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import msgspec

Window = list[tuple[str, str]]


class CalibrationError(Exception):
    """The calibration file is missing or not windows."""


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    documents: list[str]


@dataclass(frozen=True)
class Calibration:
    calibrate: list[Window]
    held_out: list[Window]
    digest: str


def read_calibration(path: str) -> Calibration:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CalibrationError(f"cannot read {path}: {exc.strerror or exc}") from None
    windows: list[Window] = []
    decode = msgspec.json.Decoder(_Line).decode
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = decode(line)
        except msgspec.DecodeError as exc:
            raise CalibrationError(f"{path} line {number}: {exc}") from None
        if len(item.documents) < 2:
            raise CalibrationError(f"{path} line {number}: a window needs at least 2 documents to rank")
        windows.append([(item.query, d) for d in item.documents])
    if len(windows) < 2:
        raise CalibrationError(f"{path}: needs at least 2 windows (one is held out to check parity)")
    held_out = windows[3::4] or windows[-1:]
    calibrate = [w for i, w in enumerate(windows) if not any(w is h for h in held_out)]
    return Calibration(calibrate=calibrate, held_out=held_out, digest=hashlib.blake2b(raw, digest_size=12).hexdigest())
