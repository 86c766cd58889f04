"""Typed configuration in sections, read once from ``RERANKQ_*`` variables (and an optional TOML file).

Settings are built at the edge (a client, a worker process, the gateway) and passed in;
nothing deeper reads the environment. Each section is a small struct in its own module;
``loader`` reads them all, and refuses a ``RERANKQ_*`` name no field has.

Where a variable lives: ``RERANKQ_`` + the section's prefix + the field in capitals
(``kernel.settings.variables``). The variable names are the ones users set, so a new
setting keeps the flat name it would have had and goes in the section below that owns it:

=========  ========================================================  ===============================
section    flat names (``RERANKQ_`` + ...)                           field path
=========  ========================================================  ===============================
store      REDIS_URL, BROKER_URL, NAMESPACE                          ``store.redis_url``
queues     CPU_QUEUE, GPU_QUEUE, ANY_QUEUE, MAX_ATTEMPTS,             ``queues.redeliver_after_s``
           REDELIVER_AFTER_S, VISIBILITY_TIMEOUT_S,
           AMQP_CONSUMER_TIMEOUT_S, QUEUED_MAX_AGE_S, SWEEP_INTERVAL_S
streams    WINDOW_SIZE, MAX_WINDOW_SIZE, MIN_SCORE, MIN_FINAL_SCORE,  ``streams.window_size``
           STREAM_TTL_S, MAX_CANDIDATES, MAX_QUERY_CHARS,
           MAX_TEXT_CHARS, DOCUMENT_BUDGET, MAX_STREAM_BYTES,
           EVENT_LOG_MAXLEN
fairness   TENANT_QUEUED_WINDOWS, TENANT_QUEUED_TOKENS,               ``fairness.tenant_queued_windows``
           SCORING_TOKENS_PER_S, TENANT_MAX_WAITING[_TOKENS]
budget     MAX_RERANK_CANDIDATES[_LOW|_MID|_HIGH],                    ``budget.strategy_boosts``
           MAX_CANDIDATES_PER_SOURCE, STRATEGY_BOOSTS
worker     DEVICE, WORKER_PROCESSES, TORCH_THREADS, SOFT_SHUTDOWN_S,  ``worker.device``
           TASK_EVENTS, LOG_LEVEL, REMOTE_CONTROL_COMMANDS
engine     PRECISION, TOKEN_BUDGET, COALESCE, COALESCE_DELAY_MS,      ``engine.precision``
           COALESCE_MAX_PAIRS
chain      FLAT_MIN_WINDOW, FLAT_RANGE, MEMBER_RESTART_S,             ``chain.flat_range``
           PAIR_CACHE, PAIR_CACHE_SHARED_ACROSS_TENANTS, CACHE_TTL_S;
           CALIBRATION; CHAIN_<NAME> (profiles);                      ``chain.profiles``
           CALIBRATION_<PROFILE> (a profile's calibration file)       ``chain.calibration_profiles``
           RERANKER_[<n>_]<FIELD> (members, ``members.py``)           ``chain.members[n].url``
breaker    BREAKER_FAILURES, BREAKER_COOLDOWN_S                       ``breaker.failures``
metrics    METRICS_PORT, METRICS_HOST, METRICS_DIR                    ``metrics.port``
exporter   EXPORTER_PORT                                              ``exporter.port``
gateway    GATEWAY_<FIELD> (``gateway.py``)                           ``gateway.max_backlog``
=========  ========================================================  ===============================

``RERANKQ_CONFIG_FILE`` names the file; ``RERANKQ_RERANKER_0_<FIELD>`` is member 0, like the
unindexed names. The reference, ``docs/configuration.md``, is generated from these structs:
``python -m kernel.settings.reference > docs/configuration.md``.
"""

from kernel.settings.breaker import BreakerSettings
from kernel.settings.budget import BudgetSettings
from kernel.settings.chain import ChainSettings
from kernel.settings.default_chain import (
    DEFAULT_MODEL,
    PACKAGED_EMBEDDING_MODULE,
    default_members,
    packaged_embedding_installed,
)
from kernel.settings.engine import EngineSettings
from kernel.settings.exporter import ExporterSettings
from kernel.settings.fairness import FairnessSettings
from kernel.settings.gateway import GatewaySettings
from kernel.settings.loader import Loaded, load_settings, override, read_settings
from kernel.settings.members import MemberSettings
from kernel.settings.metrics import MetricsSettings
from kernel.settings.model import SECTIONS, Settings
from kernel.settings.queues import QueueSettings
from kernel.settings.secret import Secret
from kernel.settings.store import StoreSettings
from kernel.settings.streams import StreamSettings
from kernel.settings.variables import (
    CALIBRATION_PROFILE_PREFIX,
    CHAIN_PROFILE_PREFIX,
    CONFIG_FILE,
    MEMBER_PREFIX,
    PREFIX,
    calibration_profile_variable,
    chain_profile_variable,
    member_variable,
    variable,
)
from kernel.settings.worker import WorkerSettings

__all__ = [
    "CALIBRATION_PROFILE_PREFIX",
    "CHAIN_PROFILE_PREFIX",
    "CONFIG_FILE",
    "DEFAULT_MODEL",
    "MEMBER_PREFIX",
    "PACKAGED_EMBEDDING_MODULE",
    "PREFIX",
    "SECTIONS",
    "BreakerSettings",
    "BudgetSettings",
    "ChainSettings",
    "EngineSettings",
    "ExporterSettings",
    "FairnessSettings",
    "GatewaySettings",
    "Loaded",
    "MemberSettings",
    "MetricsSettings",
    "QueueSettings",
    "Secret",
    "Settings",
    "StoreSettings",
    "StreamSettings",
    "WorkerSettings",
    "calibration_profile_variable",
    "chain_profile_variable",
    "default_members",
    "load_settings",
    "member_variable",
    "override",
    "packaged_embedding_installed",
    "read_settings",
    "variable",
]
