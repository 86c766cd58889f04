"""A wrong name or value in what a caller sends says what would be right: the nearest field
of the struct it is nested in (or the field a common other name means), and the valid values
of a field that takes one of a few words. Through ``open``, which every door shares."""

from __future__ import annotations

import pytest

from producer import ValidationError


@pytest.mark.parametrize(
    ("options", "candidate", "field", "message"),
    [
        ({}, {"id": "a", "title": "Outage runbook"}, "candidates[0].title", "did you mean context or heading_path?"),
        ({}, {"id": "a", "txt": "x"}, "candidates[0].txt", "did you mean text?"),
        ({"boosts": {"recency_alpa": 0.3}}, {"id": "a"}, "boosts.recency_alpa", "did you mean recency_alpha?"),
        ({"device": "cuda"}, {"id": "a"}, "device", "valid values: cpu, gpu, any"),
        ({"boosts": {"recency_curve": "log"}}, {"id": "a"}, "boosts.recency_curve", "linear, exponential, none"),
        ({"passage_aggregate": "mean"}, {"id": "a"}, "passage_aggregate", "valid values: max, first, sum_top_k"),
    ],
)
def test_a_wrong_name_or_value_says_what_would_be_right(make_client, options, candidate, field, message) -> None:
    client = make_client()
    with pytest.raises(ValidationError) as refused:
        client.open("q", [candidate], **options)
    assert refused.value.field == field
    assert message in refused.value.message, refused.value.message
