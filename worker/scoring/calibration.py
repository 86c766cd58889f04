"""Calibrated scores: a member's normalised score mapped to the probability that the document
is relevant, by a monotone map fitted on judgements (``rerankq calibrate``).

The file (``RERANKQ_CALIBRATION``, or ``RERANKQ_CALIBRATION_<PROFILE>`` for a chain profile)
holds one map per member *identity*: what the pair cache keys a member on (provider, model,
URL, scale, backend, request options), less what only moves a score's last digits (precision,
device, export artifact), so a map fitted on a CPU worker serves a GPU one. A map is a list of
breakpoints, applied by linear interpolation and held flat past its ends: applying it needs
no fitting library, and the worker never imports one.

A member with no map in the file, or whose identity is not the one a map was fitted for (a new
model behind the same label), is served uncalibrated, and that is logged once per process.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec
import structlog

from kernel.errors import ConfigError
from kernel.setting_files import read_regular_file

log = structlog.get_logger("rerankq.calibration")

FORMAT = "rerankq-calibration/1"
#: A map is a list of breakpoints per member: a file of thousands of them is a few MB.
MAX_CALIBRATION_BYTES = 16 * 1024 * 1024

#: Cache-identity parts that change a score in its last digits only: not part of what a map is
#: fitted for (a map fitted on fp32 on a CPU serves bf16 on a GPU).
RUN_ONLY_PARTS = frozenset({"precision", "device", "artifact"})


class Fit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What a map was fitted on, and how well it fits there."""

    pairs: int
    positives: int
    #: Mean squared error of the calibrated probability against relevance (0 or 1), on the fit.
    brier: float
    #: Expected calibration error (10 equal-width bins), of the member's score and of the map's, on the fit.
    ece_raw: float
    ece: float


class BlendFit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """How the first-stage weight was chosen: nDCG@10 on held-out queries (cross-validated over
    queries, ``folds`` of them) of the member alone, the first stage alone and the blend."""

    folds: int
    queries: int
    member: float
    first_stage: float
    blend: float


class MemberMap(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One member's map: ``scores`` (normalised member scores, increasing) to ``probabilities``."""

    #: The member's label when it was fitted (``1:embedding``): for people; lookups use the identity.
    label: str
    method: Literal["isotonic", "platt"]
    scores: list[float]
    probabilities: list[float]
    fit: Fit
    #: The first stage's part in the order for this member (``worker.scoring.blend``): 1.0 where
    #: the member did not beat the first stage on held-out queries. None: not fitted (no blend).
    first_stage_weight: float | None = None
    blend_fit: BlendFit | None = None


class CalibrationFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    format: str
    #: The lowest grade that counted as relevant.
    relevant_grade: int
    #: How unjudged documents were read: ``irrelevant`` (as trec_eval counts them) or ``skipped``.
    unjudged: Literal["irrelevant", "skipped"]
    #: What the maps were fitted on (file paths, query count), for people.
    fitted_on: dict[str, Any] = {}
    #: Calibration identity (canonical JSON) -> map.
    members: dict[str, MemberMap] = {}


_decoder = msgspec.json.Decoder(CalibrationFile)
_encoder = msgspec.json.Encoder(order="sorted")


def _without_credentials(value: object) -> object:
    """A URL without user info and query (where a key may ride); anything else as it is."""
    if not isinstance(value, str) or "://" not in value:
        return value
    parts = urlsplit(value)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# A worker asks for the serving member's identity at every window (its map, its first-stage
# weight), and a worker has a handful of members: parse each identity once.
@functools.lru_cache(maxsize=256)
def calibration_identity(cache_identity: str) -> str:
    """A member's cache identity without the parts that only move last digits, as canonical JSON.

    It is written to files, worker cards and logs, so a URL in it loses its user info and query.
    A custom provider's identity that is not a JSON object is kept whole.
    """
    try:
        parts = json.loads(cache_identity)
    except ValueError:
        return cache_identity
    if not isinstance(parts, dict):
        return cache_identity
    kept = {k: _without_credentials(v) for k, v in parts.items() if k not in RUN_ONLY_PARTS}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def declares_ranks(cache_identity: str) -> bool:
    """Whether a member's identity declares its scores ranks (``listwise``): places in an order,
    with nothing in them for a map to calibrate."""
    try:
        parts = json.loads(cache_identity)
    except ValueError:
        return False
    return isinstance(parts, dict) and parts.get("scale") == "rank"


def interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """``numpy.interp(x, xs, ys)``: linear between breakpoints, flat past the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _check_map(identity: str, member: MemberMap, where: str) -> None:
    xs, ys = member.scores, member.probabilities
    field = f"{where}: members[{identity}]"
    if not xs or len(xs) != len(ys):
        raise ConfigError(field, "scores and probabilities must be non-empty and of one length")
    if not all(math.isfinite(v) for v in (*xs, *ys)):
        raise ConfigError(field, "breakpoints must be finite numbers")
    if any(b <= a for a, b in pairwise(xs)):
        raise ConfigError(field, "scores must increase")
    if any(b < a for a, b in pairwise(ys)) or ys[0] < 0 or ys[-1] > 1:
        raise ConfigError(field, "probabilities must be non-decreasing, within [0, 1]")
    weight = member.first_stage_weight
    if weight is not None and not (math.isfinite(weight) and 0.0 <= weight <= 1.0):
        raise ConfigError(f"{field}.first_stage_weight", f"must be between 0 and 1, got {weight}")


def decode(blob: bytes, *, where: str) -> CalibrationFile:
    """A calibration file's contents, checked; a ``ConfigError`` naming ``where`` otherwise."""
    try:
        calibration = _decoder.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(where, f"not a calibration file: {exc}") from None
    if calibration.format != FORMAT:
        raise ConfigError(where, f"format {calibration.format!r}, expected {FORMAT!r}")
    for identity, member in calibration.members.items():
        _check_map(identity, member, where)
    return calibration


def encode(calibration: CalibrationFile) -> bytes:
    return _encoder.encode(calibration)


def read_file(path: str, *, variable: str) -> CalibrationFile:
    """The calibration file at ``path``: a regular file of at most MAX_CALIBRATION_BYTES, the
    same check wherever it is read (a worker's start, ``rerankq config``)."""
    blob = read_regular_file(path, limit=MAX_CALIBRATION_BYTES, variable=variable)
    return decode(blob, where=f"{variable} ({path})")


ScoreMap = Callable[[float], float]


class Calibrations:
    """The maps a worker applies: the default file's, and a chain profile's own where it has one."""

    def __init__(
        self,
        default: CalibrationFile | None,
        profiles: Mapping[str, CalibrationFile] | None = None,
        *,
        paths: Mapping[str | None, str] | None = None,
    ) -> None:
        self.default = default
        self.profiles = dict(profiles or {})
        self.paths = dict(paths or {})
        self._said: set[tuple[str | None, str, str]] = set()

    @classmethod
    def from_settings(cls, settings: Any) -> Calibrations | None:
        """None when no file is configured (nothing is calibrated, nothing logged)."""
        from kernel.settings import calibration_profile_variable

        default = (
            read_file(settings.chain.calibration, variable="RERANKQ_CALIBRATION")
            if settings.chain.calibration
            else None
        )
        profiles = {
            name: read_file(path, variable=calibration_profile_variable(name))
            for name, path in settings.chain.calibration_profiles.items()
        }
        if default is None and not profiles:
            return None
        paths: dict[str | None, str] = {name: path for name, path in settings.chain.calibration_profiles.items()}
        if settings.chain.calibration:
            paths[None] = settings.chain.calibration
        return cls(default, profiles, paths=paths)

    def _file_for(self, profile: str | None) -> tuple[str | None, CalibrationFile | None]:
        if profile is not None and profile.lower() in self.profiles:
            return profile.lower(), self.profiles[profile.lower()]
        return None, self.default

    def first_stage_weight_for(self, *, profile: str | None, cache_identity: str | None) -> float | None:
        """The weight fitted for the member that served, where its map applies (else None)."""
        _, calibration = self._file_for(profile)
        if calibration is None or cache_identity is None or declares_ranks(cache_identity):
            return None
        member = calibration.members.get(calibration_identity(cache_identity))
        return member.first_stage_weight if member is not None else None

    def map_for(self, *, profile: str | None, label: str, cache_identity: str | None) -> ScoreMap | None:
        """The map for the member that served, or None (served uncalibrated, said once per process).

        A member whose scores are ranks has none to have, and no warning says it lacks one."""
        which, calibration = self._file_for(profile)
        if calibration is None or (cache_identity is not None and declares_ranks(cache_identity)):
            return None
        identity = calibration_identity(cache_identity) if cache_identity is not None else ""
        member = calibration.members.get(identity)
        if member is not None:
            xs, ys = member.scores, member.probabilities
            return lambda score: interpolate(xs, ys, score)
        said = (which, label, identity)
        if said not in self._said:
            self._said.add(said)
            fitted_for = [i for i, m in calibration.members.items() if m.label == label]
            reason = "identity_changed" if fitted_for else "no_map"
            log.warning(
                "member_uncalibrated",
                member=label,
                reason=reason,
                identity=identity or None,
                fitted_for=fitted_for[0] if fitted_for else None,
                file=self.paths.get(which),
                profile=which,
            )
        return None
