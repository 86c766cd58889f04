"""A stream's ``StreamSpec`` from its options and the deployment's settings, resolved in one place.

Each field is the option as given, else the streams setting that stands for it
(``RERANKQ_WINDOW_SIZE``, ``RERANKQ_MIN_SCORE``, ...), else ``StreamSpec``'s own default
(``kernel.stream_defaults``): ``RerankClient.open`` and the gateway's rerank routes both build
their spec here, so neither can drift from the other. The spec is not yet checked against the
deployment's limits: that is ``producer.validation.check_spec``'s job.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

from kernel.settings import Settings
from kernel.wire import StreamSpec
from producer.budget import BudgetLimits, limits_for
from producer.options import StreamOptions
from producer.stages import later_stages

T = TypeVar("T")

#: The options copied into the spec as they are; a missing one takes ``StreamSpec``'s default.
_AS_GIVEN = (
    "device",
    "chain",
    "tenant",
    "boosts",
    "query_range",
    "instruction",
    "long_documents",
    "passage_tokens",
    "passage_stride",
    "passage_cut",
    "passage_aggregate",
    "passage_top_k",
    "max_passages",
    "first_stage_weight",
)


def resolve_spec(
    query: str,
    options: StreamOptions,
    settings: Settings,
    *,
    n_candidates: int = 0,
    limits: BudgetLimits | None = None,
) -> StreamSpec:
    """The spec of a stream of ``n_candidates`` opened with ``options``. ``limits``: the open's
    budget limits when the caller has them already (their strategy boosts are the stream's);
    without, they are worked out from ``options`` and ``settings``. A stream without a
    reference time is measured from now."""
    streams = settings.streams
    if limits is None:
        limits = limits_for(
            settings,
            budget=options.budget,
            max_rerank_candidates=options.max_rerank_candidates,
            max_candidates_per_source=options.max_candidates_per_source,
            strategy_boosts=options.strategy_boosts,
        )
    fields: dict[str, Any] = {name: getattr(options, name) for name in _AS_GIVEN if getattr(options, name) is not None}
    return StreamSpec(
        query=query,
        window_size=_given_or(options.window_size, streams.window_size),
        min_score=_given_or(options.min_score, streams.min_score),
        min_final_score=_given_or(options.min_final_score, streams.min_final_score),
        document_budget=_given_or(options.document_budget, streams.document_budget),
        ttl_s=_given_or(options.ttl_s, streams.stream_ttl_s),
        reference_time=options.reference_time or dt.datetime.now(dt.timezone.utc),
        strategy_boosts=dict(limits.strategy_boosts),
        n_candidates=n_candidates,
        later_stages=later_stages(options, settings),
        **fields,
    )


def _given_or(given: T | None, setting: T) -> T:
    return given if given is not None else setting
