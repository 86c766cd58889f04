"""A cascade's stages: the ``stages`` option read, resolved into the spec's ``later_stages`` and
checked against the deployment.

The first stage is the stream itself: its chain is the stream's ``chain``, and its ``keep``
caps the candidates as ``max_rerank_candidates`` does (it reads the fused list's best). Each
later stage re-reads the previous stage's best ``keep`` rows (``kernel/store.lua`` hands them
on once they are known), so a cascade narrows: a later stage's ``keep`` is at most the one
before it. Budgets are a later stage's only: the first scores every window it reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from kernel.cost import most_window_cost
from kernel.errors import ValidationError
from kernel.field_errors import from_msgspec
from kernel.limits import MAX_STAGES
from kernel.settings import Settings
from kernel.wire import Stage
from producer.options import StageOption, StreamOptions

_BUDGETS = ("max_pairs", "max_tokens", "max_seconds")


def parse_stages(value: list[StageOption] | str) -> list[StageOption]:
    """The option as given: a list of stages, or the text form ``chain:keep,chain:keep``
    (``chain`` alone, or ``:keep`` for the whole chain)."""
    if not isinstance(value, str):
        return value
    stages = []
    for i, part in enumerate(value.split(",")):
        chain, sep, keep = part.strip().partition(":")
        if sep and not keep.strip().isdigit():
            raise ValidationError(f"stages[{i}]", f"{part.strip()!r} is not chain:keep (a profile name and a count)")
        fields = {"chain": chain or None, **({"keep": int(keep)} if sep else {})}
        try:
            stages.append(msgspec.convert(fields, StageOption))
        except msgspec.ValidationError as exc:
            error = from_msgspec(exc)
            raise ValidationError(
                f"stages[{i}].{error.field}" if error.field else f"stages[{i}]", error.message
            ) from None
    if not 1 <= len(stages) <= MAX_STAGES:
        raise ValidationError("stages", f"between 1 and {MAX_STAGES} stages, got {len(stages)}")
    return stages


def with_stages_read(options: StreamOptions) -> StreamOptions:
    """``options`` with ``stages`` as a list, the first stage's chain as the stream's and its
    ``keep`` folded into ``max_rerank_candidates``; each later stage's keep checked present and
    narrowing, and no budget on the first."""
    if options.stages is None:
        return options
    stages = parse_stages(options.stages)
    first = stages[0]
    if options.chain is not None:
        raise ValidationError("chain", "a cascade names its first stage's chain in stages[0].chain, not in chain")
    for name in (*_BUDGETS, "window_size"):
        if getattr(first, name) is not None:
            raise ValidationError(
                f"stages[0].{name}", "the first stage has none: it scores the stream's own windows (window_size)"
            )
    previous = first.keep
    for i, stage in enumerate(stages[1:], start=1):
        if stage.keep is None:
            raise ValidationError(f"stages[{i}].keep", "a later stage reads the previous stage's best keep rows")
        if previous is not None and stage.keep > previous:
            raise ValidationError(f"stages[{i}].keep", f"at most the previous stage's keep ({previous})")
        previous = stage.keep
    cap = options.max_rerank_candidates
    if first.keep is not None:
        cap = first.keep if cap is None else min(cap, first.keep)
    return msgspec.structs.replace(options, stages=stages, chain=first.chain, max_rerank_candidates=cap)


def later_stages(options: StreamOptions, settings: Settings) -> list[Stage]:
    """The spec's ``later_stages`` from options already read by ``with_stages_read``: a later
    stage's window is its keep, up to ``RERANKQ_MAX_WINDOW_SIZE``, unless it says."""
    if not isinstance(options.stages, list):
        return []
    return [
        Stage(
            keep=s.keep,
            window_size=s.window_size or min(s.keep, settings.streams.max_window_size),
            chain=s.chain,
            max_pairs=s.max_pairs,
            max_tokens=s.max_tokens,
            max_seconds=s.max_seconds,
        )
        for s in options.stages[1:]
        if s.keep is not None
    ]


def check_stage_costs(stages: Sequence[Stage], candidate_costs: Sequence[int], settings: Settings) -> None:
    """Refuse, naming the stage's window size, a later stage whose window of its costliest
    candidates could outlive the task's time limit (``kernel.cost.check_window_costs``'s rule)."""
    costliest = sorted(candidate_costs, reverse=True)
    limit = most_window_cost(settings)
    for i, stage in enumerate(stages, start=1):
        worst = sum(costliest[: stage.window_size])
        if worst > limit:
            raise ValidationError(
                f"stages[{i}].window_size",
                f"a window of its {stage.window_size} costliest candidates would cost about {worst} tokens, past "
                "what a worker scores within the task's time limit: lower the stage's window_size",
            )
