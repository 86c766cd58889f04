"""Prefix reuse for causal-LM rerankers: the tokens every pair of a window shares, computed once.

A causal reranker reads ``prompt + instruction + query + document + suffix``; within a
window only the document and what follows it differ. Causal attention means a position's
keys and values depend on the tokens before it and nothing after, so the shared prefix's
key/value cache, computed once for a batch of one, is exactly what each pair's own pass
would compute for those positions. Each pair then runs only its own tokens on top of the
prefix cache (expanded to the batch) and the model gives the last position's logits as usual.

The prefix is the longest common prefix of the pairs' token ids, so it needs no knowledge of
the template: whatever the tokeniser made alike is shared, whatever it merged differently
is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

#: Below this many shared tokens a prefix pass saves less than it costs (one more forward call).
MIN_PREFIX_TOKENS = 8


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all rows share, leaving every row at least one token of its own
    (the last position must be the row's own, as it is the one scored)."""
    if not rows:
        return 0
    first = rows[0]
    limit = min(len(r) for r in rows) - 1
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


class PrefixRunner:
    """Runs a causal LM over (prefix, suffixes): the prefix once, each suffix batch on its cache.

    Only the torch backend keeps a cache between calls, and only a cache whose layers are
    plain full-attention ones (``DynamicLayer``) can be expanded per document; anything else
    (sliding windows, quantised caches) says so with ``supported`` and is scored the plain way.
    """

    def __init__(self, network: Any) -> None:
        from transformers.cache_utils import DynamicCache, DynamicLayer

        self.network = network
        parameters = inspect.signature(network.forward).parameters
        # transformers renamed past_key_values to cache; pass whichever this model's forward names.
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.supported = (
            self.cache_argument in parameters and "position_ids" in parameters and "logits_to_keep" in parameters
        )
        self._dynamic_cache, self._dynamic_layer = DynamicCache, DynamicLayer

    def prefix_cache(self, prefix: Sequence[int], device: Any) -> list[tuple[Any, Any]] | None:
        """The prefix's keys and values per layer (batch of one), or None where this model's
        cache cannot be expanded per document."""
        import torch

        input_ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
        out = self.network(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=True, logits_to_keep=1
        )
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not self._dynamic_layer for layer in layers):
            return None
        return [(layer.keys, layer.values) for layer in layers]

    def suffix_logits(self, cached: list[tuple[Any, Any]], input_ids: Any, attention_mask: Any) -> Any:
        """Last-position logits, (batch, 1, vocab), of left-padded suffixes read after the prefix."""
        import torch

        batch = input_ids.shape[0]
        prefix_length = cached[0][0].shape[-2]
        cache = self._dynamic_cache(config=self.network.config)
        for index, (keys, values) in enumerate(cached):
            # update() concatenates onto an empty layer, so each batch gets its own copy.
            cache.update(keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1), index)
        mask = torch.cat([attention_mask.new_ones((batch, prefix_length)), attention_mask], dim=1)
        # Left padding sits between the prefix and a row's own tokens: the positions of those
        # tokens continue the prefix's, as they would without the padding.
        positions = prefix_length + (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        out = self.network(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_argument: cache},
        )
        return out.logits
