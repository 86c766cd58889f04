"""Scoring throughput: CrossEncoder.predict(batch_size=32) against our engine, same pairs;
and the embedding member's bi-encoder engine (the packaged all-MiniLM-L6-v2) on the same
windows, so the cost of the cross-encoder over the bi-encoder is measured, not guessed.

Both score the pairs a window at a time, as the worker does; all subjects are alternated
round by round in one process, so machine noise hits each, and the ratio is taken
per round. Also reported: executed and useful GFLOP/s (FLOPs per pair for a BERT
encoder: layers * (24 L h^2 + 4 L^2 h), L the pair's tokens, padded for "executed"),
the fraction of a matrix-multiply peak measured in this run at the same precision,
and ranking parity against fp32 (Spearman per window, max absolute score difference).
The embedding row's parity is against sentence-transformers' own ``encode_query`` /
``encode_document`` (cosines of its fp32 embeddings), its FLOPs those of embedding the query once and each document
(truncated at the bi-encoder's 256 tokens) per window; its ratio is against the engine.

Each backend and precision the engine offers (torch fp32/bf16; ONNX Runtime fp32 and
each of its int8 recipes; OpenVINO fp32, bf16 and each of its int8 recipes with the rest
at fp32 and, where native, bf16; where installed) is a row, forced on so its speed and
parity are both seen, with the resident memory of a process that loads only it (measured
in a subprocess each). An int8 recipe that calibrates does so on the shipped collection's
windows, as ``auto`` does, and the int8 table (``ops/bench/int8_table.py``) holds each to
the windows ``auto`` holds it to: its Spearman and largest score difference there, and its
speed against ``predict`` and the OpenVINO bf16 row of the same rounds. ``auto`` measures
int8 here too unless ``--no-auto-int8``.

The bench model's head is ``--head trained`` (the default: distilled from the packaged
bi-encoder, ``ops/bench/trained_reranker.py``, so scores separate relevant from irrelevant
as a real reranker's do) or ``--head random`` (as initialised: scores nearly tied within a
window, the worst case for a quantised backend's parity). The default engine's pairs/s is
also set against the fastest backend row at parity in the same run (``auto_vs_fastest``),
and ``auto``'s own measured decision, where the engine keeps one, is in ``--json`` as
``auto_choice``.

A causal-LM reranker row follows (``ops/bench/causal.py``): a Qwen3-0.6B-shaped model with
random weights, CrossEncoder.predict against the engine without and with prefix reuse, with
parity and the tokens each runs per pair (``--causal-layers``; ``--quick`` runs 4 of the 28;
``--causal-only`` runs only it).

    python -m ops.bench.scoring --quick --json /tmp/scoring.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ops.bench.causal import run_causal
from ops.bench.common import (
    HEADS,
    ROOT,
    SIZES,
    bench_model,
    cpu_quota,
    device_sync,
    median_of_ratios,
    p50,
    print_table,
    realistic_pairs,
    windows_of,
    write_json,
)
from ops.bench.int8_table import BF16_ROW, auto_against_bf16, int8_rows, print_int8_table
from worker.engine import BackendChoice, ScoringEngine, configure_threads, load_cross_encoder
from worker.engine.autotune import shipped_calibration
from worker.engine.parity import MIN_SPEARMAN, max_abs_diff, spearman
from worker.engine.precision import cpu_has_native_bf16, probe_pairs

Pairs = list[tuple[str, str]]


def pair_flops(tokens: int, *, layers: int, hidden: int) -> float:
    return layers * (24 * tokens * hidden**2 + 4 * tokens**2 * hidden)


def matmul_peak_gflops(precision: str, device: str, *, n: int = 2048, seconds: float = 1.5) -> float:
    """Best-of-runs throughput of one large matrix multiply at ``precision``."""
    import torch

    def timed(fn: Callable[[], Any], flops: float) -> float:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = max(best, flops / (time.perf_counter() - start))
        return best / 1e9

    with torch.inference_mode():
        if precision == "int8":
            # The same kernel the int8 engine runs: a dynamically quantised linear layer.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                layer = torch.ao.quantization.quantize_dynamic(
                    torch.nn.Sequential(torch.nn.Linear(n, n)), {torch.nn.Linear}, dtype=torch.qint8
                )
            x = torch.randn(n, n)
            return timed(lambda: layer(x), 2.0 * n**3)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        return timed(lambda: a @ b, 2.0 * n**3)


def quantize_dynamic_int8(network: Any) -> Any:
    """int8 weights, activations quantised per batch, for the encoder's linear layers
    (the one-logit head and the pooler stay fp32: tiny, and the most score-sensitive)."""
    import torch

    names = {
        name
        for name, module in network.named_modules()
        if isinstance(module, torch.nn.Linear) and module.out_features > 8 and "pooler" not in name
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao is deprecated in favour of torchao, not installed here
        spec = {name: torch.ao.quantization.default_dynamic_qconfig for name in names}
        return torch.ao.quantization.quantize_dynamic(network, spec, dtype=torch.qint8, inplace=False)


class Subject:
    """One way of scoring a window, with what it took and what it gave."""

    def __init__(
        self,
        name: str,
        precision: str,
        score_window: Callable[[Pairs], list[float]],
        executed_tokens: Callable[[Pairs], list[int]],
        *,
        choice: BackendChoice | None = None,
        useful_tokens: Callable[[Pairs], list[int]] | None = None,
        reference: Callable[[Pairs], list[float]] | None = None,
    ) -> None:
        self.name = name
        self.precision = precision
        self.score_window = score_window
        self.executed_tokens = executed_tokens  # per forward batch: padded widths, one per row
        #: The backend as a worker would be configured to run it; None for predict and evaluations.
        self.choice = choice
        # Rows the model really runs (pairs for a cross-encoder, texts for a bi-encoder) and
        # the scores parity is judged against; None: the cross-encoder's pairs and predict.
        self.useful_tokens = useful_tokens
        self.reference = reference
        self.rates: list[float] = []
        self.scores: list[list[float]] = []
        #: The engine behind the subject, where there is one (its ``auto_decision``, when it measured).
        self.engine: Any = None

    @property
    def quantized(self) -> bool:
        return self.choice is not None and self.choice.quantization != "none"

    @property
    def rest_precision(self) -> str:
        """The precision the unquantised part runs at (all of it, for a row not quantised)."""
        return "bf16" if self.precision.endswith("bf16") else "fp32" if self.quantized else self.precision

    @property
    def peak_precision(self) -> str:
        """The matrix-multiply peak this row is set against: int8's for an int8 export."""
        return "int8" if self.precision.startswith("int8") else self.precision

    @property
    def backend_key(self) -> str | None:
        if self.choice is None:
            return None
        if self.quantized:
            return f"{self.choice.name}/{self.choice.quantization}/{self.rest_precision}"
        key = f"{self.choice.name}/{self.precision}"
        if self.choice.name == "onnx" and self.choice.onnx_optimization != "O2":
            key += f"/{self.choice.onnx_optimization}"
        return key

    def run(self, windows: Sequence[Pairs], *, sync: Callable[[], None], keep: bool) -> float:
        start = time.perf_counter()
        scores = [self.score_window(w) for w in windows]
        sync()
        elapsed = time.perf_counter() - start
        if keep:
            self.scores = scores
        rate = sum(len(w) for w in windows) / elapsed
        self.rates.append(rate)
        return rate


# A process that loads one backend as a worker does and scores a window: its resident memory.
_RSS_PROBE = """
import json, sys
import psutil
from kernel.settings import load_settings
from worker.engine import BackendChoice, ScoringEngine, configure_threads, load_cross_encoder
args = json.loads(sys.argv[1])
configure_threads(args["threads"])
settings = load_settings({}, precision=args["precision"])
engine = ScoringEngine(load_cross_encoder(args["model"], device=args["device"]), settings=settings,
                       backend=BackendChoice(**args["choice"]), verify_parity=False, model_name=args["model"])
engine.score_pairs([tuple(p) for p in args["window"]])
print(json.dumps({"rss_mb": psutil.Process().memory_info().rss / 2**20}))
"""


def process_rss_mb(subject: Subject, *, model: str, device: str, threads: int, window: Pairs) -> float | None:
    assert subject.choice is not None
    args = {
        "model": model,
        "device": device,
        "threads": threads,
        "window": window,
        "precision": subject.rest_precision,
        "choice": vars(subject.choice),
    }
    done = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, json.dumps(args)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        print(f"rss of {subject.name}: the probe process failed: {done.stderr.strip()[-400:]}", flush=True)
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_mb"])


def ort_cuda() -> bool:
    """Whether ONNX Runtime here has its CUDA provider (the onnxruntime-gpu build)."""
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def embedding_subject(settings: Any, device: str) -> Subject:
    """The embedding member's engine over the packaged all-MiniLM-L6-v2."""
    from worker.engine.embedding import EmbeddingEngine
    from worker.engine.loading import load_sentence_transformer
    from worker.providers.embedding import packaged_model

    model = load_sentence_transformer(packaged_model()[0], device=device)
    engine = EmbeddingEngine(model, settings=settings)

    def texts(window: Pairs) -> list[str]:
        return [window[0][0], *(d for _, d in window)]

    def useful(window: Pairs) -> list[int]:
        return [len(ids) for ids in engine.tokenize(texts(window))["input_ids"]]

    def executed(window: Pairs) -> list[int]:
        return [
            b.tensors["input_ids"].shape[1] for b in engine.batches(engine.tokenize(texts(window))) for _ in b.indices
        ]

    def library(window: Pairs) -> list[float]:
        query = model.encode_query(
            [window[0][0]], convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        ).float()
        documents = model.encode_document(
            [d for _, d in window], convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        ).float()
        return (documents @ query[0]).tolist()

    return Subject(
        f"embedding engine ({settings.engine.precision} -> {engine.precision})",
        engine.precision,
        engine.score_pairs,
        executed,
        useful_tokens=useful,
        reference=library,
    )


def auto_against_fastest(engine_pairs_per_s: float, backends: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The default engine's pairs/s over the fastest backend row at parity in the same run
    (the engine's own row included); None when no row is at parity."""
    at_parity = {key: b for key, b in backends.items() if b["at_parity"]}
    if not at_parity:
        return None
    fastest = max(at_parity, key=lambda key: at_parity[key]["pairs_per_s"])
    return {"fastest": fastest, "ratio": engine_pairs_per_s / at_parity[fastest]["pairs_per_s"]}


def held_out_parity(
    subject: Subject, windows: Sequence[Pairs], expected: Sequence[Sequence[float]]
) -> dict[str, Any] | None:
    """This row held to ``auto``'s bars beyond the timed windows (None for a row auto does not
    measure): ``autotune.judge`` (every window at parity, fp32 exports within the score
    tolerance, int8 within the nDCG bound on judged windows) on the probe window
    (``windows[0]``) and, for an int8 export, the rest: the shipped collection's held-out
    windows, as ``auto`` holds a candidate. ``expected`` is torch fp32's scores on ``windows``,
    scored once for every row. Returns why auto would refuse it (``refusal``, None: it would
    not) and, on the windows it was held to, each window's Spearman and the largest score
    difference. The timed windows alone are few enough that an int8 at parity on them is off
    on others."""
    from worker.engine.autotune import Candidate, judge

    if subject.engine is None or subject.choice is None:
        return None
    candidate = Candidate(subject.choice.name, subject.rest_precision, subject.choice.quantization)
    held_to = windows if candidate.quantized else windows[:1]
    scored = [subject.engine.score_pairs(w) for w in held_to]
    reference = expected[: len(held_to)]
    return {
        "refusal": judge(candidate, reference, scored, held_to)[1],
        "windows": len(held_to),
        "spearman": [spearman(r, c) for r, c in zip(reference, scored)],
        "max_abs_diff": max(max_abs_diff(r, c) for r, c in zip(reference, scored)),
    }


def auto_choice(engine: Any) -> dict[str, Any] | None:
    """What ``auto`` measured and chose (``engine.auto_decision``: the chosen candidate and the
    table of measurements), as plain JSON; None where the engine kept no decision."""
    decision = getattr(engine, "auto_decision", None)
    if decision is None:
        return None
    import msgspec

    return msgspec.to_builtins(decision)  # type: ignore[no-any-return]


def variant_candidates(*, on_cuda: bool, quick: bool, int8: bool = True) -> list[tuple[str, str, BackendChoice | None]]:
    """Each backend and precision other than the engine's own: (row name, precision, forced choice);
    the int8 rows only with ``int8``."""
    torch_precisions = ["fp32", "fp16", "bf16"] if on_cuda else ["fp32", *(["int8"] if int8 else []), "bf16"]
    candidates: list[tuple[str, str, BackendChoice | None]] = [
        (f"torch {p}", p, None if p == "int8" else BackendChoice()) for p in torch_precisions
    ]
    if importlib.util.find_spec("onnxruntime") is not None and (not on_cuda or ort_cuda()):
        levels = ["O2"] if quick else ["O1", "O2", "O3"]
        candidates += [
            (f"onnx {level} fp32", "fp32", BackendChoice("onnx", onnx_optimization=level)) for level in levels
        ]
        if not on_cuda and int8:
            candidates += int8_candidates("onnx", ["fp32"])
    if importlib.util.find_spec("openvino") is not None and not on_cuda:
        rests = ["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"]
        candidates += [(f"openvino {rest}", rest, BackendChoice("openvino")) for rest in rests]
        if int8:
            candidates += int8_candidates("openvino", rests)
    return candidates


def int8_candidates(backend: str, rests: Sequence[str]) -> list[tuple[str, str, BackendChoice | None]]:
    """Each int8 recipe the backend makes, its unquantised rest at each of ``rests``: calibrated,
    where the recipe calibrates, on the shipped collection's windows as ``auto`` calibrates."""
    from worker.engine.int8_recipes import recipes_for

    return [
        (f"{backend} {recipe.name} ({rest} rest)", rest, BackendChoice(backend, quantization=recipe.name))
        for recipe in recipes_for(backend)
        for rest in rests
    ]


def print_subjects_table(title: str, results: dict[str, dict[str, Any]]) -> None:
    print_table(
        title,
        [
            "subject",
            "prec",
            "pairs/s",
            "ratio",
            "exec GF/s",
            "useful GF/s",
            "peak GF/s",
            "of peak",
            "padding",
            "spearman min",
            "max |diff|",
        ],
        [
            [
                name,
                f["precision"],
                f["pairs_per_s"],
                f["ratio"],
                f["executed_gflops"],
                f["useful_gflops"],
                f["peak_gflops"],
                f"{f['mfu']:.0%}",
                f"{f['padding_fraction']:.0%}",
                f"{f['spearman_min']:.4f}",
                f"{f['max_abs_diff']:.2g}",
            ]
            for name, f in results.items()
        ],
    )


def print_backends_table(backends: dict[str, dict[str, Any]]) -> None:
    print_table(
        "backends: pairs/s, ratio to predict, parity (min Spearman per window against fp32), resident MB of a "
        "process loading only that backend",
        ["backend/precision", "pairs/s", "ratio", "spearman min", "at parity", "rss MB"],
        [
            [
                key,
                b["pairs_per_s"],
                b["ratio"],
                f"{b['spearman_min']:.4f}",
                "yes" if b["at_parity"] else "no",
                "-" if b["rss_mb"] is None else round(b["rss_mb"]),
            ]
            for key, b in backends.items()
        ],
    )


def report_fastest_at_parity(
    results: dict[str, dict[str, Any]], backends: dict[str, dict[str, Any]], *, skip: tuple[str, ...]
) -> str | None:
    """Print the fastest row at parity and each backend auto refuses; return that row's name."""
    at_parity = [
        (n, f)
        for n, f in results.items()
        if n not in skip and f["spearman_min"] >= MIN_SPEARMAN and f.get("refused_by_auto") is None
    ]
    best_name, best = max(at_parity, key=lambda item: item[1]["ratio"]) if at_parity else (None, None)
    if best_name:
        print(
            f"\nfastest at parity (Spearman >= {MIN_SPEARMAN} on the timed windows, and auto's bars): "
            f"{best_name}, {best['ratio']:.2f}x predict"
        )
    for key, b in backends.items():
        if b["refused_by_auto"]:
            print(f"{key}: not at parity by auto's bars: {b['refused_by_auto']}")
    return best_name


def backend_rows(
    subjects: list[Subject], results: dict[str, dict[str, Any]], rss: Callable[[Subject], float | None] | None
) -> dict[str, dict[str, Any]]:
    """One row per backend/precision, from the first subject that ran it."""
    backends: dict[str, dict[str, Any]] = {}
    for subject in subjects:
        key = subject.backend_key
        if key is None or key in backends:
            continue
        f = results[subject.name]
        backends[key] = {
            "subject": subject.name,
            "pairs_per_s": f["pairs_per_s"],
            "ratio": f["ratio"],
            "spearman_min": f["spearman_min"],
            "at_parity": f["spearman_min"] >= MIN_SPEARMAN and f["refused_by_auto"] is None,
            "refused_by_auto": f["refused_by_auto"],
            "rss_mb": None if rss is None else rss(subject),
        }
    return backends


def time_rounds(
    subjects: list[Subject], windows: list[Pairs], *, rounds: int, device: str, slow: set[str], sync: Callable[[], None]
) -> dict[str, float]:
    """Warm every subject, then time them round by round, alternated; the best matmul peak per precision."""
    for subject in subjects:  # warm-up: first-call allocations, lazy inits
        subject.score_window(windows[0][:4])
    # The matmul peak is measured in every round too, and the best kept: on a shared
    # machine a single measurement can land in a busy moment and flatter the engine.
    precisions = sorted({s.peak_precision for s in subjects})
    peaks = dict.fromkeys(precisions, 0.0)
    for round_ in range(rounds):
        for precision in precisions:
            peaks[precision] = max(
                peaks[precision],
                matmul_peak_gflops(
                    precision,
                    device,
                    n=8192 if device.startswith("cuda") else 2048,
                    seconds=0.5 if precision == "bf16" else 1.0,
                ),
            )
        for subject in subjects:
            if subject.name in slow:
                if round_ == 0:
                    subject.run(windows[:1], sync=sync, keep=True)
                continue
            subject.run(windows, sync=sync, keep=round_ == 0)
        rates = ", ".join(f"{s.name} {s.rates[-1]:.1f}/s" for s in subjects)
        print(f"round {round_ + 1}/{rounds}: {rates}", flush=True)
    return peaks


def auto_parity(subjects: list[Subject], variants: list[Subject], *, window_size: int) -> dict[str, dict[str, Any]]:
    """Each subject held to auto's bars against forced torch fp32 (``held_out_parity``), by name;
    none where there is no torch fp32 row to hold them to."""
    torch_fp32 = next((v for v in variants if v.backend_key == "torch/fp32"), None)
    if torch_fp32 is None:
        return {}
    parity_windows = [probe_pairs(), *shipped_calibration(window_size).held_out]
    expected = [torch_fp32.engine.score_pairs(w) for w in parity_windows]
    held = {s.name: held_out_parity(s, parity_windows, expected) for s in [*subjects, *variants] if s is not torch_fp32}
    return {name: figures for name, figures in held.items() if figures is not None}


def subject_figures(
    subject: Subject,
    windows: list[Pairs],
    baseline: Subject,
    *,
    token_lengths: Callable[[Pairs], list[int]],
    layers: int,
    hidden: int,
    peaks: dict[str, float],
    slow: set[str],
) -> dict[str, Any]:
    """Speed, FLOPs against the peak, padding and parity of one subject's timed windows."""
    scored = windows[: len(subject.scores)]
    lengths = [n for w in scored for n in (subject.useful_tokens or token_lengths)(w)]
    executed = [n for w in scored for n in subject.executed_tokens(w)]
    n_pairs = sum(len(w) for w in scored)
    rate = p50(subject.rates)
    useful = sum(pair_flops(n, layers=layers, hidden=hidden) for n in lengths) / n_pairs * rate / 1e9
    executed_gflops = sum(pair_flops(n, layers=layers, hidden=hidden) for n in executed) / n_pairs * rate / 1e9
    if subject.reference is not None:
        reference = [subject.reference(w) for w in scored]
    else:
        reference = baseline.scores[: len(subject.scores)]
    rhos = [spearman(r, s) for r, s in zip(reference, subject.scores)]
    return {
        "precision": subject.precision,
        "pairs_per_s": rate,
        "ratio": median_of_ratios(subject.rates, baseline.rates)
        if subject.name not in slow
        else rate / p50(baseline.rates),
        "useful_gflops": useful,
        "executed_gflops": executed_gflops,
        "peak_gflops": peaks[subject.peak_precision],
        "mfu": executed_gflops / peaks[subject.peak_precision],
        "padding_fraction": 1 - sum(lengths) / sum(executed),
        "spearman_min": min(rhos),
        "max_abs_diff": max(max_abs_diff(r, s) for r, s in zip(reference, subject.scores)),
    }


def make_engine_subject(
    name: str,
    precision: str,
    *,
    verify: bool,
    choice: BackendChoice | None = None,
    baseline_model: Any,
    model_path: str,
    device: str,
    settings: Any,
) -> Subject:
    """The engine on the bench model at one precision and backend (torch's dynamic int8 when
    ``choice`` is None and the precision is int8), as a timed subject."""
    if precision == "int8" and choice is None:
        # Evaluated here only: torch's dynamic int8 is not offered (no parity on this model).
        model = load_cross_encoder(model_path, device=device)
        model[0].model = quantize_dynamic_int8(model[0].model)
        # Forced like every variant: dynamic int8 quantises activations per batch, so even its
        # agreement with its own predict (batched differently) is not to be held to fp32's tolerance.
        engine = ScoringEngine(model, settings=settings, precision="fp32", verify_parity=verify)
        engine.precision = "int8"
    else:
        # An int8 export with no calibration file calibrates on the shipped collection's windows, as auto's does.
        choice = choice or BackendChoice()
        engine = ScoringEngine(
            baseline_model,
            settings=settings,
            precision=precision,
            verify_parity=verify,
            backend=choice,
            model_name=model_path,
        )
        decision = engine.auto_decision
        # What auto became: the backend, and the int8 recipe where it adopted one.
        choice = dataclasses.replace(
            choice,
            name=engine.backend.name,
            quantization=decision.chosen.quantization if decision else choice.quantization,
        )

    def executed(window: Pairs) -> list[int]:
        return [b.tensors["input_ids"].shape[1] for b in engine.batches(engine.tokenize(window)) for _ in b.indices]

    subject = Subject(name, engine.precision, engine.score_pairs, executed, choice=choice)
    subject.engine = engine
    return subject


def load_variants(
    engine_subject: Callable[..., Subject],
    candidates: list[tuple[str, str, BackendChoice | None]],
    engine: Subject,
    configured: BackendChoice,
) -> list[Subject]:
    """Each other backend and precision, forced on (no probe) so its speed and parity are both seen."""
    variants = []
    for name, precision, choice in candidates:
        if choice == configured and precision == engine.precision:
            continue  # the engine row is this one
        start = time.perf_counter()
        variants.append(engine_subject(f"{name} (forced)", precision, verify=False, choice=choice))
        print(f"loaded {name} in {time.perf_counter() - start:.1f}s", flush=True)
    return variants


def report_engine_against_others(
    engine: Subject, embedding: Subject, results: dict[str, dict[str, Any]], backends: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, float]:
    """Print auto's decision, the engine against the fastest row at parity and the embedding member
    against the engine; return those three figures."""
    auto_vs_fastest = auto_against_fastest(results[engine.name]["pairs_per_s"], backends)
    measured = auto_choice(engine.engine)
    if measured is not None:
        print(f"auto's measured decision: {json.dumps(measured)}")
    if auto_vs_fastest is not None:
        print(
            f"default engine against the fastest backend/precision at parity in this run "
            f"({auto_vs_fastest['fastest']}): {auto_vs_fastest['ratio']:.2f}x"
        )
    embedding_vs_engine = median_of_ratios(embedding.rates, engine.rates)
    print(
        f"embedding member (bi-encoder, {results[embedding.name]['precision']}): "
        f"{results[embedding.name]['pairs_per_s']:.1f} pairs/s, {embedding_vs_engine:.2f}x the cross-encoder engine "
        "on the same windows"
    )
    return auto_vs_fastest, measured, embedding_vs_engine


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a CrossEncoder directory (default: a MiniLM-L6-sized bench model)")
    parser.add_argument("--size", choices=sorted(SIZES), default="minilm", help="bench model size when no --model")
    parser.add_argument(
        "--head",
        choices=HEADS,
        default="trained",
        help="the MiniLM bench model's head: trained (distilled, real scores) or random (nearly tied: the worst case)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", default="auto", help="the engine's precision setting (as RERANKQ_PRECISION)")
    parser.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "torch", "onnx", "openvino"],
        help="the engine's backend (as RERANKQ_RERANKER_BACKEND)",
    )
    parser.add_argument("--onnx-optimization", default="O2", choices=["O1", "O2", "O3"])
    parser.add_argument("--windows", type=int, default=None)
    parser.add_argument("--window-size", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--token-budget", type=int, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="fewer windows and rounds: a few minutes with every backend row"
    )
    parser.add_argument("--no-variants", action="store_true", help="only the configured engine, no other rows")
    parser.add_argument(
        "--auto-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="auto also measures the int8 recipes (RERANKQ_AUTO_INT8; on by default here)",
    )
    parser.add_argument(
        "--no-int8",
        action="store_true",
        help="no int8 recipe rows, and auto measures none (as on a GPU, where no int8 recipe runs)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the per-backend resident-memory processes")
    parser.add_argument(
        "--causal-layers",
        type=int,
        default=None,
        help="layers of the Qwen3-0.6B-shaped causal reranker (default 28; 4 with --quick)",
    )
    parser.add_argument("--no-causal", action="store_true", help="skip the causal-reranker row")
    parser.add_argument("--causal-only", action="store_true", help="only the causal-reranker row")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


@dataclasses.dataclass
class Workload:
    """The bench model loaded as predict runs it, and the timed windows drawn for its tokenizer."""

    model_path: str
    baseline_model: Any
    pairs: Pairs
    windows: list[Pairs]

    @property
    def tokenizer(self) -> Any:
        return self.baseline_model[0].processor

    @property
    def max_tokens(self) -> int:
        return int(self.baseline_model[0].max_seq_length or 512)

    @property
    def layers(self) -> int:
        return int(self.baseline_model[0].model.config.num_hidden_layers)

    @property
    def hidden(self) -> int:
        return int(self.baseline_model[0].model.config.hidden_size)

    def token_lengths(self, window: Pairs) -> list[int]:
        enc = self.tokenizer(
            [q for q, _ in window], [d for _, d in window], truncation="longest_first", max_length=self.max_tokens
        )
        return [len(x) for x in enc["input_ids"]]

    def baseline_executed(self, window: Pairs) -> list[int]:
        # predict sorts by length and pads each batch of 32 to its longest pair.
        lengths = sorted(self.token_lengths(window), reverse=True)
        return [max(chunk) for chunk in windows_of(lengths, 32) for _ in chunk]


def load_workload(model_path: str, device: str, *, windows_n: int, window_size: int) -> Workload:
    baseline_model = load_cross_encoder(model_path, device=device)
    workload = Workload(model_path, baseline_model, [], [])
    workload.pairs = realistic_pairs(
        n_windows=windows_n, window_size=window_size, tokenizer=workload.tokenizer, max_tokens=workload.max_tokens
    )
    workload.windows = windows_of(workload.pairs, window_size)
    return workload


def run_sizes(args: argparse.Namespace, *, on_cuda: bool) -> tuple[int, int]:
    """How many windows and rounds: a GPU needs more work per timing to rise above launch overheads."""
    windows_n = args.windows or ((32 if args.quick else 128) if on_cuda else (4 if args.quick else 16))
    rounds = args.rounds or (2 if args.quick else 3)
    return windows_n, rounds


def engine_settings(args: argparse.Namespace) -> Any:
    from kernel.settings import load_settings

    overrides: dict[str, Any] = {"precision": args.precision, "auto_int8": args.auto_int8 and not args.no_int8}
    if args.token_budget:
        overrides["token_budget"] = args.token_budget
    return load_settings({}, **overrides)


def causal_runner(args: argparse.Namespace, settings: Any, rounds: int) -> Callable[[], dict[str, Any]] | None:
    """The causal-reranker row, run when called (None with --no-causal)."""
    if args.no_causal:
        return None
    return lambda: run_causal(
        settings=settings,
        device=args.device,
        layers=args.causal_layers or (4 if args.quick else 28),
        windows_n=args.windows or (2 if args.quick else 4),
        window_size=args.window_size,
        rounds=rounds,
    )


@dataclasses.dataclass
class Lineup:
    """Every timed subject: predict, the configured engine, the embedding member and the forced variants."""

    baseline: Subject
    engine: Subject
    embedding: Subject
    variants: list[Subject]

    @property
    def subjects(self) -> list[Subject]:
        return [self.baseline, self.engine, self.embedding]

    @property
    def everyone(self) -> list[Subject]:
        return self.subjects + self.variants


def build_lineup(args: argparse.Namespace, workload: Workload, settings: Any, *, on_cuda: bool) -> Lineup:
    engine_subject = functools.partial(
        make_engine_subject,
        baseline_model=workload.baseline_model,
        model_path=workload.model_path,
        device=args.device,
        settings=settings,
    )
    baseline = Subject(
        "CrossEncoder.predict",
        "fp32",
        lambda w: [float(x) for x in workload.baseline_model.predict(w, batch_size=32, show_progress_bar=False)],
        workload.baseline_executed,
    )
    # The engine as a worker runs it: the precision and backend settings, with the parity probe.
    configured = BackendChoice(args.backend, onnx_optimization=args.onnx_optimization)
    engine = engine_subject("engine", settings.engine.precision, verify=True, choice=configured)
    configured = engine.choice or configured
    engine.name = f"engine ({args.backend} -> {configured.name}, {args.precision} -> {engine.precision})"
    variants = (
        []
        if args.no_variants
        else load_variants(
            engine_subject,
            variant_candidates(on_cuda=on_cuda, quick=args.quick, int8=not args.no_int8),
            engine,
            configured,
        )
    )
    # The embedding member's engine, as a worker runs it: the same precision setting and probe.
    embedding = embedding_subject(settings, args.device)
    return Lineup(baseline, engine, embedding, variants)


def measure_lineup(
    lineup: Lineup, workload: Workload, args: argparse.Namespace, *, rounds: int, on_cuda: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Time every subject; return each one's figures, with auto's refusal where it would refuse,
    and each one's parity on the windows auto holds it to (``auto_parity``)."""
    # bf16 without native CPU support is emulated and slow: one window says enough.
    slow = {v.name for v in lineup.variants if v.precision == "bf16" and not on_cuda and not cpu_has_native_bf16()}
    sync = device_sync(args.device)
    peaks = time_rounds(lineup.everyone, workload.windows, rounds=rounds, device=args.device, slow=slow, sync=sync)
    results = {
        s.name: subject_figures(
            s,
            workload.windows,
            lineup.baseline,
            token_lengths=workload.token_lengths,
            layers=workload.layers,
            hidden=workload.hidden,
            peaks=peaks,
            slow=slow,
        )
        for s in lineup.everyone
    }
    # Parity as auto judges it, beside the timed windows' Spearman.
    parity = auto_parity(lineup.subjects, lineup.variants, window_size=args.window_size)
    for name, figures in results.items():
        figures["refused_by_auto"] = parity[name]["refusal"] if name in parity else None
    return results, parity


def summary_figures(
    args: argparse.Namespace,
    workload: Workload,
    lineup: Lineup,
    results: dict[str, dict[str, Any]],
    backends: dict[str, dict[str, Any]],
    reported: dict[str, Any],
) -> dict[str, Any]:
    """The --json file's figures; ``reported``: what main printed and computed on the way."""
    main_figures = results[lineup.engine.name]
    return {
        "causal": reported["causal"],
        "baseline_pairs_per_s": results[lineup.baseline.name]["pairs_per_s"],
        "engine_pairs_per_s": main_figures["pairs_per_s"],
        "ratio": main_figures["ratio"],
        "spearman_min": main_figures["spearman_min"],
        "max_abs_diff": main_figures["max_abs_diff"],
        "mfu": main_figures["mfu"],
        "engine_precision": main_figures["precision"],
        "baseline_mfu": results[lineup.baseline.name]["mfu"],
        "best_at_parity": reported["best_at_parity"],
        "engine_backend": args.backend,
        "auto_choice": reported["auto_choice"],
        "auto_vs_fastest": reported["auto_vs_fastest"],
        "auto_vs_bf16": reported["auto_vs_bf16"],
        "int8_recipes": reported["int8_recipes"],
        "head": None if args.model else args.head,
        "backends": backends,
        "embedding_pairs_per_s": results[lineup.embedding.name]["pairs_per_s"],
        "embedding_vs_engine": reported["embedding_vs_engine"],
        "embedding_spearman_min": results[lineup.embedding.name]["spearman_min"],
        "subjects": results,
        "pairs": len(workload.pairs),
        "window_size": args.window_size,
        "rounds": reported["rounds"],
        "threads": reported["threads"],
        "device": args.device,
        "model": workload.model_path,
        "layers": workload.layers,
        "hidden": workload.hidden,
    }


def main() -> None:
    args = parse_arguments()
    on_cuda = args.device.startswith("cuda")
    windows_n, rounds = run_sizes(args, on_cuda=on_cuda)
    threads = cpu_quota()
    configure_threads(threads)
    model_path = args.model or str(bench_model(args.size, args.head))
    settings = engine_settings(args)
    causal = causal_runner(args, settings, rounds)
    if args.causal_only and causal is not None:
        write_json(args.json_path, {"causal": causal()})
        return

    workload = load_workload(model_path, args.device, windows_n=windows_n, window_size=args.window_size)
    lineup = build_lineup(args, workload, settings, on_cuda=on_cuda)
    results, parity = measure_lineup(lineup, workload, args, rounds=rounds, on_cuda=on_cuda)
    rss = (
        None
        if args.no_rss
        else functools.partial(
            process_rss_mb, model=model_path, device=args.device, threads=threads, window=workload.windows[0]
        )
    )
    backends = backend_rows(lineup.everyone, results, rss)
    print_subjects_table(
        f"scoring: {len(workload.pairs)} pairs in {len(workload.windows)} windows of {args.window_size}, "
        f"{rounds} alternated rounds, {threads} threads, device {args.device}, model {model_path}",
        results,
    )
    print_backends_table(backends)
    recipes = int8_rows(lineup.everyone, results, parity)
    print_int8_table(recipes)
    best_name = report_fastest_at_parity(results, backends, skip=(lineup.baseline.name, lineup.embedding.name))
    auto_vs_fastest, measured, embedding_vs_engine = report_engine_against_others(
        lineup.engine, lineup.embedding, results, backends
    )
    auto_vs_bf16 = auto_against_bf16(lineup.engine, lineup.everyone)
    if auto_vs_bf16 is not None:
        print(f"default engine ({lineup.engine.precision}) against the {BF16_ROW} row: {auto_vs_bf16:.2f}x")
    reported = {
        "causal": causal() if causal is not None else None,
        "best_at_parity": best_name,
        "auto_choice": measured,
        "auto_vs_fastest": auto_vs_fastest,
        "embedding_vs_engine": embedding_vs_engine,
        "int8_recipes": recipes,
        "auto_vs_bf16": auto_vs_bf16,
        "rounds": rounds,
        "threads": threads,
    }
    write_json(args.json_path, summary_figures(args, workload, lineup, results, backends, reported))


if __name__ == "__main__":
    main()
