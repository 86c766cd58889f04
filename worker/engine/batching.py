"""Cutting a request's pairs into forward batches by padded tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Padding a batch may carry, as a fraction of its padded tokens. Sorting alone is not
#: enough: a 25-pair window whose documents run from 20 to 500 tokens, cut only by a
#: token budget, pads its first batch to 500 for pairs of 150. A token row costs the same
#: GEMM work whether it is padding or not, and narrow batches cost little (the GEMM's
#: rows are batch * length tokens), so a batch closes once more would be mostly padding.
MAX_PADDING = 0.10


def plan_batches(lengths: Sequence[int], token_budget: int, *, max_padding: float = MAX_PADDING) -> list[list[int]]:
    """Indices grouped into batches, longest first, each at most ``token_budget`` padded
    tokens and at most ``max_padding`` of them padding.

    Padded tokens of a batch are ``len(batch) * max(length in batch)``; sorting by length
    keeps the max close to every member's length. A single pair longer than the budget
    still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        if current:
            width = lengths[current[0]]
            padded = (len(current) + 1) * width
            if padded > token_budget or (real + lengths[i]) < (1.0 - max_padding) * padded:
                batches.append(current)
                current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        batches.append(current)
    return batches


def default_token_budget(device_type: str) -> int:
    """Padded tokens per forward batch: a GPU needs wide batches to fill its cores; a CPU
    reaches its GEMM rate at a few thousand token rows and gains nothing from more."""
    return 65536 if device_type == "cuda" else 8192


@dataclass(frozen=True)
class Batch:
    indices: list[int]
    tensors: dict[str, Any]

    @property
    def padded_tokens(self) -> int:
        shape = self.tensors["input_ids"].shape
        return int(shape[0] * shape[1])


def pad_batches(
    encoded: dict[str, list[list[int]]], token_budget: int, *, pad_id: int, left: bool = False, shared_width: int = 0
) -> list[Batch]:
    """Unpadded token ids (one row per pair or text) cut by ``plan_batches`` and padded per batch.

    Works for pairs (with ``token_type_ids``) and single texts alike: every engine batches
    the same way, whatever its model does with the rows. ``left`` pads in front, as a causal
    LM needs so that every row's last position is a real token. ``shared_width`` is a prefix
    every row reads (a cached one, expanded per row): it counts against the budget, as its
    keys and values are held per row.
    """
    import torch

    ids = encoded["input_ids"]
    types = encoded.get("token_type_ids")
    out: list[Batch] = []
    for indices in plan_batches([len(x) + shared_width for x in ids], token_budget):
        width = len(ids[indices[0]])
        input_ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        token_types = torch.zeros((len(indices), width), dtype=torch.long) if types is not None else None
        for row, i in enumerate(indices):
            n = len(ids[i])
            span = slice(width - n, width) if left else slice(0, n)
            input_ids[row, span] = torch.tensor(ids[i], dtype=torch.long)
            mask[row, span] = 1
            if token_types is not None and types is not None:
                token_types[row, span] = torch.tensor(types[i], dtype=torch.long)
        tensors = {"input_ids": input_ids, "attention_mask": mask}
        if token_types is not None:
            tensors["token_type_ids"] = token_types
        out.append(Batch(indices=indices, tensors=tensors))
    return out
