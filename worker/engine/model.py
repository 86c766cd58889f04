"""The scoring engine behind the local provider.

Loads one model copy per process and scores (query, document) pairs close to the
machine's limit: one tokeniser call per request, pairs ordered by token length and
cut into batches by a padded-token budget (so a batch of short documents is wide
and a batch of long ones is narrow, and little of either is padding), inference
mode, and a reduced precision where the hardware runs it natively and a parity
probe at load shows it keeps the ranking fp32 gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from producer.settings import Settings
from worker.engine.batching import Batch, default_token_budget, plan_batches
from worker.engine.loading import load_cross_encoder
from worker.engine.parity import MIN_SPEARMAN, spearman
from worker.engine.precision import probe_pairs, resolve_precision

log = structlog.get_logger("rerankq.engine")


class ScoringEngine:
    """Scores pairs with the model's configured activation applied (so the declared scale holds)."""

    def __init__(self, model: Any, *, settings: Settings, precision: str | None = None,
                 token_budget: int | None = None, verify_parity: bool = True) -> None:
        import torch

        self.cross_encoder = model
        self.settings = settings
        module = model[0]
        self.network = module.model  # the transformers model under the CrossEncoder
        self.tokenizer = module.processor
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.activation = getattr(model, "activation_fn", None)
        self.device = torch.device(model.device)
        self.token_budget = token_budget or settings.token_budget or default_token_budget(self.device.type)
        self.padded_tokens = 0  # executed tokens, for the benchmark's FLOP count
        self.real_tokens = 0
        #: Told of each forward batch: (real tokens, padded tokens); the worker's metrics set it.
        self.on_batch: Callable[[int, int], None] | None = None
        self.probe_spearman: float | None = None
        self.network.eval()
        requested = precision or settings.precision
        candidate = resolve_precision(requested, self.device.type)
        self.precision = "fp32"
        if candidate != "fp32":
            # auto engages only at parity; an explicit bf16/fp16 is the operator's call,
            # kept with a warning when the probe disagrees.
            self.precision = self._adopt(candidate, verify=verify_parity, enforce=requested == "auto")

    # -- precision --

    def _adopt(self, candidate: str, *, verify: bool, enforce: bool) -> str:
        """Switch to ``candidate``; with ``enforce``, only if the probe keeps fp32's ranking."""
        pairs = probe_pairs()
        reference = self.score_pairs(pairs) if verify else None
        self.precision = candidate
        if reference is not None:
            rho = spearman(reference, self.score_pairs(pairs))
            self.probe_spearman = rho
            if rho < MIN_SPEARMAN and enforce:
                log.warning("precision_rejected", precision=candidate, spearman=round(rho, 4), kept="fp32")
                self.precision = "fp32"
                return "fp32"
            if rho < MIN_SPEARMAN:
                log.warning("precision_below_parity", precision=candidate, spearman=round(rho, 4))
        log.info("precision_adopted", precision=candidate, verified=reference is not None)
        return candidate

    def _autocast(self) -> Any:
        import contextlib

        import torch

        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        if self.precision == "fp16":
            return torch.autocast(device_type=self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()

    # -- scoring --

    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> dict[str, list[list[int]]]:
        """One tokeniser call for every pair (the fast tokeniser parallelises it), unpadded."""
        encoded = self.tokenizer(
            [q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first",
            max_length=self.max_length, padding=False, return_attention_mask=False,
        )
        return dict(encoded)

    def batches(self, encoded: dict[str, list[list[int]]]) -> list[Batch]:
        import torch

        ids = encoded["input_ids"]
        types = encoded.get("token_type_ids")
        pad_id = self.tokenizer.pad_token_id or 0
        out: list[Batch] = []
        for indices in plan_batches([len(x) for x in ids], self.token_budget):
            width = len(ids[indices[0]])
            input_ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(indices), width), dtype=torch.long)
            token_types = torch.zeros((len(indices), width), dtype=torch.long) if types is not None else None
            for row, i in enumerate(indices):
                n = len(ids[i])
                input_ids[row, :n] = torch.tensor(ids[i], dtype=torch.long)
                mask[row, :n] = 1
                if token_types is not None:
                    token_types[row, :n] = torch.tensor(types[i], dtype=torch.long)
            tensors = {"input_ids": input_ids, "attention_mask": mask}
            if token_types is not None:
                tensors["token_type_ids"] = token_types
            out.append(Batch(indices=indices, tensors=tensors))
        return out

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
                real = int(batch.tensors["attention_mask"].sum())
                self.padded_tokens += batch.padded_tokens
                self.real_tokens += real
                if self.on_batch is not None:
                    self.on_batch(real, batch.padded_tokens)
        return scores

    def score(self, query: str, documents: Sequence[str]) -> list[float]:
        return self.score_pairs([(query, d) for d in documents])


# --- one model copy per process ---------------------------------------------------------------

_engines: dict[tuple[str, str, str, int | None], ScoringEngine] = {}
_engines_lock = threading.Lock()


def configure_threads(threads: int | None) -> None:
    """Size torch's intra-op pool to the CPU quota this process has, not the host's cores."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)  # one forward at a time per process; no oversubscription
    except RuntimeError:
        pass  # already set (or work already ran): harmless


def shared_engine(model_name: str, *, device: str, settings: Settings) -> ScoringEngine:
    """The process's engine for this model; chain members naming the same model share it."""
    key = (model_name, device, settings.precision, settings.token_budget)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            if device == "cpu":
                configure_threads(settings.torch_threads)
            engine = ScoringEngine(load_cross_encoder(model_name, device=device), settings=settings)
            _engines[key] = engine
        return engine
