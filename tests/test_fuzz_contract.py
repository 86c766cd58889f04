"""Property-based fuzzing of the wire contract and the producer API.

Random and malformed input either opens a stream or raises ValidationError naming a
field, and a refused open leaves nothing under the namespace.
"""

from __future__ import annotations

import os
import re
import string

import msgspec
import pytest
from conftest import namespace_keys
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer import ValidationError
from producer.keys import Keys
from producer.settings import load_settings
from producer.validation import check_idempotency_key, check_stream_id
from producer.wire import Candidate, WindowResult, candidate_decoder, encode, spec_decoder, window_result_decoder

FUZZ = settings(max_examples=int(os.environ.get("RERANKQ_FUZZ_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

CANDIDATE_FIELDS = set(Candidate.__struct_fields__)
OPEN_ARGS = {"query", "candidates", "window_size", "first_windows", "device", "min_score", "min_final_score",
             "chain", "tenant", "boosts", "reference_time", "query_range", "ttl_s", "idempotency_key",
             "strategy_boosts", "budget", "keep", "allow_shallow", "max_rerank_candidates",
             "max_candidates_per_source", "document_budget"}

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
    st.fixed_dictionaries({"id": st.text(max_size=10), "text": st.text(max_size=30)},
                          optional={f: field_value for f in sorted(CANDIDATE_FIELDS - {"id", "text"})}),
    st.dictionaries(st.sampled_from(sorted(CANDIDATE_FIELDS | {"bogus", "ID"})), field_value, max_size=4),
    junk,
)
candidates = st.one_of(st.lists(candidate, max_size=6), junk)


def _field_root(field: str) -> str:
    return re.split(r"[.\[]", field, maxsplit=1)[0]


@pytest.fixture
def client(make_client, raw_redis, namespace):
    made = make_client(window_size=5, max_candidates=50, max_text_chars=500, max_query_chars=100)
    yield made
    raw_redis.delete(f"{namespace}.cpu", f"{namespace}.gpu", f"{namespace}.any")


@FUZZ
@given(query=st.one_of(st.text(max_size=120), junk), items=candidates,
       window_size=st.one_of(st.none(), st.integers(-3, 300), junk),
       ttl_s=st.one_of(st.none(), st.integers(-5, 10**7), junk),
       key=st.one_of(st.none(), st.text(max_size=70), junk),
       device=st.one_of(st.sampled_from(["cpu", "gpu", "any"]), junk))
def test_open_either_succeeds_or_names_the_field_and_writes_nothing(client, raw_redis, namespace, query, items,
                                                                     window_size, ttl_s, key, device):
    before = namespace_keys(raw_redis, namespace)
    try:
        stream = client.open(query, items, window_size=window_size, ttl_s=ttl_s, idempotency_key=key,
                             device=device, allow_shallow=True)
    except ValidationError as exc:
        assert _field_root(exc.field) in OPEN_ARGS, exc.field
        assert str(exc).startswith(exc.field)
        assert namespace_keys(raw_redis, namespace) == before, f"{exc} left keys behind"
    except Exception as exc:  # an IdempotencyConflict is a clear error too
        assert type(exc).__name__ == "IdempotencyConflict", repr(exc)
    else:
        check_stream_id(stream)
        keys = client.store.keys.stream(stream).all()
        assert all(k.startswith(f"{namespace}:s:{{{stream}}}:") for k in keys)


@FUZZ
@given(stream_id=st.one_of(st.text(max_size=80), junk), offset=st.one_of(st.integers(-5, 50), junk),
       limit=st.one_of(st.integers(-5, 50), junk))
def test_reads_of_hostile_ids_and_bounds_are_refused_by_name(client, stream_id, offset, limit):
    try:
        client.pull(stream_id, offset, limit, timeout=0)
    except ValidationError as exc:
        assert exc.field in {"stream_id", "offset", "limit"}
    except LookupError:  # a well-formed id of a stream that does not exist
        assert re.fullmatch(r"(s_[0-9a-f]{32}|k_[A-Za-z0-9_.\-]{1,64})", stream_id)


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
        assert all(k.startswith("ns:s:{" + token + "}:") and k.count("{") == 1 for k in keys.all())


@given(st.binary(max_size=200))
def test_decoders_reject_garbage_with_msgspec_errors_only(blob):
    for decoder in (candidate_decoder, spec_decoder, window_result_decoder):
        try:
            decoder.decode(blob)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass


@given(st.builds(Candidate, id=st.text(min_size=1, max_size=10), text=st.text(max_size=30),
                 heading_path=st.lists(st.text(max_size=5), max_size=3),
                 fusion_score=st.one_of(st.none(), st.floats(allow_nan=False)),
                 proof_count=st.one_of(st.none(), st.integers()),
                 metadata=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)))
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
        window_result_decoder.decode(encode({"window": 0, "start": 0, "end": 0, "served_by": None,
                                             "passthrough": False, "attempts": 1, "committed_at": 0.0,
                                             "decisions": [], "extra": 1}))
    assert WindowResult  # the contract under test
