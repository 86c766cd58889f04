"""The one loader: every ``RERANKQ_*`` name read once, mapped to its field, unknown names refused.

Order of precedence: the file named by ``RERANKQ_CONFIG_FILE`` (TOML; the same names in lower
case without the prefix, or a table per section), then the environment, then keyword
overrides (``load_settings(env, breaker_failures=5)``: a variable's name without the prefix,
in lower case; ``members=[...]``, ``chain_profiles={...}`` or a whole section by its name).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from kernel.errors import ConfigError
from kernel.field_errors import from_msgspec
from kernel.setting_files import read_regular_file
from kernel.settings.checks import check
from kernel.settings.members import MemberSettings
from kernel.settings.model import SECTIONS, Settings
from kernel.settings.secret import Secret
from kernel.settings.variables import (
    CALIBRATION_PROFILE_PREFIX,
    CHAIN_PROFILE_PREFIX,
    CONFIG_FILE,
    DEPLOYMENT_NAMES,
    MEMBER_FIELDS,
    MEMBER_PREFIX,
    OVERRIDES,
    PREFIX,
    VARIABLES,
    member_variable,
    section_prefix,
)

#: What a shell can export; any other name (one ending in a newline) is nobody's setting.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MEMBER = re.compile(rf"{MEMBER_PREFIX}(?:(0|[1-9][0-9]*)_)?([A-Za-z0-9_]+)")
_PROFILE = re.compile(rf"{CHAIN_PROFILE_PREFIX}([A-Za-z0-9_]{{1,64}})")
_CALIBRATION_PROFILE = re.compile(rf"{CALIBRATION_PROFILE_PREFIX}([A-Za-z0-9_]{{1,64}})")

#: Sections where an empty variable means "unset" (the default), as the gateway has always read them.
_BLANK_IS_UNSET = {"gateway"}
#: Keyword overrides for the fields read from a family of variables.
FAMILIES = {
    "members": "chain.members",
    "chain_profiles": "chain.profiles",
    "calibration_profiles": "chain.calibration_profiles",
}

#: A settings file is a few hundred lines of TOML.
MAX_CONFIG_FILE_BYTES = 1024 * 1024

DEFAULT = "default"
ENVIRONMENT = "environment"
FILE = "file"
OVERRIDE = "override"


@dataclass
class Loaded:
    """Settings and where each came from: field path -> ``environment``, ``file`` or ``override``
    (absent: the default). Member fields are ``chain.members[1].url``, profiles ``chain.profiles.fast``."""

    settings: Settings
    sources: dict[str, str] = field(default_factory=dict)
    #: The variable each path was read from (member 0 may have been given as RERANKQ_RERANKER_0_*).
    names: dict[str, str] = field(default_factory=dict)
    file: str | None = None


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read settings: optional file (``RERANKQ_CONFIG_FILE``), then the environment, then overrides."""
    return read_settings(environ, **overrides).settings


def read_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Loaded:
    """``load_settings``, keeping where each value came from (what ``rerankq config`` prints)."""
    environ = os.environ if environ is None else environ
    path = environ.get(CONFIG_FILE) or None
    loaded = Loaded(settings=Settings(), file=path)
    gathered = _Gathered()
    for name, (value, source) in _given(environ, path).items():
        _take_variable(gathered, loaded, name, value, source)
    for key, value in overrides.items():
        _take_override(gathered, loaded, key, value)
    settings = Settings(**_sections(gathered, loaded))
    check(settings, gathered.member_names)
    loaded.settings = settings
    return loaded


@dataclass
class _Gathered:
    """What the file, the environment and the overrides said, before conversion."""

    raw: dict[str, dict[str, Any]] = field(default_factory=lambda: {section: {} for section in SECTIONS})
    member_raw: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The variable each member field was read from, to refuse member 0 given twice.
    member_names: dict[tuple[int, str], str] = field(default_factory=dict)
    profiles: dict[str, list[int]] = field(default_factory=dict)
    calibration_profiles: dict[str, str] = field(default_factory=dict)
    #: A whole section given as an override, and the members given as one.
    chosen: dict[str, Any] = field(default_factory=dict)
    members: list[MemberSettings] | None = None


def _given(environ: Mapping[str, str], path: str | None) -> dict[str, tuple[Any, str]]:
    """Every setting's name with its value and source; the environment wins over the file."""
    given: dict[str, tuple[Any, str]] = {}
    if path:
        for name, value in _read_file(path).items():
            given[name] = (value, FILE)
    for name, value in environ.items():
        if _is_setting_name(name):
            given[name] = (value, ENVIRONMENT)
    return given


def _is_setting_name(name: str) -> bool:
    return (
        name.startswith(PREFIX)
        and name != CONFIG_FILE
        and name not in DEPLOYMENT_NAMES
        and _IDENTIFIER.fullmatch(name) is not None
    )


def _take_variable(gathered: _Gathered, loaded: Loaded, name: str, value: Any, source: str) -> None:
    """File it under its section's field, its member, or its profile; an unknown name is refused."""
    if name in VARIABLES:
        _take_field(gathered, loaded, name, value, source)
    elif (match := _MEMBER.fullmatch(name)) and match.group(2).lower() in MEMBER_FIELDS:
        _take_member_field(gathered, loaded, name, value, source, int(match.group(1) or 0), match.group(2).lower())
    elif match := _PROFILE.fullmatch(name):
        gathered.profiles[match.group(1).lower()] = _profile(name, value)
        _record(loaded, f"chain.profiles.{match.group(1).lower()}", source, name)
    elif match := _CALIBRATION_PROFILE.fullmatch(name):
        if value:
            gathered.calibration_profiles[match.group(1).lower()] = str(value)
        _record(loaded, f"chain.calibration_profiles.{match.group(1).lower()}", source, name)
    else:
        raise ConfigError(name, unknown_message(name))


def _record(loaded: Loaded, key: str, source: str, name: str) -> None:
    loaded.sources[key], loaded.names[key] = source, name


def _take_field(gathered: _Gathered, loaded: Loaded, name: str, value: Any, source: str) -> None:
    var = VARIABLES[name]
    if value == "" and var.section in _BLANK_IS_UNSET:
        return
    gathered.raw[var.section][var.field.name] = None if value == "" and var.field.nullable else value
    _record(loaded, var.path, source, name)


def _take_member_field(
    gathered: _Gathered, loaded: Loaded, name: str, value: Any, source: str, index: int, member_field: str
) -> None:
    if (index, member_field) in gathered.member_names:
        raise ConfigError(
            name,
            f"set as well as {gathered.member_names[index, member_field]}; both are member "
            f"{index}'s {member_field.upper()} (RERANKQ_RERANKER_0_* is member 0): "
            "set one",
        )
    gathered.member_names[index, member_field] = name
    # Kept as given: an empty member value may mean something (INSTRUCTION_FIELD= is "none").
    gathered.member_raw.setdefault(index, {})[member_field] = value
    _record(loaded, f"chain.members[{index}].{member_field}", source, name)


def _take_override(gathered: _Gathered, loaded: Loaded, key: str, value: Any) -> None:
    """A keyword override: a whole section, a family of variables, or one variable's field."""
    if key in SECTIONS:
        gathered.chosen[key] = value
    elif key == "members":
        gathered.members = list(value)
        loaded.sources["chain.members"] = OVERRIDE
    elif key == "chain_profiles":
        gathered.profiles = dict(value)
        loaded.sources["chain.profiles"] = OVERRIDE
    elif key == "calibration_profiles":
        gathered.calibration_profiles = dict(value)
        loaded.sources["chain.calibration_profiles"] = OVERRIDE
    elif key in OVERRIDES:
        section, _, name = OVERRIDES[key].partition(".")
        gathered.raw[section][name] = value
        loaded.sources[OVERRIDES[key]] = OVERRIDE
    else:
        close = difflib.get_close_matches(key, [*OVERRIDES, *SECTIONS, *FAMILIES], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise TypeError(f"load_settings() got an unknown setting {key!r}{hint}")


def _sections(gathered: _Gathered, loaded: Loaded) -> dict[str, Any]:
    """Each section converted from what was gathered for it, or as given whole."""
    sections: dict[str, Any] = {}
    for section, struct in SECTIONS.items():
        if section in gathered.chosen:
            sections[section] = gathered.chosen[section]
            continue
        values = gathered.raw[section]
        if section == "chain":
            values = {
                **values,
                "profiles": gathered.profiles,
                "calibration_profiles": gathered.calibration_profiles,
                "members": gathered.members
                if gathered.members is not None
                else _members(gathered.member_raw, gathered.member_names),
            }
        sections[section] = _convert(values, struct, lambda f, s=section: _field_variable(s, f, loaded))
    return sections


def override(settings: Settings, **overrides: Any) -> Settings:
    """A copy of ``settings`` with some fields replaced, named as ``load_settings`` names them
    (``device="cuda"``, ``torch_threads=4``); not checked again."""
    changed: dict[str, dict[str, Any]] = {}
    paths = {**OVERRIDES, **FAMILIES}
    for key, value in overrides.items():
        if key not in paths:
            raise TypeError(f"override() got an unknown setting {key!r}")
        section, _, name = paths[key].partition(".")
        changed.setdefault(section, {})[name] = value
    return msgspec.structs.replace(
        settings,
        **{
            section: msgspec.structs.replace(getattr(settings, section), **fields)
            for section, fields in changed.items()
        },
    )


def unknown_message(name: str) -> str:
    """``unknown setting; did you mean RERANKQ_RERANKER_PROVIDER?`` for a name no field has."""
    match = re.match(rf"{MEMBER_PREFIX}(0|[1-9][0-9]*)_", name)
    candidates = [*VARIABLES, CONFIG_FILE, *(member_variable(0, f) for f in MEMBER_FIELDS)]
    if match:
        candidates += [f"{match.group(0)}{f.upper()}" for f in MEMBER_FIELDS]
    # Compared without the prefix every name shares, which would make anything look close.
    by_suffix = {c[len(PREFIX) :]: c for c in candidates}
    close = difflib.get_close_matches(name[len(PREFIX) :], list(by_suffix), n=1, cutoff=0.7)
    if close:
        return f"unknown setting; did you mean {by_suffix[close[0]]}?"
    return "unknown setting (rerankq config lists them all; docs/configuration.md describes them)"


def _field_variable(section: str, field_name: str, loaded: Loaded) -> str:
    from kernel.settings.variables import variable_name

    return loaded.names.get(f"{section}.{field_name}") or variable_name(section, field_name)


def _read_file(path: str) -> dict[str, Any]:
    """The file's settings by variable name: ``window_size = 10``, or ``[breaker] failures = 5``."""
    raw = read_regular_file(path, limit=MAX_CONFIG_FILE_BYTES, variable=CONFIG_FILE)
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(CONFIG_FILE, f"cannot read {path}: {exc}") from None
    names: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            prefix = PREFIX + section_prefix(key)
            names.update({prefix + k.upper(): v for k, v in value.items()})
        else:
            names[PREFIX + key.upper()] = value
    return names


def _profile(name: str, value: Any) -> list[int]:
    parts = value if isinstance(value, list) else str(value).split(",")
    try:
        return [int(part) for part in parts]
    except (TypeError, ValueError):
        raise ConfigError(name, f"must be comma-separated member indexes such as 0,2; got {value!r}") from None


def _members(raw: dict[int, dict[str, Any]], names: dict[tuple[int, str], str]) -> list[MemberSettings]:
    if not raw:
        return []
    last = max(raw)
    members: list[MemberSettings] = []
    for index in range(last + 1):
        fields = raw.get(index)
        if fields is None and index > 0:
            later = min(i for i in raw if i > index)
            first = names[next(key for key in sorted(names) if key[0] == later)]
            raise ConfigError(
                first, f"is set but {member_variable(index, 'provider')} is not; members are contiguous from 1"
            )
        if index > 0 and fields is not None and "provider" not in fields:  # a gap raised above
            raise ConfigError(member_variable(index, "provider"), "is required when any member setting is given")
        members.append(
            _convert(fields or {}, MemberSettings, lambda f, i=index: names.get((i, f)) or member_variable(i, f))
        )
    return members


def _decode(type_: type, value: Any) -> Any:
    if type_ is Secret:
        if isinstance(value, Secret):
            return value
        if isinstance(value, str):
            return Secret(value)
    raise NotImplementedError


def _convert(raw: Mapping[str, Any], type_: type, variable_of: Any) -> Any:
    try:
        return msgspec.convert(dict(raw), type_, strict=False, dec_hook=_decode)
    except msgspec.ValidationError as exc:
        # msgspec says "... - at `$.field`"; name the variable instead. The value is not
        # repeated: it may be a secret.
        error = from_msgspec(exc)
        field = error.field.split(".", 1)[0].split("[", 1)[0]
        message = error.message
        if message.startswith("Expected "):
            message = "must be " + message[len("Expected ") :].replace("`", "")
        raise ConfigError(variable_of(field) if field else "RERANKQ_*", message) from None
