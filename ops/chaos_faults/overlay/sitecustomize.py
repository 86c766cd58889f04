"""Loaded at interpreter start by the workers of ``ops/chaos.py --break commit-check`` only
(this folder is put first on their PYTHONPATH): patch the store script before any Store
exists. A patch that cannot apply ends the process, so the breakage is never silently off."""

import os
import sys

try:
    from ops.chaos_faults.commit_check import MARKER, patch_store

    patch_store()
    sys.stderr.write(MARKER + "\n")
except Exception as exc:  # noqa: BLE001 - site swallows errors here; make this one fatal
    sys.stderr.write(f"rerankq-chaos: cannot apply --break commit-check: {exc}\n")
    sys.stderr.flush()
    os._exit(70)
