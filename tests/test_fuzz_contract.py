"""Property-based fuzzing of the wire contract and the producer API.

Random and malformed input either opens a stream or raises ValidationError naming a
field, and a refused open leaves nothing under the namespace.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import string
from typing import Any

import msgspec
import pytest
from conftest import namespace_keys
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kernel.ids import check_idempotency_key
from kernel.keys import Keys, shard_tag
from kernel.settings import load_settings
from kernel.wire import (
    Boosts,
    Candidate,
    TimeRange,
    WindowResult,
    candidate_decoder,
    encode,
    spec_decoder,
    window_result_decoder,
)
from producer import ValidationError
from producer.validation import check_stream_id

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

CANDIDATE_FIELDS = set(Candidate.__struct_fields__)
OPEN_ARGS = {
    "query",
    "candidates",
    "window_size",
    "first_windows",
    "device",
    "min_score",
    "min_final_score",
    "chain",
    "tenant",
    "boosts",
    "reference_time",
    "query_range",
    "ttl_s",
    "idempotency_key",
    "strategy_boosts",
    "budget",
    "keep",
    "allow_shallow",
    "max_rerank_candidates",
    "max_candidates_per_source",
    "document_budget",
    "lane",
}

junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
field_value = st.one_of(
    junk,
    st.text(max_size=40),
    st.sampled_from(["2024-03-12T00:00:00Z", "not a date", "", "9999-99-99", "2024-01-01"]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
)
candidate = st.one_of(
    st.fixed_dictionaries(
        {"id": st.text(max_size=10), "text": st.text(max_size=30)},
        optional={f: field_value for f in sorted(CANDIDATE_FIELDS - {"id", "text"})},
    ),
    st.dictionaries(st.sampled_from(sorted(CANDIDATE_FIELDS | {"bogus", "ID"})), field_value, max_size=4),
    junk,
)
candidates = st.one_of(st.lists(candidate, max_size=6), junk)


def _field_root(field: str) -> str:
    return re.split(r"[.\[]", field, maxsplit=1)[0]


@pytest.fixture
def client(make_client, raw_redis, namespace):
    made = make_client(window_size=5, max_candidates=50, max_text_chars=500, max_query_chars=100, document_budget=500)
    yield made
    raw_redis.delete(f"{namespace}.cpu", f"{namespace}.gpu", f"{namespace}.any")


@FUZZ
@given(
    query=st.one_of(st.text(max_size=120), junk),
    items=candidates,
    window_size=st.one_of(st.none(), st.integers(-3, 300), junk),
    ttl_s=st.one_of(st.none(), st.integers(-5, 10**7), junk),
    key=st.one_of(st.none(), st.text(max_size=70), junk),
    device=st.one_of(st.sampled_from(["cpu", "gpu", "any"]), junk),
)
def test_open_either_succeeds_or_names_the_field_and_writes_nothing(
    client, raw_redis, namespace, query, items, window_size, ttl_s, key, device
):
    before = namespace_keys(raw_redis, namespace)
    try:
        stream = client.open(
            query, items, window_size=window_size, ttl_s=ttl_s, idempotency_key=key, device=device, allow_shallow=True
        )
    except ValidationError as exc:
        assert _field_root(exc.field) in OPEN_ARGS, exc.field
        assert str(exc).startswith(exc.field)
        assert namespace_keys(raw_redis, namespace) == before, f"{exc} left keys behind"
    except Exception as exc:  # an IdempotencyConflict is a clear error too
        assert type(exc).__name__ == "IdempotencyConflict", repr(exc)
    else:
        check_stream_id(stream)
        keys = client.store.keys.stream(stream)
        tag = "{" + shard_tag(stream) + "}"
        assert all(k.startswith(f"{namespace}:s:{tag}:{stream}:") for k in keys.own())
        assert all(k.count("{") == 1 and tag in k for k in keys.all())  # one slot for the whole script


# -- every argument of open(), as an attacker would send it -----------------------

# Any code point, lone surrogates included (what json.loads makes of "\\ud800").
hostile_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
datetimes = st.datetimes() | st.datetimes(timezones=st.just(dt.timezone.utc)) | st.dates()
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | hostile_text
    | st.binary(max_size=6)
    | datetimes
    | st.sampled_from(["cpu", "low", "linear", "graph:high", "k_a\n"])
)


def struct_of(cls: type, required: tuple[str, ...], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """An instance built in Python: its constructor checks no type, so every field may hold junk."""
    fields = set(cls.__struct_fields__)
    return st.fixed_dictionaries(
        {f: values for f in required}, optional={f: values for f in sorted(fields - set(required))}
    ).map(lambda kw: cls(**kw))


hostile = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.frozensets(scalars, max_size=2)
        | st.dictionaries(scalars.filter(lambda k: k == k), inner, max_size=3)
        | struct_of(Boosts, (), inner)
        | struct_of(TimeRange, ("start", "end"), inner)
        | struct_of(Candidate, ("id",), inner)
    ),
    max_leaves=6,
)


class ShortList(list):
    """A list whose repr stays short: a falsifying example thousands of levels deep can be printed."""

    def __repr__(self) -> str:
        return f"<{self.levels} levels of nesting>"


@st.composite
def nested(draw: st.DrawFn) -> Any:
    """A value wrapped in containers to either side of the nesting bound, now and then past the
    interpreter's recursion limit."""
    value = draw(hostile)
    levels = draw(st.one_of(st.integers(0, 40), st.just(3000)))
    wrap = draw(st.sampled_from([lambda v: [v], lambda v: {"k": v}, lambda v: (v,), lambda v: {"metadata": v}]))
    for _ in range(levels):
        value = wrap(value)
    outer = ShortList([value])
    outer.levels = levels + 1
    return outer


anything = st.one_of(hostile, nested())

# What a careful caller sends; each call below then spoils a few arguments or candidate fields.
some_text = st.text(min_size=1, max_size=20).filter(str.strip)
aware = st.datetimes(timezones=st.just(dt.timezone.utc))


@st.composite
def time_ranges(draw: st.DrawFn) -> TimeRange:
    start = draw(aware | st.datetimes())
    end = start + dt.timedelta(days=draw(st.integers(0, 400)))
    if draw(st.booleans()):  # naive and aware mixed: naive is UTC
        start = start.replace(tzinfo=None if start.tzinfo else dt.timezone.utc)
    return TimeRange(start=start, end=end)


candidate_fields = {
    "context": some_text,
    "heading_path": st.lists(some_text, max_size=2),
    "occurred_start": aware | st.datetimes(),
    "mentioned_at": aware,
    "proof_count": st.integers(0, 9),
    "source": st.sampled_from(["graph", "bm25"]),
    "fusion_score": st.floats(-5, 5),
    "doc_id": some_text,
    "embedding": st.lists(st.floats(-1, 1), min_size=2, max_size=2),
    "metadata": st.dictionaries(some_text, st.integers() | some_text | st.lists(st.booleans(), max_size=2), max_size=3),
}
open_arguments = {
    "window_size": st.none() | st.integers(1, 30),
    "first_windows": st.integers(1, 3),
    "device": st.sampled_from(["cpu", "gpu", "any"]),
    "min_score": st.none() | st.floats(0, 1),
    "min_final_score": st.none() | st.floats(-1, 2),
    "chain": st.none() | st.just("fast"),
    "tenant": st.none() | st.just("acme"),
    "boosts": st.none() | st.just(Boosts(recency_curve="exponential")) | st.just({"recency_alpha": 0.5}),
    "reference_time": st.none() | aware | st.datetimes(),
    "query_range": st.none() | time_ranges(),
    "ttl_s": st.none() | st.integers(1, 10**5),
    "idempotency_key": st.none() | st.uuids().map(lambda u: u.hex),
    "budget": st.none() | st.sampled_from(["low", "mid", "high"]),
    "keep": st.none() | st.integers(1, 3),
    "allow_shallow": st.just(True),
    "max_rerank_candidates": st.none() | st.integers(1, 10),
    "max_candidates_per_source": st.none() | st.integers(0, 3),
    "strategy_boosts": st.none()
    | st.just("graph:high")
    | st.dictionaries(some_text, st.sampled_from(["low", "high"]), max_size=2),
    "document_budget": st.none() | st.integers(1, 500),
    "lane": st.sampled_from(["interactive", "batch"]),
}
assert set(open_arguments) | {"query", "candidates"} == OPEN_ARGS


@st.composite
def open_calls(draw: st.DrawFn) -> tuple[Any, Any, dict[str, Any]]:
    """A careful call with up to three things spoiled: arguments, candidate fields, whole candidates."""
    n = draw(st.integers(1, 4))
    items: list[Any] = []
    for i in range(n):
        fields = {"id": f"c{i}", "text": draw(some_text), **draw(st.fixed_dictionaries({}, optional=candidate_fields))}
        items.append(Candidate(**fields) if draw(st.booleans()) else fields)
    query: Any = draw(some_text)
    kwargs = draw(st.fixed_dictionaries({}, optional=open_arguments))
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(["argument", "candidate field", "candidate"]))
        if target == "argument":
            name = draw(st.sampled_from(sorted(OPEN_ARGS - {"candidates"})))
            value = draw(anything | hostile_text)
            if name == "query":
                query = value
            else:
                kwargs[name] = value
        elif target == "candidate field":
            i = draw(st.integers(0, n - 1))
            if not isinstance(items[i], (dict, Candidate)):
                continue  # already spoiled whole
            item = items[i] if isinstance(items[i], dict) else msgspec.structs.asdict(items[i])
            item = {**item, draw(st.sampled_from(sorted(CANDIDATE_FIELDS | {"bogus"}))): draw(anything | hostile_text)}
            items[i] = item if isinstance(items[i], dict) or "bogus" in item else Candidate(**item)
        else:
            items[draw(st.integers(0, n - 1))] = draw(anything)
    if draw(st.integers(0, 9)) == 9:  # now and then the list itself
        return query, draw(anything), kwargs
    return query, items, kwargs


def everything_under(raw_redis: Any, namespace: str) -> list[bytes]:
    return sorted(raw_redis.scan_iter(match=f"{namespace}*", count=1000))


@FUZZ
@given(call=open_calls())
def test_any_nested_value_in_any_argument_opens_or_is_refused_by_name(client, raw_redis, namespace, call):
    query, items, kwargs = call
    before = everything_under(raw_redis, namespace)
    try:
        stream = client.open(query, items, **kwargs)
    except ValidationError as exc:
        event(f"refused: {_field_root(exc.field)}")
        assert _field_root(exc.field) in OPEN_ARGS, exc.field
        assert str(exc).startswith(exc.field)
        str(exc).encode("utf-8")  # the error can be logged
        # Subset, not equal: earlier streams opened with a short ttl_s may expire meanwhile.
        assert set(everything_under(raw_redis, namespace)) <= set(before), f"{exc} left keys behind"
    except Exception as exc:
        assert type(exc).__name__ == "IdempotencyConflict", repr(exc)
    else:
        event("opened")
        check_stream_id(stream)
        client.store.load_spec(stream)
        client.store.load_candidates(stream, 0, 1000)


@pytest.fixture
def open_stream(client):
    return client.open("payment errors", [{"id": f"c{i}", "text": f"payment error {i}"} for i in range(12)])


OPEN_STREAM = "<the open stream>"


def valid_or(valid: st.SearchStrategy[Any], hostile_values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.booleans().flatmap(lambda ok: valid if ok else hostile_values)


@FUZZ
@given(
    stream_id=valid_or(
        st.just(OPEN_STREAM),
        st.one_of(st.text(max_size=80), hostile_text, junk, st.sampled_from(["k_legit\n", "s_" + "0" * 32 + "\n"])),
    ),
    offset=valid_or(st.integers(0, 50), st.integers(-5, -1) | anything),
    limit=valid_or(st.integers(1, 50), st.integers(-5, 0) | anything),
    timeout=valid_or(st.just(0) | st.floats(0, 0.01), anything),
    raise_on_failed=valid_or(st.booleans(), anything),
)
def test_reads_of_hostile_ids_and_bounds_are_refused_by_name(
    client, open_stream, stream_id, offset, limit, timeout, raise_on_failed
):
    stream_id = open_stream if stream_id == OPEN_STREAM else stream_id
    try:
        page = client.pull(stream_id, offset, limit, timeout=timeout, raise_on_failed=raise_on_failed)
    except ValidationError as exc:
        event(f"refused: {exc.field}")
        assert exc.field in {"stream_id", "offset", "limit", "timeout", "raise_on_failed"}
        str(exc).encode("utf-8")
    except LookupError:  # a well-formed id of a stream that does not exist
        assert re.fullmatch(r"(s_[0-9a-f]{32}|k_[A-Za-z0-9_.\-]{1,64})", stream_id)
    else:
        event("read")
        assert page.stream_id == open_stream


@given(st.text(max_size=100))
def test_no_id_or_key_can_reach_another_streams_keys(text):
    """Whatever survives validation is a plain token: no hash-tag brace, separator or glob."""
    for check, prefix in ((check_stream_id, ""), (check_idempotency_key, "k_")):
        try:
            token = prefix + check(text)
        except ValidationError:
            continue
        assert set(token) <= set(string.ascii_letters + string.digits + "_.-")
        keys = Keys("ns").stream(token)
        assert all(k.startswith("ns:s:{" + shard_tag(token) + "}:" + token + ":") for k in keys.own())
        assert all(k.count("{") == 1 and k.count("}") == 1 for k in keys.all())


@given(st.binary(max_size=200))
def test_decoders_reject_garbage_with_msgspec_errors_only(blob):
    for decoder in (candidate_decoder, spec_decoder, window_result_decoder):
        try:
            decoder.decode(blob)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass


@given(
    st.builds(
        Candidate,
        id=st.text(min_size=1, max_size=10),
        text=st.text(max_size=30),
        heading_path=st.lists(st.text(max_size=5), max_size=3),
        fusion_score=st.one_of(st.none(), st.floats(allow_nan=False)),
        proof_count=st.one_of(st.none(), st.integers()),
        metadata=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    )
)
def test_valid_candidates_round_trip_through_the_wire(candidate):
    from producer.validation import check_candidates

    try:
        [checked] = check_candidates([candidate], load_settings({}))
    except ValidationError as exc:
        assert exc.field.startswith("candidates[0]."), exc.field
        return
    assert candidate_decoder.decode(encode(checked)) == checked


def test_unknown_fields_are_refused_not_ignored():
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "a", "txt": "typo"}, Candidate)
    with pytest.raises(msgspec.ValidationError):
        window_result_decoder.decode(
            encode(
                {
                    "window": 0,
                    "start": 0,
                    "end": 0,
                    "served_by": None,
                    "passthrough": False,
                    "attempts": 1,
                    "committed_at": 0.0,
                    "decisions": [],
                    "extra": 1,
                }
            )
        )
    assert WindowResult  # the contract under test
