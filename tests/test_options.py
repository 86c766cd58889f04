"""One ``StreamOptions`` for every surface: ``open()``, the gateway's stream API (and its
OpenAPI document), and ``rerankq submit``'s job lines and flags take exactly its fields,
refuse the same bad value naming the same field, and take a field added to it with no change
anywhere else. (The gateway's side of the refusals, over HTTP, is in test_gateway.py.)
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from conftest import make_candidates

from kernel.wire import StreamSpec
from producer import RerankClient, ValidationError, load_settings
from producer.gateway.openapi import openapi_document
from producer.options import StreamOptions, description, option_types
from producer.stream_spec import resolve_spec
from rerankq.submit.command import submit
from rerankq.submit.jobs import BadLine, Job, JobLine, jsonl_jobs

ROOT = Path(__file__).resolve().parent.parent
FIELDS = set(StreamOptions.__struct_fields__)

#: A bad value of every option: as JSON (open, the gateway, a job line), as submit's flags
#: (None: a switch takes no value), and the field the refusal names.
BAD: dict[str, tuple[Any, list[str] | None, str]] = {
    "window_size": (0, ["--window-size", "0"], "window_size"),
    "first_windows": (0, ["--first-windows", "0"], "first_windows"),
    "device": ("tpu", ["--device", "tpu"], "device"),
    "min_score": (1.5, ["--min-score", "1.5"], "min_score"),
    "min_final_score": ("high", ["--min-final-score", "nan"], "min_final_score"),
    "chain": ("a b", ["--chain", "a b"], "chain"),
    "tenant": ("acme\n", ["--tenant", "acme\n"], "tenant"),
    "boosts": ({"recency_curve": "zigzag"}, ["--boosts", "recency_curve=zigzag"], "boosts.recency_curve"),
    "reference_time": ("yesterday", ["--reference-time", "yesterday"], "reference_time"),
    "query_range": (
        {"start": "x", "end": "y"},
        ["--query-range", "start=x", "--query-range", "end=y"],
        "query_range.start",
    ),
    "ttl_s": (0, ["--ttl-s", "0"], "ttl_s"),
    "idempotency_key": ("a b", ["--idempotency-key", "a b"], "idempotency_key"),
    "budget": ("huge", ["--budget", "huge"], "budget"),
    "keep": (0, ["--keep", "0"], "keep"),
    "allow_shallow": ("yes", None, "allow_shallow"),
    "max_rerank_candidates": (0, ["--max-rerank-candidates", "0"], "max_rerank_candidates"),
    "max_candidates_per_source": (-1, ["--max-candidates-per-source", "-1"], "max_candidates_per_source"),
    "strategy_boosts": (5, ["--strategy-boosts", "graph"], "strategy_boosts"),
    "document_budget": (0, ["--document-budget", "0"], "document_budget"),
    "lane": ("slow", ["--lane", "slow"], "lane"),
    "instruction": ("   ", ["--instruction", "   "], "instruction"),
    "long_documents": ("chunks", ["--long-documents", "chunks"], "long_documents"),
    "passage_tokens": (4, ["--passage-tokens", "4"], "passage_tokens"),
    "passage_stride": (0, ["--passage-stride", "0"], "passage_stride"),
    "passage_cut": ("paragraphs", ["--passage-cut", "paragraphs"], "passage_cut"),
    "passage_aggregate": ("mean", ["--passage-aggregate", "mean"], "passage_aggregate"),
    "passage_top_k": (0, ["--passage-top-k", "0"], "passage_top_k"),
    "max_passages": (0, ["--max-passages", "0"], "max_passages"),
    "first_stage_weight": (1.5, ["--first-stage-weight", "1.5"], "first_stage_weight"),
    "stages": ([{"chain": "fast"}, {"keep": 0}], ["--stages", "fast,:0"], "stages[1].keep"),
}


def test_the_table_of_bad_values_covers_every_option() -> None:
    # A new option gets a bad value here, and with it the refusal checks of every surface.
    assert set(BAD) == FIELDS


def test_every_surface_takes_exactly_the_stream_options() -> None:
    signature = inspect.signature(RerankClient.open)
    keywords = {name for name, p in signature.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == FIELDS
    assert all(signature.parameters[name].default is None for name in FIELDS)
    for name in FIELDS:
        assert f"{name}: {description(option_types()[name])}" in (RerankClient.open.__doc__ or "")

    properties = openapi_document()["components"]["schemas"]["OpenStreamRequest"]["properties"]
    assert set(properties) - {"query", "candidates"} == FIELDS
    for name, annotation in option_types().items():
        assert description(annotation) and properties[name]["description"] == description(annotation)

    assert set(JobLine.__struct_fields__) - {"id", "query", "candidates", "depth"} == FIELDS

    flags = {p.name for p in submit.params if isinstance(p, click.Option)}
    assert FIELDS <= flags
    assert flags - FIELDS == {
        "out_path",
        "fmt",
        "queries",
        "docs",
        "depth",
        "max_in_flight",
        "on_error",
        "tag",
        "progress_every",
        "quiet",
        "as_json",
    }


@pytest.mark.parametrize("name", sorted(BAD))
def test_open_refuses_a_bad_value_naming_the_field(make_client, name) -> None:
    value, _, field = BAD[name]
    with pytest.raises(ValidationError) as err:
        make_client().open("q", make_candidates(3), **{name: value})
    assert err.value.field == field


def test_open_names_an_unknown_option_and_the_one_meant(make_client) -> None:
    with pytest.raises(ValidationError) as err:
        make_client().open("q", make_candidates(3), windw_size=5)
    assert err.value.field == "windw_size" and "did you mean window_size?" in err.value.message


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_job_line_refuses_a_bad_value_naming_the_field(tmp_path, name) -> None:
    value, _, field = BAD[name]
    source = tmp_path / "jobs.jsonl"
    source.write_text(json.dumps({"id": "j", "query": "q", "candidates": [], name: value}) + "\n")
    [bad] = list(jsonl_jobs(source))
    assert isinstance(bad, BadLine) and bad.field == field, bad


def test_a_job_line_takes_every_option(tmp_path) -> None:
    source = tmp_path / "jobs.jsonl"
    line = {
        "id": "j",
        "query": "q",
        "candidates": [],
        "lane": "interactive",
        "first_windows": 2,
        "idempotency_key": "own-key",
        "instruction": "find the runbook",
        "depth": 30,
    }
    source.write_text(json.dumps(line) + "\n")
    [job] = list(jsonl_jobs(source))
    assert isinstance(job, Job)
    assert job.options == {
        "lane": "interactive",
        "first_windows": 2,
        "idempotency_key": "own-key",
        "instruction": "find the runbook",
        "depth": 30,
    }


@pytest.mark.parametrize("name", sorted(name for name, (_, flags, _) in BAD.items() if flags is not None))
def test_a_submit_flag_refuses_a_bad_value_naming_the_flag(tmp_path, name) -> None:
    _, flags, _ = BAD[name]
    assert flags is not None
    source = tmp_path / "jobs.jsonl"
    source.write_text("")
    result = CliRunner().invoke(submit, [str(source), "--out", str(tmp_path / "out.jsonl"), *flags])
    assert result.exit_code == 2, result.output
    assert f"'{flags[0]}'" in result.output  # "Invalid value for '--window-size'", before anything connects


ADDED_FIELD = """    colour: Annotated[Annotated[str, Meta(max_length=8)] | None, Meta(
        description="the colour of a stream, an option this test adds")] = None
"""

PROBE = """
import inspect, json, sys
from pathlib import Path
import producer.options
from producer import RerankClient, ValidationError, load_settings
from producer.gateway.openapi import openapi_document
from rerankq.submit.jobs import jsonl_jobs

client = RerankClient(load_settings())
try:
    client.open("q", [{"id": "a", "text": "t"}], colour="ultraviolet")
    refused = None
except ValidationError as error:
    refused = error.field
stream = client.open("q", [{"id": "a", "text": "t"}], colour="teal")
source = Path(sys.argv[1])
source.write_text(json.dumps({"id": "j", "query": "q", "candidates": [], "colour": "teal"}) + "\\n")
print(json.dumps({
    "module": producer.options.__file__,
    "signature": "colour" in inspect.signature(RerankClient.open).parameters,
    "refused": refused,
    "stream": stream,
    "openapi": openapi_document()["components"]["schemas"]["OpenStreamRequest"]["properties"].get("colour"),
    "job_line": next(jsonl_jobs(source)).options,
}))
"""


def test_a_field_added_to_stream_options_reaches_every_surface(base_env, tmp_path) -> None:
    copy = tmp_path / "tree"
    for package in ("kernel", "producer", "worker", "rerankq", "evaluation"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    options = copy / "producer" / "options.py"
    text = options.read_text()
    # The class body ends at the first top-level statement after it.
    end = re.search(r"\nclass StreamOptions\(.*?\n(?=\S)", text, flags=re.S)
    assert end is not None
    options.write_text(text[: end.end() - 1].rstrip("\n") + "\n" + ADDED_FIELD + "\n\n" + text[end.end() - 1 :])
    env = {**base_env, "PYTHONPATH": str(copy)}

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "jobs.jsonl")],
        env=env,
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert Path(seen["module"]).is_relative_to(copy)  # the edited tree, not the installed one
    assert seen["signature"] and seen["refused"] == "colour" and seen["stream"].startswith("s_")
    assert seen["openapi"]["description"] == "the colour of a stream, an option this test adds"
    assert seen["openapi"]["anyOf"][0] == {"type": "string", "maxLength": 8}
    assert seen["job_line"] == {"colour": "teal"}

    shown = subprocess.run(
        [sys.executable, "-m", "rerankq", "submit", "--help"],
        env=env,
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--colour TEXT" in shown.stdout
    assert "the colour of a stream, an option this test adds" in " ".join(shown.stdout.split())


def test_an_option_not_given_takes_its_setting_or_the_stated_default() -> None:
    settings = load_settings({}, window_size=7, min_score=0.2, stream_ttl_s=60, document_budget=500)
    spec = resolve_spec("q", StreamOptions(), settings, n_candidates=3)
    assert (spec.window_size, spec.min_score, spec.ttl_s, spec.document_budget) == (7, 0.2, 60, 500)
    assert (spec.device, spec.long_documents, spec.passage_top_k, spec.max_passages) == ("cpu", "excerpt", 3, 32)
    assert spec.n_candidates == 3 and spec.reference_time is not None
    asked = StreamOptions(window_size=3, ttl_s=10, min_score=0.5, max_passages=4, long_documents="passages")
    spec = resolve_spec("q", asked, settings)
    assert (spec.window_size, spec.ttl_s, spec.min_score, spec.max_passages) == (3, 10, 0.5, 4)
    assert spec.long_documents == "passages"


def test_the_stream_defaults_are_the_settings_defaults() -> None:
    settings = load_settings({})
    spec = resolve_spec("q", StreamOptions(), settings)
    assert spec.ttl_s == settings.streams.stream_ttl_s
    assert spec.document_budget == settings.streams.document_budget
    assert StreamSpec(query="q", window_size=1).ttl_s == settings.streams.stream_ttl_s
    assert StreamSpec(query="q", window_size=1).document_budget == settings.streams.document_budget
