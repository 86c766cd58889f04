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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from producer.settings import Settings
from worker.parity import MIN_SPEARMAN, spearman

log = structlog.get_logger("rerankq.engine")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick connect to the model hub, so an offline worker fails in seconds, not minutes of retries."""
    import os
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_cross_encoder(name_or_path: str, *, device: str) -> Any:
    """Load a CrossEncoder by local path, from the local hub cache, or from the hub."""
    import os

    from sentence_transformers import CrossEncoder

    if os.path.isdir(name_or_path):
        return CrossEncoder(name_or_path, device=device)
    try:
        return CrossEncoder(name_or_path, device=device, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable():
        raise OSError(
            f"model {name_or_path!r} is not a local directory, not in the local cache, and the hub is "
            "unreachable; set RERANKQ_RERANKER_MODEL to a local path"
        )
    return CrossEncoder(name_or_path, device=device)


# --- precision --------------------------------------------------------------------------------

# int8 (dynamic quantisation of the linear layers) was evaluated and is not offered:
# on MiniLM-L6 it reached about 1.3-1.6x fp32 here but Spearman 0.4-0.99 per window
# against fp32 (BERT's outlier activations do not survive per-tensor int8), short of
# the 0.99 bar. ops/bench/scoring.py still measures it.
PRECISIONS = ("fp32", "bf16", "fp16")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16: without them torch emulates bf16 and runs slower than fp32."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def resolve_precision(requested: str, device: str) -> str:
    """The precision to try: ``auto`` means the fastest native one for this device."""
    if requested != "auto":
        if requested not in PRECISIONS:
            raise ValueError(f"unknown precision {requested!r}; one of auto, {', '.join(PRECISIONS)}")
        if requested == "fp16" and device.startswith("cpu"):
            raise ValueError("fp16 has no fast CPU kernels; use bf16 or fp32")
        return requested
    if device.startswith("cuda"):
        return "fp16"
    if device.startswith("cpu") and cpu_has_native_bf16():
        return "bf16"
    return "fp32"


# A fixed probe: one query over documents of varied length and relevance, scored at
# load in fp32 and in the candidate precision. Synthetic, but a precision that cannot
# keep these in order will not keep a real window in order either.
_PROBE_QUERY = "how do i recover from a payment gateway outage after a tls certificate expired"
_PROBE_DOCUMENTS = (
    "Payment gateway outage runbook: renew the TLS certificate, restart the gateway pods, then retry failed payments.",
    "The TLS certificate on the load balancer expired at midnight and checkout returned 502 errors for an hour.",
    "Coffee machine on the third floor is out of order.",
    "Recovery steps after a gateway outage: drain the region, fail over DNS, replay the payment queue.",
    "Quarterly invoice from the CDN vendor, due at the end of March.",
    "Certificates are renewed automatically thirty days before expiry; a failed renewal pages the on-call engineer.",
    "The mobile release was delayed by a design review of colour and spacing tokens.",
    "Database migration plan for the search index, with a rollback if replication lags.",
    "Checkout errors spiked during the outage; the payment provider confirmed a partial failure in one region.",
    "Leave requests must be filed two weeks in advance.",
    "Email bounces rose after the DNS change; the SPF record was missing the new relay.",
    "Restarting the payment gateway without renewing the certificate only reproduces the outage.",
    "Tracing dashboard shows retries to the payment service doubling latency during failover.",
    "Laptop refresh schedule for the support team.",
    "A post-mortem of the certificate expiry: monitoring checked the wrong endpoint, so no alert fired.",
    "Cache purge instructions for the CDN after a bad deploy.",
    " ".join(["The gateway status page lists every incident with its cause and recovery time."] * 6),
    " ".join(["Vendor contract terms and renewal dates for all third-party services."] * 8),
)


def probe_pairs() -> list[tuple[str, str]]:
    return [(_PROBE_QUERY, d) for d in _PROBE_DOCUMENTS]


# --- batching ---------------------------------------------------------------------------------


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


# --- the engine -------------------------------------------------------------------------------


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
                self.padded_tokens += batch.padded_tokens
                self.real_tokens += int(batch.tensors["attention_mask"].sum())
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
