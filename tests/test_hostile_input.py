"""Hostile and careless input to open() and pull(): a ValidationError naming the field, nothing written.

Each case is input a caller really sends: structs built in Python (msgspec does not type-check
them), strings decoded from JSON with lone surrogates, deeply nested metadata, booleans where
integers belong, ids with a trailing newline.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from conftest import make_candidates

from kernel.ids import check_idempotency_key
from kernel.wire import Boosts, Candidate, TimeRange
from producer import ConfigError, ValidationError, load_settings
from producer.validation import MAX_NESTING_DEPTH, check_stream_id

SURROGATE = "\ud800"  # what json.loads('"\\ud800"') returns
UTC = dt.timezone.utc
NAIVE = dt.datetime(2024, 3, 1, 12, 0)
AWARE = dt.datetime(2024, 3, 2, 12, 0, tzinfo=UTC)


def everything_under(raw_redis: Any, namespace: str) -> list[bytes]:
    """Stream keys (`ns:...`) and the namespace's queues (`ns.cpu`)."""
    return sorted(raw_redis.scan_iter(match=f"{namespace}*", count=1000))


@pytest.fixture
def client(make_client, raw_redis, namespace):
    made = make_client()
    yield made
    for key in everything_under(raw_redis, namespace):
        raw_redis.delete(key)


def refused(
    client: Any,
    raw_redis: Any,
    namespace: str,
    field: str,
    query: Any = "payment errors",
    candidates: Any = None,
    **kwargs: Any,
) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        client.open(query, make_candidates(3) if candidates is None else candidates, **kwargs)
    assert err.value.field == field, err.value
    str(err.value).encode("utf-8")  # the error itself can be logged
    assert everything_under(raw_redis, namespace) == [], f"{err.value} left keys behind"
    return err.value


def deep(levels: int, leaf: Any = "x") -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def deep_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


# -- 2, 7: nested structs are type-checked, with their path -------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"boosts": Boosts(recency_curve="exponental")}, "boosts.recency_curve"),
        ({"boosts": Boosts(recency_alpha="x")}, "boosts.recency_alpha"),
        ({"boosts": Boosts(recency_alpha=None)}, "boosts.recency_alpha"),
        ({"boosts": Boosts(recency_window_days=[1])}, "boosts.recency_window_days"),
        ({"boosts": {"recency_alpha": "x"}}, "boosts.recency_alpha"),
        ({"boosts": 0}, "boosts"),
        ({"boosts": ""}, "boosts"),
        ({"query_range": TimeRange(start="a", end="b")}, "query_range.start"),
        ({"query_range": TimeRange(start=AWARE, end="b")}, "query_range.end"),
        ({"query_range": TimeRange(start=AWARE, end=dt.date(2024, 3, 3))}, "query_range.end"),
        ({"reference_time": ""}, "reference_time"),
        ({"reference_time": 0}, "reference_time"),
        ({"reference_time": "2024-03-01"}, "reference_time"),
    ],
)
def test_nested_struct_fields_are_checked_by_path(client, raw_redis, namespace, kwargs, field):
    refused(client, raw_redis, namespace, field, **kwargs)


@pytest.mark.parametrize(
    ("candidate", "field"),
    [
        (Candidate(id="a", heading_path=["x", 1]), "candidates[0].heading_path[1]"),
        (Candidate(id="a", occurred_start="yesterday"), "candidates[0].occurred_start"),
        (Candidate(id="a", embedding=[1.0, "2"]), "candidates[0].embedding[1]"),
        (Candidate(id="a", metadata=[1]), "candidates[0].metadata"),
        (Candidate(id="a", metadata={"when": object()}), "candidates[0].metadata.when"),
        (Candidate(id="a", proof_count=True), "candidates[0].proof_count"),
    ],
)
def test_candidate_structs_with_bad_nested_values_are_refused(client, raw_redis, namespace, candidate, field):
    refused(client, raw_redis, namespace, field, candidates=[candidate])


def test_a_struct_inside_metadata_is_stored_as_its_fields(client):
    stream = client.open("q", [Candidate(id="a", text="t", metadata={"range": TimeRange(start=AWARE, end=AWARE)})])
    [stored] = client.store.load_candidates(stream, 0, 1)
    assert stored.metadata == {"range": {"start": AWARE, "end": AWARE}}


# -- 6: lone surrogates -------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "candidates", "kwargs", "field"),
    [
        ("pay" + SURROGATE, None, {}, "query"),
        ("q", [{"id": "a" + SURROGATE, "text": "t"}], {}, "candidates[0].id"),
        ("q", [Candidate(id=SURROGATE, text="t")], {}, "candidates[0].id"),
        ("q", [{"id": "a", "text": "t" + SURROGATE}], {}, "candidates[0].text"),
        ("q", [{"id": "a", "text": "t", "context": SURROGATE}], {}, "candidates[0].context"),
        ("q", [{"id": "a", "text": "t", "heading_path": ["ok", SURROGATE]}], {}, "candidates[0].heading_path[1]"),
        ("q", [{"id": "a", "text": "t", "source": SURROGATE}], {}, "candidates[0].source"),
        ("q", [{"id": "a", "text": "t", "doc_id": SURROGATE}], {}, "candidates[0].doc_id"),
        ("q", [{"id": "a", "text": "t", "metadata": {"k": SURROGATE}}], {}, "candidates[0].metadata.k"),
        ("q", [{"id": "a", "text": "t", "metadata": {SURROGATE: 1}}], {}, f"candidates[0].metadata[{SURROGATE!r}]"),
        (
            "q",
            [{"id": "a", "text": "t", "metadata": {"k": [1, {"deep": ["x", SURROGATE]}]}}],
            {},
            "candidates[0].metadata.k[1].deep[1]",
        ),
        (
            "q",
            [{"id": "a", "text": "t", "occurred_start": "2024-01-01" + SURROGATE}],
            {},
            "candidates[0].occurred_start",
        ),
        ("q", [{"id": "a", "text": "t", SURROGATE: 1}], {}, f"candidates[0][{SURROGATE!r}]"),
        ("q", None, {"strategy_boosts": {SURROGATE: "high"}}, f"strategy_boosts[{SURROGATE!r}]"),
        ("q", None, {"strategy_boosts": "graph:high," + SURROGATE + ":low"}, "strategy_boosts"),
        ("q", None, {"tenant": SURROGATE}, "tenant"),
        ("q", None, {"chain": SURROGATE}, "chain"),
        ("q", None, {"idempotency_key": "key" + SURROGATE}, "idempotency_key"),
        ("q", None, {"device": SURROGATE}, "device"),
        ("q", None, {"budget": SURROGATE}, "budget"),
        ("q", None, {"boosts": Boosts(recency_curve=SURROGATE)}, "boosts.recency_curve"),
    ],
)
def test_lone_surrogates_are_refused_up_front(client, raw_redis, namespace, query, candidates, kwargs, field):
    refused(client, raw_redis, namespace, field, query, candidates, **kwargs)


def test_valid_non_ascii_text_is_still_accepted(client):
    stream = client.open(
        "paiement échoué 🚀",
        [{"id": "é1", "text": "证书 👨‍👩‍👧", "metadata": {"ключ": ["ü"]}}],
        strategy_boosts={"граф": "high"},
    )
    check_stream_id(stream)


# -- 7: nesting depth, mixed datetimes, pull's arguments ----------------------


def test_metadata_nested_thousands_deep_is_refused_not_a_recursion_error(client, raw_redis, namespace):
    error = refused(
        client,
        raw_redis,
        namespace,
        "candidates[0].metadata",
        candidates=[{"id": "a", "text": "t", "metadata": deep(5000)}],
    )
    assert str(MAX_NESTING_DEPTH) in error.message
    refused(client, raw_redis, namespace, "candidates[0].metadata", candidates=[Candidate(id="a", metadata=deep(5000))])


def test_nesting_is_bounded_exactly_at_the_limit(client, raw_redis, namespace):
    # metadata itself is the first level.
    refused(
        client,
        raw_redis,
        namespace,
        "candidates[0].metadata",
        candidates=[{"id": "b", "text": "t", "metadata": deep(MAX_NESTING_DEPTH + 1)}],
    )
    stream = client.open("q", [{"id": "a", "text": "t", "metadata": deep(MAX_NESTING_DEPTH)}])
    [stored] = client.store.load_candidates(stream, 0, 1)
    assert stored.metadata == deep(MAX_NESTING_DEPTH)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": deep(5000)}, "query"),
        ({"candidates": [deep(5000)]}, "candidates[0].a"),
        ({"candidates": [deep_list(5000)]}, "candidates[0]"),
        ({"strategy_boosts": deep(5000)}, "strategy_boosts"),
        ({"device": [deep(5000)]}, "device"),
        ({"budget": [deep(5000)]}, "budget"),
        ({"keep": [deep(5000)]}, "keep"),
        ({"max_rerank_candidates": [deep(5000)]}, "max_rerank_candidates"),
        ({"boosts": {"recency_alpha": deep(5000)}}, "boosts"),
    ],
)
def test_deep_values_in_any_argument_are_refused(client, raw_redis, namespace, kwargs, field):
    args = {"query": "q", "candidates": make_candidates(3), **kwargs}
    refused(client, raw_redis, namespace, field, args.pop("query"), args.pop("candidates"), **args)


def test_a_time_range_mixing_naive_and_aware_is_read_as_utc(client, raw_redis, namespace):
    stream = client.open("q", make_candidates(3), query_range=TimeRange(start=NAIVE, end=AWARE), reference_time=NAIVE)
    spec = client.store.load_spec(stream)
    assert spec.query_range == TimeRange(start=NAIVE.replace(tzinfo=UTC), end=AWARE)
    assert spec.reference_time == NAIVE.replace(tzinfo=UTC)
    for key in everything_under(raw_redis, namespace):
        raw_redis.delete(key)
    refused(
        client, raw_redis, namespace, "query_range", query_range=TimeRange(start=AWARE, end=dt.datetime(2024, 3, 1))
    )
    refused(
        client,
        raw_redis,
        namespace,
        "query_range",
        query_range={"start": "2024-03-02T12:00:00+00:00", "end": dt.datetime(2024, 3, 1)},
    )


@pytest.fixture
def stream(client):
    return client.open("q", make_candidates(3))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout": "5"}, "timeout"),
        ({"timeout": None}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"raise_on_failed": "yes"}, "raise_on_failed"),
        ({"raise_on_failed": 1}, "raise_on_failed"),
        ({"offset": True}, "offset"),
        ({"limit": True}, "limit"),
        ({"offset": 1.0}, "offset"),
    ],
)
def test_pull_refuses_bad_arguments_by_name_and_writes_nothing(client, raw_redis, namespace, stream, kwargs, field):
    before = {key: raw_redis.dump(key) for key in everything_under(raw_redis, namespace)}
    args = {"offset": 0, "limit": 10, "timeout": 0, **kwargs}
    with pytest.raises(ValidationError) as err:
        client.pull(stream, args.pop("offset"), args.pop("limit"), **args)
    assert err.value.field == field
    assert {key: raw_redis.dump(key) for key in everything_under(raw_redis, namespace)} == before


def test_select_refuses_a_bad_timeout_through_pull(client, stream):
    with pytest.raises(ValidationError) as err:
        client.select(stream, 1, timeout="5")
    assert err.value.field == "timeout"


def test_pull_accepts_real_numbers_for_timeout(client, stream):
    assert client.pull(stream, 0, 1, timeout=0).stream_id == stream
    assert client.pull(stream, 0, 1, timeout=0.0, raise_on_failed=False).stream_id == stream


# -- 8: a boolean is not an integer -------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "first_windows",
        "window_size",
        "ttl_s",
        "keep",
        "document_budget",
        "max_rerank_candidates",
        "max_candidates_per_source",
    ],
)
def test_booleans_are_not_integers(client, raw_redis, namespace, name):
    refused(client, raw_redis, namespace, name, candidates=make_candidates(30), **{name: True})


def test_allow_shallow_must_be_a_boolean(client, raw_redis, namespace):
    refused(client, raw_redis, namespace, "allow_shallow", keep=5, allow_shallow="no")


# -- 9: an id ends at the end of the string -----------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"idempotency_key": "abc\n"}, "idempotency_key"),
        ({"tenant": "acme\n"}, "tenant"),
        ({"chain": "fast\n"}, "chain"),
    ],
)
def test_a_trailing_newline_is_not_part_of_a_token(client, raw_redis, namespace, kwargs, field):
    refused(client, raw_redis, namespace, field, **kwargs)


@pytest.mark.parametrize("stream_id", ["k_legit\n", "s_" + "0" * 32 + "\n"])
def test_a_stream_id_with_a_trailing_newline_is_not_ours(client, stream_id):
    # check_stream_id is also the worker task's check on every message.
    with pytest.raises(ValidationError):
        check_stream_id(stream_id)
    with pytest.raises(ValidationError) as err:
        client.pull(stream_id, 0, 1, timeout=0)
    assert err.value.field == "stream_id"
    with pytest.raises(ValidationError):
        check_idempotency_key("legit\n")


@pytest.mark.parametrize(
    "variable", ["RERANKQ_NAMESPACE", "RERANKQ_CPU_QUEUE", "RERANKQ_GPU_QUEUE", "RERANKQ_ANY_QUEUE"]
)
def test_names_in_settings_end_at_the_end_of_the_string(variable):
    with pytest.raises(ConfigError) as err:
        load_settings({variable: "rerankq\n"})
    assert err.value.variable == variable


def test_a_chain_profile_variable_with_a_trailing_newline_names_no_profile():
    assert load_settings({"RERANKQ_CHAIN_FAST\n": "0"}).chain.profiles == {}
    assert load_settings({"RERANKQ_CHAIN_FAST": "0"}).chain.profiles == {"fast": [0]}


# -- 10: a missing or unknown field is part of the path -----------------------


@pytest.mark.parametrize(
    ("candidates", "kwargs", "field"),
    [
        (make_candidates(2) + [{"text": "no id"}], {}, "candidates[2].id"),
        ([{"id": "a", "text": "t", "bogus": 1}], {}, "candidates[0].bogus"),
        ([{"id": "a", "text": "t", "not a name": 1}], {}, "candidates[0]['not a name']"),
        (None, {"boosts": {"recency_alfa": 0.1}}, "boosts.recency_alfa"),
        (None, {"query_range": {"start": AWARE}}, "query_range.end"),
        (None, {"query_range": {"start": AWARE, "end": AWARE, "tz": "UTC"}}, "query_range.tz"),
    ],
)
def test_missing_and_unknown_fields_are_named(client, raw_redis, namespace, candidates, kwargs, field):
    refused(client, raw_redis, namespace, field, "q", candidates, **kwargs)
