"""A causal reranker's agreement with the library, kept so a second start skips the check.

Holding the engine's fp32 scores to ``CrossEncoder.predict`` on the probe windows runs the
library's own forward pass pair by pair: about two minutes for a 4-layer causal bench model
on a 2-core CPU, far more for a 28-layer one. Its verdict depends on exactly what an
``auto`` decision depends on, so it is kept beside the decisions (``export.export_root``)
under the same fingerprint rules (``autotune.fingerprint``: the weights, the device, the
CPU's flags, the thread count, the library versions, the shapes). A start whose fingerprint
matches takes the kept verdict; any difference checks again. Only an agreement is kept: a
model that disagrees is refused at every start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from worker.engine.autotune import SCHEMA, locked

log = structlog.get_logger("rerankq.engine")

AGREEMENT_FILE = "rerankq-agreement.json"
#: Verdicts kept per model (one per fingerprint: hosts or pools sharing a model directory).
MAX_VERDICTS = 8


class Verdict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An agreement the check reached, and whether prefix reuse held it too."""

    fingerprint: dict[str, Any]
    prefix_reuse: bool
    checked_at: float


class _File(msgspec.Struct, forbid_unknown_fields=True):
    schema: int
    verdicts: list[Verdict]


def _read(root: Path) -> list[Verdict]:
    try:
        kept = msgspec.json.decode((root / AGREEMENT_FILE).read_bytes(), type=_File)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return []  # none yet, or unreadable: check and write it anew
    return kept.verdicts if kept.schema == SCHEMA else []


def kept_verdict(root: Path, wanted: dict[str, Any]) -> Verdict | None:
    with locked(root):
        return next((v for v in _read(root) if v.fingerprint == wanted), None)


def keep_verdict(root: Path, wanted: dict[str, Any], *, prefix_reuse: bool) -> None:
    """Write the agreement (replacing one of the same fingerprint), the newest few kept; a
    directory that cannot be written costs the next start a check, not this one its model."""
    try:
        with locked(root):
            others = [v for v in _read(root) if v.fingerprint != wanted]
            verdicts = [*others, Verdict(wanted, prefix_reuse, time.time())][-MAX_VERDICTS:]
            path = root / AGREEMENT_FILE
            partial = path.with_name(path.name + f".{os.getpid()}.tmp")
            partial.write_bytes(msgspec.json.format(msgspec.json.encode(_File(SCHEMA, verdicts))))
            os.replace(partial, path)
    except OSError as exc:
        log.warning("agreement_not_kept", root=str(root), reason=str(exc))
