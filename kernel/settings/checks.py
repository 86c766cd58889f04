"""The checks that span fields (a field's own limit is in its type): each names the variable to fix."""

from __future__ import annotations

import math

from kernel.errors import ConfigError
from kernel.settings.model import Settings
from kernel.settings.variables import (
    calibration_profile_variable,
    chain_profile_variable,
    member_variable,
    variable,
)


def check(settings: Settings, member_names: dict[tuple[int, str], str] | None = None) -> None:
    """Raise ConfigError naming a variable when two settings cannot hold together.

    ``member_names``: the variable each member field was read from (member 0's may be
    ``RERANKQ_RERANKER_0_*``), so an error names what the user set.
    """
    _check_window_size(settings)
    _check_broker_timeouts(settings)
    _check_profiles(settings)
    _check_stream_defaults(settings)
    _check_budget(settings)
    _check_members(settings, member_names or {})
    _check_urls(settings)
    _check_gateway(settings)


def _check_window_size(settings: Settings) -> None:
    streams = settings.streams
    if streams.window_size > streams.max_window_size:
        raise ConfigError(
            variable("streams.window_size"),
            f"{streams.window_size} exceeds RERANKQ_MAX_WINDOW_SIZE={streams.max_window_size}",
        )


def _check_broker_timeouts(settings: Settings) -> None:
    # A window's attempt is bounded by redeliver_after_s (its lease and time limit); a broker
    # timeout under that would hand a running window to a second worker. Each broker has its own.
    queues, store = settings.queues, settings.store
    if store.broker_kind == "redis" and queues.visibility_timeout_s <= queues.redeliver_after_s:
        raise ConfigError(
            variable("queues.visibility_timeout_s"),
            f"must exceed RERANKQ_REDELIVER_AFTER_S={queues.redeliver_after_s} (Redis broker)",
        )
    if store.broker_kind == "amqp" and queues.amqp_consumer_timeout_s <= queues.redeliver_after_s:
        raise ConfigError(
            variable("queues.amqp_consumer_timeout_s"),
            f"must exceed RERANKQ_REDELIVER_AFTER_S={queues.redeliver_after_s} (RabbitMQ broker)",
        )


def _check_profiles(settings: Settings) -> None:
    n_members = len(settings.chain.effective_members())
    for name, indexes in settings.chain.profiles.items():
        if not indexes or len(set(indexes)) != len(indexes) or not all(0 <= i < n_members for i in indexes):
            raise ConfigError(
                chain_profile_variable(name),
                f"must name distinct members 0..{n_members - 1} of the chain, got {indexes}",
            )
    for name in settings.chain.calibration_profiles:
        if name not in settings.chain.profiles:
            raise ConfigError(
                calibration_profile_variable(name),
                f"names no chain profile ({chain_profile_variable(name)} is not set)",
            )


def _check_stream_defaults(settings: Settings) -> None:
    """Defaults of stream options: each within what a caller could ask for (the types hold the rest)."""
    streams = settings.streams
    if streams.document_budget > streams.max_text_chars:
        raise ConfigError(
            variable("streams.document_budget"),
            f"{streams.document_budget} exceeds RERANKQ_MAX_TEXT_CHARS={streams.max_text_chars}",
        )
    for path, value in (
        ("streams.min_final_score", streams.min_final_score),
        ("chain.flat_range", settings.chain.flat_range),
    ):
        if value is not None and not math.isfinite(value):
            raise ConfigError(variable(path), f"must be a finite number, got {value}")


def _check_gateway(settings: Settings) -> None:
    gateway = settings.gateway
    if gateway.timeout_s > gateway.max_timeout_s:
        raise ConfigError(
            variable("gateway.timeout_s"), f"exceeds RERANKQ_GATEWAY_MAX_TIMEOUT_S={gateway.max_timeout_s}"
        )
    if gateway.tenant_max_streams + gateway.tenant_max_requests >= gateway.redis_max_connections:
        raise ConfigError(
            variable("gateway.redis_max_connections"),
            f"must exceed RERANKQ_GATEWAY_TENANT_MAX_STREAMS + _TENANT_MAX_REQUESTS "
            f"({gateway.tenant_max_streams + gateway.tenant_max_requests}), so one tenant "
            "cannot take every connection",
        )
    if gateway.keys_file and gateway.keys:
        raise ConfigError(variable("gateway.keys"), "give the keys in a file or in the variable, not both")


def _check_urls(settings: Settings) -> None:
    from kernel.redis_clients import check_url  # imports no settings: no cycle

    store = settings.store
    for field in ("redis_url", "broker_url"):
        url = getattr(store, field)
        if url:
            check_url(url, variable(f"store.{field}"), broker=field == "broker_url")
    if store.broker_kind == "amqp" and not store.redis_url:
        raise ConfigError(variable("store.redis_url"), "is required with a RabbitMQ broker: Redis stays the store")
    if not store.broker_url and store.redis_url and store.redis_url.startswith("redis+cluster://"):
        raise ConfigError(
            variable("store.broker_url"),
            "is required with a redis+cluster:// store: Celery has no Redis Cluster transport "
            "(one Redis, redis+sentinel:// or amqp://)",
        )


#: Each int8 recipe a member's QUANTIZATION names: the backends that make it, and whether it
#: calibrates on windows (worker/engine/int8_recipes.py makes them; a test holds the two alike).
INT8_RECIPES: dict[str, tuple[tuple[str, ...], bool]] = {
    "int8": (("onnx", "openvino"), True),
    "int8-ffn": (("onnx", "openvino"), True),
    "int8-weights": (("openvino",), False),
    "int8-dynamic": (("onnx",), False),
}


def _check_members(settings: Settings, names: dict[tuple[int, str], str]) -> None:
    def name(index: int, field: str) -> str:
        return names.get((index, field)) or member_variable(index, field)

    for index, member in enumerate(settings.chain.members):
        if member.quantization == "none":
            continue
        backends, calibrated = INT8_RECIPES[member.quantization]
        if member.backend not in backends:
            raise ConfigError(
                name(index, "quantization"),
                f"{member.quantization} needs {name(index, 'backend')}={' or '.join(backends)}",
            )
        if calibrated and not member.calibration:
            raise ConfigError(
                name(index, "calibration"),
                f"is required with {name(index, 'quantization')}={member.quantization}: "
                "a JSON-lines file of real windows to calibrate on",
            )


def _check_budget(settings: Settings) -> None:
    from kernel.errors import ValidationError
    from kernel.strategy_boosts import parse_strategy_boosts

    try:
        parse_strategy_boosts(settings.budget.strategy_boosts)
    except ValidationError as exc:
        raise ConfigError(variable("budget.strategy_boosts"), exc.message) from None
