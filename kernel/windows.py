"""How a stream's candidates divide into windows: counted once, for both sides."""

from __future__ import annotations


def window_count(n_candidates: int, window_size: int) -> int:
    """Windows of ``window_size`` that hold ``n_candidates``, the last one short."""
    return -(-n_candidates // window_size)
