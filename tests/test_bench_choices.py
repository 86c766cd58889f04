"""The benchmark's pure choices: the distillation's queries, pairs and target, the quality
command's candidates and bar, and the check figure against the fastest backend."""

from ops.bench.int8_table import int8_rows
from ops.bench.quantization_quality import MAX_NDCG_LOSS, Candidate, candidates, verdict
from ops.bench.scoring import Subject, auto_against_fastest
from ops.bench.trained_reranker import distillation_target, generated_queries, length_batches, training_pairs


def test_the_target_spreads_cosines_over_logits_like_a_rerankers():
    unrelated, fifth, own = distillation_target(-0.1), distillation_target(0.3), distillation_target(0.7)
    assert unrelated < -4 and own > 4 and fifth == 0
    assert distillation_target(0.5) - distillation_target(0.49) > 0.1  # a hundredth of cosine is not lost


def test_queries_come_from_titles_sentences_and_spans_of_their_document():
    documents = [
        (
            "Runbooks > Payments > Upstream failover",
            "Switch the payments service to the secondary acquirer now. Short.",
        ),
        (None, "One two three four five six seven eight nine."),
        ("Notes > PAY-2231", "Too short."),
    ]
    queries = generated_queries(documents)
    assert ("upstream failover", 0) in queries
    assert ("switch the payments service to the secondary acquirer now", 0) in queries
    assert all(source != 2 for _, source in queries)  # a one-word title and a short sentence give none
    spans = [q for q, source in queries if source == 1 and q != "one two three four five six seven eight nine"]
    assert (
        len(spans) == 1
        and 4 <= len(spans[0].split()) <= 7
        and spans[0] in "one two three four five six seven eight nine"
    )
    assert generated_queries(documents) == queries  # seeded


def test_pairs_are_the_source_the_teachers_hardest_others_and_random_ones():
    cosines = [[0.9, 0.8, 0.1, 0.7, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]
    pairs = training_pairs(cosines, [0, 5], hard=2, easy=1)
    first = [d for q, d in pairs if q == 0]
    assert first[:3] == [0, 1, 3] and len(first) == 4 and first[3] in (2, 4, 5)
    second = [d for q, d in pairs if q == 1]
    assert second[:3] == [5, 4, 3] and len(set(second)) == 4


def test_length_batches_cover_every_pair_once_with_similar_lengths_together():
    lengths = list(range(100, 0, -1))
    batches = length_batches(lengths, batch=4, pool=5)
    assert sorted(i for b in batches for i in b) == list(range(100))
    spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    # Four drawn at random from 1..100 span about 60 on average; from a sorted pool of 20, about 15.
    assert sum(spreads) / len(spreads) < 25


def test_every_model_gets_its_fp32_reference_first_and_exports_only_where_offered():
    found = candidates(embedding_backends=["torch"], exported=["onnx", "openvino"], native_bf16=False)
    labels = [c.label for c in found]
    assert labels[0] == "embedding torch fp32" and found[0].reference
    assert "embedding torch bf16" in labels and not any(c.model == "embedding" and c.backend != "torch" for c in found)
    # Every int8 recipe each backend makes is a row, its rest at fp32 (bf16 only where native).
    assert {
        "cross-encoder torch fp32",
        "cross-encoder onnx int8 (fp32 rest)",
        "cross-encoder onnx int8-ffn (fp32 rest)",
        "cross-encoder onnx int8-dynamic (fp32 rest)",
        "cross-encoder openvino int8 (fp32 rest)",
        "cross-encoder openvino int8-ffn (fp32 rest)",
        "cross-encoder openvino int8-weights (fp32 rest)",
    } <= set(labels)
    assert not any("bf16" in label and "openvino" in label for label in labels)
    with_bf16 = candidates(embedding_backends=["torch", "openvino"], exported=["openvino"], native_bf16=True)
    assert Candidate("embedding", "openvino", "fp32", "int8") in with_bf16
    assert Candidate("cross-encoder", "openvino", "bf16") in with_bf16
    assert Candidate("cross-encoder", "openvino", "bf16", "int8-ffn") in with_bf16


def test_the_bar_is_a_loss_under_half_a_point_of_ndcg():
    assert verdict(0.878 - MAX_NDCG_LOSS / 2, 0.878)[1]
    assert not verdict(0.878 - 0.006, 0.878)[1]
    assert verdict(0.9, 0.878) == (0.9 - 0.878, True)  # a gain holds


def test_the_default_engine_is_set_against_the_fastest_row_at_parity():
    backends = {
        "openvino/fp32": {"pairs_per_s": 30.0, "at_parity": True},
        "openvino/bf16": {"pairs_per_s": 45.0, "at_parity": True},
        "openvino/int8": {"pairs_per_s": 60.0, "at_parity": False},
    }
    assert auto_against_fastest(30.0, backends) == {"fastest": "openvino/bf16", "ratio": 30.0 / 45.0}
    assert auto_against_fastest(30.0, {"onnx/int8": {"pairs_per_s": 9.0, "at_parity": False}}) is None


def test_auto_choice_is_the_engines_measured_table_as_json():
    import json

    from ops.bench.scoring import auto_choice
    from worker.engine.autotune import AutoDecision, Candidate, Measurement

    chosen = Candidate("openvino", "fp32")
    decision = AutoDecision(chosen=chosen, table=(Measurement(chosen, 30.0, 1.0, True),), fingerprint="f", reused=False)
    engine = type("Engine", (), {"auto_decision": decision})()
    record = json.loads(json.dumps(auto_choice(engine)))
    assert record["chosen"] == {"backend": "openvino", "precision": "fp32", "quantization": "none"}
    assert record["table"][0]["pairs_per_s"] == 30.0 and record["table"][0]["at_parity"] is True
    assert auto_choice(object()) is None  # an engine that kept no decision


def test_each_int8_row_is_set_against_predict_and_the_bf16_row_of_the_same_rounds():
    from worker.engine import BackendChoice

    def subject(name: str, precision: str, choice: BackendChoice, rates: list[float]) -> Subject:
        row = Subject(name, precision, lambda w: [], lambda w: [], choice=choice)
        row.rates = rates
        return row

    bf16 = subject("openvino bf16", "bf16", BackendChoice("openvino"), [40.0, 10.0, 30.0])
    int8 = subject("openvino int8-ffn", "int8+bf16", BackendChoice("openvino", quantization="int8-ffn"), [60, 20, 33])
    results = {"openvino int8-ffn": {"ratio": 4.2}}
    held = {"refusal": None, "windows": 3, "spearman": [1.0, 0.995, 0.98], "max_abs_diff": 0.07}
    parity = {"openvino int8-ffn": held}

    (row,) = int8_rows([bf16, int8], results, parity).values()

    assert (row["recipe"], row["backend"], row["rest"]) == ("int8-ffn", "openvino", "bf16")
    # The median of 1.5, 2.0 and 1.1, the rounds' ratios: not 33/30, the ratio of the medians.
    assert row["ratio_bf16"] == 1.5
    assert row["ratio_predict"] == 4.2 and row["spearman_min"] == 0.98 and row["windows_below"] == 1
    assert row["max_abs_diff"] == 0.07 and row["refused_by_auto"] is None
