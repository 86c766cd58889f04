"""Bad input is refused with its field named, before anything reaches Redis."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from conftest import ROOT, make_candidates, namespace_keys

from producer import ConfigError, ValidationError, load_settings


@pytest.mark.parametrize(
    ("query", "candidates", "kwargs", "field"),
    [
        ("", make_candidates(3), {}, "query"),
        ("   ", make_candidates(3), {}, "query"),
        ("q" * 3000, make_candidates(3), {}, "query"),
        ("q", [], {}, "candidates"),
        ("q", make_candidates(3) + [{"id": "c1", "text": "again"}], {}, "candidates[3].id"),
        ("q", [{"id": "a", "text": "x", "fusion_score": math.nan}], {}, "candidates[0].fusion_score"),
        ("q", [{"id": "a", "text": "x", "fusion_score": math.inf}], {}, "candidates[0].fusion_score"),
        ("q", [{"id": "a", "text": "x", "embedding": [1.0, math.nan]}], {}, "candidates[0].embedding"),
        ("q", [{"id": "a", "text": "x", "unknown_field": 1}], {}, "candidates[0].unknown_field"),
        ("q", [{"id": "a", "text": 7}], {}, "candidates[0].text"),
        ("q", [{"id": "", "text": "x"}], {}, "candidates[0].id"),
        ("q", [{"id": "a", "text": "x" * 70000}], {}, "candidates[0].text"),
        ("q", make_candidates(1001), {}, "candidates"),
        ("q", make_candidates(3), {"window_size": 0}, "window_size"),
        ("q", make_candidates(3), {"window_size": 257}, "window_size"),
        ("q", make_candidates(3), {"min_score": math.nan}, "min_score"),
        ("q", make_candidates(3), {"min_score": 1.5}, "min_score"),
        ("q", make_candidates(3), {"device": "tpu"}, "device"),
        ("q", make_candidates(3), {"idempotency_key": "a:b*"}, "idempotency_key"),
        ("q", make_candidates(3), {"idempotency_key": "x" * 65}, "idempotency_key"),
        ("q", make_candidates(3), {"ttl_s": 0}, "ttl_s"),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(make_client, raw_redis, namespace, query, candidates, kwargs, field):
    client = make_client()
    with pytest.raises(ValidationError) as err:
        client.open(query, candidates, **kwargs)
    assert err.value.field.startswith(field), err.value
    assert field in str(err.value)
    assert namespace_keys(raw_redis, namespace) == []


@pytest.mark.parametrize("stream_id", ["", "s_xyz", "k_a:b", "k_*", "../etc", "s_" + "0" * 31, "k_" + "a" * 65])
def test_a_stream_id_that_is_not_ours_is_refused(make_client, stream_id):
    client = make_client()
    with pytest.raises(ValidationError) as err:
        client.pull(stream_id, 0, 1, timeout=0)
    assert err.value.field == "stream_id"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RERANKQ_WINDOW_SIZE": "ten"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_WINDOW_SIZE": "0"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_WINDOW_SIZE": "500"}, "RERANKQ_WINDOW_SIZE"),
        ({"RERANKQ_MIN_SCORE": "high"}, "RERANKQ_MIN_SCORE"),
        ({"RERANKQ_NAMESPACE": "a b"}, "RERANKQ_NAMESPACE"),
        ({"RERANKQ_REDIS_URL": "http://x"}, "RERANKQ_REDIS_URL"),
        ({"RERANKQ_RERANKER_TIMEOUT_S": "soon"}, "RERANKQ_RERANKER_TIMEOUT_S"),
        ({"RERANKQ_RERANKER_2_PROVIDER": "rrf"}, "RERANKQ_RERANKER_2_PROVIDER"),
        ({"RERANKQ_RERANKER_1_MODEL": "m"}, "RERANKQ_RERANKER_1_PROVIDER"),
    ],
)
def test_a_bad_setting_names_its_variable(environ, variable):
    with pytest.raises(ConfigError) as err:
        load_settings(environ)
    assert err.value.variable == variable


def test_chain_members_are_read_in_isolation():
    settings = load_settings({
        "RERANKQ_RERANKER_PROVIDER": "local", "RERANKQ_RERANKER_TIMEOUT_S": "0.5",
        "RERANKQ_RERANKER_MODEL": "/models/x", "RERANKQ_RERANKER_1_PROVIDER": "rrf",
    })
    primary, fallback = settings.chain()
    assert (primary.provider, primary.timeout_s, primary.model) == ("local", 0.5, "/models/x")
    assert (fallback.provider, fallback.timeout_s, fallback.model) == ("rrf", 10.0, None)
    assert [m.provider for m in load_settings({}).chain()] == ["local", "rrf"]


def test_api_keys_do_not_print():
    settings = load_settings({"RERANKQ_RERANKER_PROVIDER": "cohere", "RERANKQ_RERANKER_API_KEY": "sk-live-123"})
    assert "sk-live-123" not in repr(settings)
    assert settings.chain()[0].api_key.reveal() == "sk-live-123"


def test_the_producer_imports_without_torch():
    code = "import sys, producer; from producer import RerankClient; assert 'torch' not in sys.modules, 'torch'; " \
           "assert 'sentence_transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
