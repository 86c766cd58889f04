"""The cross-encoder engine behind the local provider.

Loads one model copy per process and scores (query, document) pairs close to the
machine's limit: one tokeniser call per request, pairs ordered by token length and
cut into batches by a padded-token budget (so a batch of short documents is wide
and a batch of long ones is narrow, and little of either is padding), inference
mode, and a reduced precision where the hardware runs it natively and a parity
probe at load shows it keeps the ranking fp32 gives (``worker.engine.forward``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.settings import Settings
from worker.engine.forward import ForwardEngine, configure_threads, shared
from worker.engine.loading import load_cross_encoder

__all__ = ["ScoringEngine", "configure_threads", "shared_engine"]


class ScoringEngine(ForwardEngine):
    """Scores pairs with the model's configured activation applied (so the declared scale holds)."""

    def __init__(self, model: Any, *, settings: Settings, precision: str | None = None,
                 token_budget: int | None = None, verify_parity: bool = True) -> None:
        self.cross_encoder = model
        module = model[0]
        self.network = module.model  # the transformers model under the CrossEncoder
        self.tokenizer = module.processor
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.activation = getattr(model, "activation_fn", None)
        self.network.eval()
        super().__init__(device=model.device, settings=settings, precision=precision, token_budget=token_budget,
                         verify_parity=verify_parity)

    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> dict[str, list[list[int]]]:
        """One tokeniser call for every pair (the fast tokeniser parallelises it), unpadded."""
        encoded = self.tokenizer(
            [q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first",
            max_length=self.max_length, padding=False, return_attention_mask=False,
        )
        return dict(encoded)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        if not pairs:
            return []
        encoded = self.tokenize(pairs)
        scores = [0.0] * len(pairs)
        with torch.inference_mode(), self._autocast():
            for batch in self.batches(encoded):
                tensors = {k: v.to(self.device, non_blocking=True) for k, v in batch.tensors.items()}
                logits = self.network(**tensors).logits.float()
                if self.activation is not None:
                    logits = self.activation(logits)
                # One logit per pair; a two-class head's last column is "relevant".
                values = logits[:, -1].cpu().tolist()
                for i, value in zip(batch.indices, values):
                    scores[i] = float(value)
                self._count(batch)
        return scores


def shared_engine(model_name: str, *, device: str, settings: Settings) -> ScoringEngine:
    """The process's cross-encoder engine for this model; chain members naming the same model share it."""
    return shared("cross-encoder", model_name, device=device, settings=settings,
                  build=lambda: ScoringEngine(load_cross_encoder(model_name, device=device), settings=settings))
