"""auto's quality bar for int8: its nDCG@10 on the shipped collection's judged windows within
0.005 of torch fp32's, on top of ranking parity."""

from __future__ import annotations

from worker.engine.autotune import (
    MAX_NDCG_DIFFERENCE,
    Candidate,
    judge,
    ndcg_at_10,
    shipped_judgements,
    shipped_windows,
)

INT8 = Candidate("openvino", "fp32", "int8")


def graded_window() -> tuple[list[tuple[str, str]], list[float]]:
    """A shipped window and fp32-like scores that rank it by its judgements, then fusion order."""
    grades = shipped_judgements()
    window = shipped_windows(25)[0]
    scores = [grades.get(pair, 0) * 10.0 - i * 0.01 for i, pair in enumerate(window)]
    return window, scores


def test_ndcg_at_10_is_trec_evals_on_a_hand_computed_window():
    grades = {("q", "a"): 2, ("q", "b"): 1}
    window = [("q", "c"), ("q", "b"), ("q", "a")]
    # Ranked c, b, a: gains 0, 1, 2 against the ideal 2, 1, 0.
    dcg = 1 / 1.584962500721156 + 2 / 2.0
    ideal = 2 / 1.0 + 1 / 1.584962500721156
    assert abs(ndcg_at_10(window, [3.0, 2.0, 1.0], grades) - dcg / ideal) < 1e-12
    assert ndcg_at_10(window, [1.0, 2.0, 3.0], grades) == 1.0


def test_int8_at_ranking_parity_is_still_refused_when_it_moves_the_judged_top_of_a_window():
    window, fp32 = graded_window()
    grades = shipped_judgements()
    order = sorted(range(len(window)), key=lambda i: -fp32[i])
    first, second = order[0], order[1]
    assert grades.get(window[first], 0) != grades.get(window[second], 0)  # a swap that matters
    swapped = list(fp32)
    swapped[first], swapped[second] = fp32[second], fp32[first]

    rho, reason = judge(INT8, [fp32], [swapped], [window])
    assert rho >= 0.99  # at ranking parity: one neighbouring swap in 25
    assert reason is not None and "nDCG@10" in reason and str(MAX_NDCG_DIFFERENCE) in reason
    # The same scores pass where nothing is judged (an operator's own calibration windows), and
    # an int8 that keeps the judged order passes.
    unjudged = [("a query no judgement names", d) for _, d in window]
    assert judge(INT8, [fp32], [swapped], [unjudged])[1] is None
    assert judge(INT8, [fp32], [[s + 0.001 for s in fp32]], [window])[1] is None


def test_an_int8_export_is_held_to_the_ranking_not_to_fp32s_digits():
    window, fp32 = graded_window()
    # Every score off by a hundredth, the order kept: past the fp32 score tolerance (1e-3).
    shifted = [s + 0.01 for s in fp32]
    # An fp32 export computes what torch computes, so it is held to its digits...
    reason = judge(Candidate("openvino", "fp32"), [fp32], [shifted], [window])[1]
    assert reason is not None and "tolerance" in reason
    # ...an int8 export, its unquantised rest at fp32 or bf16, to the ranking and the judged top.
    for rest in ("fp32", "bf16"):
        assert judge(Candidate("openvino", rest, "int8-ffn"), [fp32], [shifted], [window])[1] is None
    reversed_ = [-s for s in fp32]
    assert "Spearman" in (judge(Candidate("onnx", "fp32", "int8-dynamic"), [fp32], [reversed_], [window])[1] or "")
