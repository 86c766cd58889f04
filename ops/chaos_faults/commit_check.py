"""``--break commit-check``: the store script without its "already committed?" checks.

``store.lua`` refuses to begin or commit a window whose result exists (``HEXISTS results``
in ``begin`` and in ``commit``). With both checks gone a duplicate delivery scores a
committed window again and overwrites its result, which the run must catch. The workers
get this script through ``overlay/sitecustomize.py``; no production code knows of it.
"""

from __future__ import annotations

import re

# Exactly the two checks: `begin` returns {-1}, `commit` returns 0.
_ALREADY_COMMITTED = re.compile(
    r"^[ \t]*if redis\.call\('HEXISTS', results_key, window\) == 1 then return (\{-1\}|0) end\n", re.MULTILINE
)
MARKER = "rerankq-chaos: store.lua without its already-committed checks"


def without_commit_checks(script: str) -> str:
    """The script with both checks removed; raises if it does not find exactly those two."""
    patched, found = _ALREADY_COMMITTED.subn("", script)
    if found != 2:
        raise RuntimeError(f"expected the two HEXISTS results checks (begin, commit) in store.lua, found {found}")
    return patched


def patch_store() -> None:
    """Replace the script text ``kernel.store`` registers, before any Store is built."""
    import kernel.store

    kernel.store._SCRIPT = without_commit_checks(kernel.store._SCRIPT)
