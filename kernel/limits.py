"""The bounds both sides apply to a stream: a producer checks them at open, a worker relies on them.

One module, so a pipeline and a worker cannot disagree on what a passage or an embedding may be.
"""

from __future__ import annotations

#: Passages per document at most: each is a pair scored, so this bounds a document's cost.
MAX_PASSAGES = 128
#: The fewest tokens a passage may hold: shorter ones say too little to be scored.
MIN_PASSAGE_TOKENS = 16
#: The passage length a chain without an in-process member cuts at (a remote member does not
#: say what it reads); also what the per-window token ceiling counts when none is given.
REMOTE_PASSAGE_TOKENS = 512
#: A passage cut at a document's structure takes its neighbours in while it holds fewer tokens
#: than this part of a passage: 1.0, as many as fit (the best of 0, 0.25, 0.5 and 1 on the long
#: collection: ops/bench/passage_quality.py).
PASSAGE_FILL_SHARE = 1.0
#: The widest embedding a candidate may carry (and a worker keeps).
MAX_EMBEDDING_DIMS = 8192
#: Stages a cascade may have, its first included: each later stage re-reads the one before it, so
#: a window number stays under this many times the stream's candidates (``kernel.windows``).
MAX_STAGES = 4
