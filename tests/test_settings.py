"""Settings in sections: one loader, every RERANKQ_* name known or refused, a generated reference."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.errors import ConfigError
from kernel.settings import Settings, load_settings, read_settings, variable
from kernel.settings.reference import render

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "configuration.md"


def refused(environ: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_settings(environ)
    return err.value


# -- names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("RERANKQ_RERANKER_PROVIDR", "RERANKQ_RERANKER_PROVIDER"),
        ("RERANKQ_RERANKER_1_URLL", "RERANKQ_RERANKER_1_URL"),
        ("RERANKQ_BREAKER_FAILURE", "RERANKQ_BREAKER_FAILURES"),
        ("RERANKQ_METRIC_PORT", "RERANKQ_METRICS_PORT"),
        ("RERANKQ_GATEWAY_MAX_BACKLOGG", "RERANKQ_GATEWAY_MAX_BACKLOG"),
    ],
)
def test_an_unknown_name_is_refused_with_the_nearest_real_one(typo, meant):
    error = refused({typo: "1"})
    assert error.variable == typo
    assert str(error) == f"{typo}: unknown setting; did you mean {meant}?"


def test_a_name_near_no_setting_is_refused_without_a_guess():
    error = refused({"RERANKQ_ZZZ": "1"})
    assert error.variable == "RERANKQ_ZZZ" and "did you mean" not in error.message


def test_member_0_may_be_numbered():
    settings = load_settings({"RERANKQ_RERANKER_0_PROVIDER": "embedding", "RERANKQ_RERANKER_1_PROVIDER": "rrf"})
    assert [m.provider for m in settings.chain.effective_members()] == ["embedding", "rrf"]
    same = load_settings({"RERANKQ_RERANKER_PROVIDER": "embedding", "RERANKQ_RERANKER_1_PROVIDER": "rrf"})
    assert same.chain == settings.chain


def test_member_0_set_both_ways_is_an_error_naming_both():
    error = refused(
        {
            "RERANKQ_RERANKER_URL": "http://a:1",
            "RERANKQ_RERANKER_0_URL": "http://b:1",
            "RERANKQ_RERANKER_PROVIDER": "tei",
        }
    )
    assert {error.variable, *re.findall(r"RERANKQ_\w+", error.message)} >= {
        "RERANKQ_RERANKER_URL",
        "RERANKQ_RERANKER_0_URL",
    }


def test_a_bad_value_names_the_variable_it_was_given_as():
    assert (
        refused({"RERANKQ_RERANKER_0_PROVIDER": "tei", "RERANKQ_RERANKER_0_TIMEOUT_S": "0"}).variable
        == "RERANKQ_RERANKER_0_TIMEOUT_S"
    )
    assert refused({"RERANKQ_BREAKER_FAILURES": "0"}).variable == "RERANKQ_BREAKER_FAILURES"


def test_field_paths_map_to_todays_variable_names():
    assert variable("breaker.failures") == "RERANKQ_BREAKER_FAILURES"
    assert variable("queues.cpu_queue") == "RERANKQ_CPU_QUEUE"
    assert variable("metrics.port") == "RERANKQ_METRICS_PORT"
    assert variable("worker.log_level") == "RERANKQ_LOG_LEVEL"
    assert variable("gateway.max_backlog") == "RERANKQ_GATEWAY_MAX_BACKLOG"
    settings = load_settings(
        {"RERANKQ_BREAKER_FAILURES": "5", "RERANKQ_METRICS_PORT": "9100", "RERANKQ_LOG_LEVEL": "debug"},
        redeliver_after_s=7,
    )
    assert (settings.breaker.failures, settings.metrics.port, settings.worker.log_level) == (5, 9100, "debug")
    assert settings.queues.redeliver_after_s == 7


def test_the_file_and_the_environment_are_both_sources(tmp_path):
    path = tmp_path / "rerankq.toml"
    path.write_text('window_size = 10\nreranker_provider = "rrf"\n[breaker]\nfailures = 4\n')
    loaded = read_settings({"RERANKQ_CONFIG_FILE": str(path), "RERANKQ_WINDOW_SIZE": "12"})
    assert (loaded.settings.streams.window_size, loaded.settings.breaker.failures) == (12, 4)
    assert loaded.settings.chain.members[0].provider == "rrf"
    assert loaded.sources["streams.window_size"] == "environment"
    assert loaded.sources["breaker.failures"] == "file"
    assert "queues.cpu_queue" not in loaded.sources  # the default
    path.write_text("window_sise = 10\n")
    assert refused({"RERANKQ_CONFIG_FILE": str(path)}).variable == "RERANKQ_WINDOW_SISE"


# -- the reference -------------------------------------------------------------------


def test_the_configuration_reference_is_generated_from_the_structs():
    assert REFERENCE.read_text() == render(), (
        "docs/configuration.md is stale: python -m kernel.settings.reference > docs/configuration.md"
    )


def test_every_name_in_the_reference_is_a_setting_the_loader_knows():
    # Each row of the reference's tables is one variable.
    names = set(re.findall(r"^\| `(RERANKQ_[A-Z0-9_]+)`", REFERENCE.read_text(), re.MULTILINE))
    members = {
        name.replace("RERANKQ_RERANKER_", f"RERANKQ_RERANKER_{index}_")
        for index in (0, 1, 7)
        for name in names
        if name.startswith("RERANKQ_RERANKER_")
    }
    assert len(names) > 90 and len(members) > 50
    for name in sorted(names | members):
        try:
            load_settings({name: "1"})
        except ConfigError as exc:
            assert "unknown setting" not in exc.message, name


def test_every_field_is_described():
    assert "|  |" not in render() and "| |" not in render()


# -- at a worker's start ----------------------------------------------------------------


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A worker that starts runs until stopped: the timeout is the test failing.
    return subprocess.run(
        [sys.executable, "-m", "worker", "--device", "cpu"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.mark.parametrize(
    ("extra", "variable_named", "said"),
    [
        ({"RERANKQ_RERANKER_PROVIDR": "tei"}, "RERANKQ_RERANKER_PROVIDR", "did you mean RERANKQ_RERANKER_PROVIDER?"),
        ({"RERANKQ_RERANKER_PROVIDER": "tei"}, "RERANKQ_RERANKER_URL", "is required"),
        (
            {"RERANKQ_RERANKER_1_PROVIDER": "cohere", "RERANKQ_RERANKER_1_MODEL": "rerank-v3.5"},
            "RERANKQ_RERANKER_1_API_KEY",
            "is required for the hosted Cohere API",
        ),
        ({"RERANKQ_RERANKER_1_PROVIDER": "no.such.module:Provider"}, "RERANKQ_RERANKER_1_PROVIDER", "cannot import"),
    ],
)
def test_a_member_that_cannot_be_configured_fails_the_start_naming_the_variable(base_env, extra, variable_named, said):
    env = {**base_env, **extra}
    if "RERANKQ_RERANKER_PROVIDER" in extra or "RERANKQ_RERANKER_PROVIDR" in extra:
        env.pop("RERANKQ_RERANKER_MODEL")
    if "RERANKQ_RERANKER_PROVIDER" in extra:
        env.pop("RERANKQ_RERANKER_BACKEND")
    finished = run_worker(env)
    assert finished.returncode == 1
    assert f"{variable_named}: " in finished.stderr and said in finished.stderr


# -- rerankq config ------------------------------------------------------------------------


def test_rerankq_config_prints_the_effective_settings_and_their_sources_with_secrets_masked(tmp_path):
    path = tmp_path / "rerankq.toml"
    path.write_text("window_size = 10\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "RERANKQ_CONFIG_FILE": str(path),
        "RERANKQ_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/0",
        "RERANKQ_RERANKER_PROVIDER": "cohere",
        "RERANKQ_RERANKER_API_KEY": "sk-live-abc123",
        "RERANKQ_RERANKER_MODEL": "rerank-v3.5",
    }
    shown = subprocess.run(
        [sys.executable, "-m", "rerankq", "config", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "hunter2" not in shown and "sk-live-abc123" not in shown
    rows = {row["variable"]: row for row in json.loads(shown)["settings"]}
    assert rows["RERANKQ_WINDOW_SIZE"] == {
        "path": "streams.window_size",
        "variable": "RERANKQ_WINDOW_SIZE",
        "value": 10,
        "source": "file",
    }
    assert rows["RERANKQ_RERANKER_API_KEY"]["value"] == "***"
    assert rows["RERANKQ_RERANKER_API_KEY"]["source"] == "environment"
    assert rows["RERANKQ_REDIS_URL"]["value"] == "redis://:***@127.0.0.1:6379/0"
    assert rows["RERANKQ_BREAKER_FAILURES"] == {
        "path": "breaker.failures",
        "variable": "RERANKQ_BREAKER_FAILURES",
        "value": 3,
        "source": "default",
    }
    table = subprocess.run(
        [sys.executable, "-m", "rerankq", "config", "--changed"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "RERANKQ_WINDOW_SIZE" in table and "RERANKQ_BREAKER_FAILURES" not in table and "hunter2" not in table


def test_rerankq_config_masks_every_secret_a_url_carries():
    """What ``inspect`` and the logs mask, ``config`` masks too: a member URL's query secrets
    and every Sentinel host's password, in the table and in --json."""
    secrets = ["s3cret-one", "s3cret-two", "s3cret-three", "s3cret-four", "s3cret-five", "s3cret-six"]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "RERANKQ_REDIS_URL": f"redis+sentinel://:{secrets[0]}@h1:26379,:{secrets[1]}@h2:26379/svc",
        "RERANKQ_BROKER_URL": f"redis://127.0.0.1:6379/1?password={secrets[2]}",
        "RERANKQ_RERANKER_PROVIDER": "http",
        "RERANKQ_RERANKER_URL": f"https://rerank.example/v1?api_key={secrets[3]}&token={secrets[4]}&region=eu",
        "RERANKQ_RERANKER_1_PROVIDER": "tei",
        "RERANKQ_RERANKER_1_URL": f"https://tei.example/?x-api-key={secrets[5]}",
    }
    for args in (["config", "--json"], ["config"]):
        done = subprocess.run(
            [sys.executable, "-m", "rerankq", *args],
            env={**env, "COLUMNS": "400"},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        for secret in secrets:
            assert secret not in done.stdout, (args, secret)
        assert "region=eu" in done.stdout  # what is not secret stays readable
    rows = {row["variable"]: row["value"] for row in json.loads(done_json(env))["settings"]}
    assert rows["RERANKQ_RERANKER_URL"] == "https://rerank.example/v1?api_key=***&token=***&region=eu"
    assert "h1:26379" in rows["RERANKQ_REDIS_URL"] and "h2:26379/svc" in rows["RERANKQ_REDIS_URL"]


def done_json(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-m", "rerankq", "config", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


# -- bounds --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"RERANKQ_STREAM_TTL_S": "99999999999999999999"}, "RERANKQ_STREAM_TTL_S"),
        ({"RERANKQ_STREAM_TTL_S": "604801"}, "RERANKQ_STREAM_TTL_S"),  # past the longest ttl_s an open takes
        ({"RERANKQ_GATEWAY_STREAM_TTL_S": "604801"}, "RERANKQ_GATEWAY_STREAM_TTL_S"),
        ({"RERANKQ_SWEEP_INTERVAL_S": "inf"}, "RERANKQ_SWEEP_INTERVAL_S"),
        ({"RERANKQ_SWEEP_INTERVAL_S": "nan"}, "RERANKQ_SWEEP_INTERVAL_S"),
        ({"RERANKQ_RERANKER_TIMEOUT_S": "1e-300"}, "RERANKQ_RERANKER_TIMEOUT_S"),
        (
            {"RERANKQ_RERANKER_1_PROVIDER": "rrf", "RERANKQ_RERANKER_1_CONNECT_TIMEOUT_S": "inf"},
            "RERANKQ_RERANKER_1_CONNECT_TIMEOUT_S",
        ),
        ({"RERANKQ_BREAKER_COOLDOWN_S": "inf"}, "RERANKQ_BREAKER_COOLDOWN_S"),
        ({"RERANKQ_GATEWAY_TIMEOUT_S": "1e-300"}, "RERANKQ_GATEWAY_TIMEOUT_S"),
        ({"RERANKQ_SOFT_SHUTDOWN_S": "inf"}, "RERANKQ_SOFT_SHUTDOWN_S"),
        ({"RERANKQ_COALESCE_DELAY_MS": "inf"}, "RERANKQ_COALESCE_DELAY_MS"),
        ({"RERANKQ_CACHE_TTL_S": "99999999999999999999"}, "RERANKQ_CACHE_TTL_S"),
        ({"RERANKQ_EVENT_LOG_MAXLEN": "99999999999999999999"}, "RERANKQ_EVENT_LOG_MAXLEN"),
        ({"RERANKQ_MIN_SCORE": "1.5"}, "RERANKQ_MIN_SCORE"),  # min_score is within [0, 1]
        ({"RERANKQ_MIN_FINAL_SCORE": "inf"}, "RERANKQ_MIN_FINAL_SCORE"),  # min_final_score is finite
        ({"RERANKQ_FLAT_RANGE": "inf"}, "RERANKQ_FLAT_RANGE"),
        ({"RERANKQ_DOCUMENT_BUDGET": "70000"}, "RERANKQ_DOCUMENT_BUDGET"),  # past RERANKQ_MAX_TEXT_CHARS
    ],
    ids=lambda value: next(iter(value.values())) if isinstance(value, dict) else value,
)
def test_a_setting_out_of_the_bounds_of_what_it_feeds_is_refused_at_load(environ, named):
    assert refused(environ).variable == named


def test_rerankq_config_refuses_a_stream_ttl_every_open_would_refuse():
    done = subprocess.run(
        [sys.executable, "-m", "rerankq", "config"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RERANKQ_STREAM_TTL_S": "99999999999999999999"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "RERANKQ_STREAM_TTL_S" in done.stderr, done.stdout[-500:] + done.stderr


def test_every_setting_that_is_an_options_default_has_the_options_bounds():
    """A deployment default is what an open gets when the caller says nothing: it must be a
    value the caller could have said."""
    import typing

    import msgspec

    from kernel.settings.model import SECTIONS
    from kernel.settings.variables import struct_fields
    from producer.options import StreamOptions

    def bounds(annotation):
        found = {}
        stack = [annotation]
        while stack:
            current = stack.pop()
            for meta in getattr(current, "__metadata__", ()):
                if isinstance(meta, msgspec.Meta):
                    found.update(
                        {k: getattr(meta, k) for k in ("gt", "ge", "lt", "le") if getattr(meta, k) is not None}
                    )
            stack.extend(a for a in getattr(current, "__args__", ()) if a is not type(None))
        if isinstance(found.get("gt"), int):  # for integers, > 0 is >= 1
            found["ge"] = found.pop("gt") + 1
        return found

    hints = typing.get_type_hints(StreamOptions, include_extras=True)
    options = {name: bounds(annotation) for name, annotation in hints.items()}
    feeds = {
        ("streams", "stream_ttl_s"): "ttl_s",
        ("gateway", "stream_ttl_s"): "ttl_s",
        ("streams", "min_score"): "min_score",
        ("streams", "window_size"): "window_size",
        ("streams", "document_budget"): "document_budget",
        ("budget", "max_rerank_candidates"): "max_rerank_candidates",
        ("budget", "max_candidates_per_source"): "max_candidates_per_source",
    }
    for (section, name), option in feeds.items():
        field = next(f for f in struct_fields(SECTIONS[section]) if f.name == name)
        setting = bounds(field.annotation)
        for limit, value in options[option].items():
            assert setting.get(limit) == value, (section, name, option, limit, setting)


def test_a_settings_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "rerankq.toml"
    os.mkfifo(fifo)  # a reader would wait for a writer that never comes
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rerankq", "config"],
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RERANKQ_CONFIG_FILE": str(fifo)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("rerankq config still waiting on the FIFO 60 s later")
    assert done.returncode != 0 and "RERANKQ_CONFIG_FILE" in done.stderr and "not a regular file" in done.stderr


def test_the_sections_hold_what_the_flat_struct_held():
    settings = Settings()
    assert settings.queues.all_queues() == ["rerankq.cpu", "rerankq.gpu", "rerankq.any"]
    assert settings.store.broker_kind == "redis"


def test_the_compose_files_own_names_are_accepted_and_ignored():
    # A shell that exports RERANKQ_REDIS_PASSWORD for docker compose still runs rerankq.
    assert load_settings({"RERANKQ_REDIS_PASSWORD": "pw", "RERANKQ_RABBITMQ_PASSWORD": "pw"}) == Settings()


def test_a_bad_member_is_named_by_the_variable_it_was_given_as():
    from worker.chain.member_config import check_member_configs

    loaded = read_settings({"RERANKQ_RERANKER_0_PROVIDER": "tei", "RERANKQ_RERANKER_0_URL": "ftp://tei"})
    with pytest.raises(ConfigError) as err:
        check_member_configs(loaded.settings, loaded.names)
    assert err.value.variable == "RERANKQ_RERANKER_0_URL"
