"""What a stream gets for an option nobody gave, written once: ``StreamSpec``'s field defaults,
the streams settings' defaults and the options' documentation all read these."""

from __future__ import annotations

#: Code points of assembled text sent to a provider (``RERANKQ_DOCUMENT_BUDGET``'s default).
DOCUMENT_BUDGET = 2048
#: Seconds every key of a stream lives (``RERANKQ_STREAM_TTL_S``'s default).
STREAM_TTL_S = 3600
#: k of ``passage_aggregate="sum_top_k"``.
PASSAGE_TOP_K = 3
#: Passages a passages stream cuts from one document at most (``kernel.limits.MAX_PASSAGES`` is
#: the most a caller may ask for).
MAX_PASSAGES = 32
