"""The scoring engine: parity with CrossEncoder.predict, token-budget batching, precision."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from producer.settings import load_settings
from worker.engine import ScoringEngine, load_cross_encoder, plan_batches, shared_engine
from worker.engine.parity import spearman
from worker.engine.precision import resolve_precision

WORDS = "payment gateway checkout error outage recover restart certificate tls load balancer dns retry region".split()


def realistic_pairs(n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """Queries of a few words; documents from a handful of words to past the model's maximum."""
    rng = random.Random(seed)
    query = " ".join(rng.choice(WORDS) for _ in range(6))
    return [(query, " ".join(rng.choice(WORDS) for _ in range(rng.choice([2, 5, 12, 30, 60, 200]))))
            for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_cross_encoder(tiny_model_dir: Path):
    return load_cross_encoder(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="module")
def fp32_settings():
    return load_settings({}, precision="fp32")


def ranking(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def test_engine_matches_cross_encoder_predict(tiny_cross_encoder, fp32_settings):
    pairs = realistic_pairs(57)
    expected = [float(x) for x in tiny_cross_encoder.predict(pairs, batch_size=32, show_progress_bar=False)]

    scores = ScoringEngine(tiny_cross_encoder, settings=fp32_settings).score_pairs(pairs)

    assert max(abs(a - b) for a, b in zip(scores, expected)) < 1e-5
    assert ranking(scores) == ranking(expected)
    # predict applies the model's activation (sigmoid here): so does the engine, so the
    # provider's declared "probability" scale describes these numbers.
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_scores_do_not_depend_on_how_pairs_are_batched(tiny_cross_encoder, fp32_settings):
    pairs = realistic_pairs(40, seed=1)
    wide = ScoringEngine(tiny_cross_encoder, settings=fp32_settings, token_budget=100_000).score_pairs(pairs)
    narrow = ScoringEngine(tiny_cross_encoder, settings=fp32_settings, token_budget=64).score_pairs(pairs)
    assert max(abs(a - b) for a, b in zip(wide, narrow)) < 1e-5


def test_batches_respect_the_token_budget_and_keep_padding_small(tiny_cross_encoder, fp32_settings):
    engine = ScoringEngine(tiny_cross_encoder, settings=fp32_settings, token_budget=512)
    pairs = realistic_pairs(64, seed=2)
    batches = engine.batches(engine.tokenize(pairs))

    assert sorted(i for b in batches for i in b.indices) == list(range(64))
    assert all(b.padded_tokens <= 512 or len(b.indices) == 1 for b in batches)
    assert len({len(b.indices) for b in batches}) > 1  # short pairs share wider batches
    real = sum(int(b.tensors["attention_mask"].sum()) for b in batches)
    padded = sum(b.padded_tokens for b in batches)
    assert real / padded > 0.8


def test_plan_batches_orders_by_length_and_caps_padded_tokens():
    lengths = [10, 200, 12, 50, 11, 300, 49]
    batches = plan_batches(lengths, token_budget=200)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat, reverse=True)
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 200 or len(batch) == 1
    assert batches[0] == [5]  # longer than the budget: a batch of its own


def test_precision_resolution():
    assert resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("auto", "cuda") == "fp16"
    assert resolve_precision("auto", "cpu") in ("fp32", "bf16")
    with pytest.raises(ValueError):
        resolve_precision("fp16", "cpu")


def test_auto_precision_keeps_fp32_numbers_where_no_native_reduced_precision(tiny_cross_encoder):
    engine = ScoringEngine(tiny_cross_encoder, settings=load_settings({}))  # precision=auto
    if engine.precision == "fp32":
        pairs = realistic_pairs(20, seed=3)
        expected = tiny_cross_encoder.predict(pairs, batch_size=32, show_progress_bar=False)
        assert max(abs(a - float(b)) for a, b in zip(engine.score_pairs(pairs), expected)) < 1e-5
    else:  # a reduced precision was adopted: only because the parity probe passed
        assert engine.probe_spearman is not None and engine.probe_spearman >= 0.99


def test_plan_batches_caps_padding():
    lengths = [500, 150, 150, 150, 150, 40, 40, 40]
    batches = plan_batches(lengths, token_budget=100_000, max_padding=0.1)
    assert batches[0] == [0]  # 500 would pad each 150 by 350: it goes alone
    for batch in batches:
        width = max(lengths[i] for i in batch)
        assert sum(lengths[i] for i in batch) >= 0.9 * width * len(batch)


def test_members_naming_one_model_share_one_copy(tiny_model_dir: Path, fp32_settings):
    a = shared_engine(str(tiny_model_dir), device="cpu", settings=fp32_settings)
    b = shared_engine(str(tiny_model_dir), device="cpu", settings=fp32_settings)
    assert a is b


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)


def test_the_models_activation_is_applied_so_the_declared_scale_holds(tiny_model_dir: Path, tiny_cross_encoder,
                                                                     fp32_settings):
    import torch
    from sentence_transformers import CrossEncoder

    from worker.providers.local import activation_scale

    raw = CrossEncoder(str(tiny_model_dir), device="cpu", activation_fn=torch.nn.Identity())
    pairs = realistic_pairs(20, seed=4)
    logits = ScoringEngine(raw, settings=fp32_settings).score_pairs(pairs)
    expected = [float(x) for x in raw.predict(pairs, batch_size=32, show_progress_bar=False)]

    assert activation_scale(raw) == "logit"
    assert max(abs(a - b) for a, b in zip(logits, expected)) < 1e-5
    # The same model with its default sigmoid: probabilities, the sigmoid of those logits.
    probabilities = ScoringEngine(tiny_cross_encoder, settings=fp32_settings).score_pairs(pairs)
    assert activation_scale(tiny_cross_encoder) == "probability"
    assert max(abs(1 / (1 + math.exp(-x)) - p) for x, p in zip(logits, probabilities)) < 1e-5
    assert logits != probabilities
