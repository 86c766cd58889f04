"""API keys: stored hashed, compared in constant time, each mapped to a tenant, a chain
profile and the devices it may use.

The key file (``RERANKQ_GATEWAY_KEYS_FILE``, or the same JSON in ``RERANKQ_GATEWAY_KEYS``)
holds no key, only its SHA-256::

    [{"key_sha256": "3b1f…", "tenant": "acme", "chain": "private", "devices": ["cpu", "gpu"]}]

Keys are 256 random bits (``rerankq serve keygen``), so a plain SHA-256 cannot
be reversed by guessing, and a slow password hash would only add milliseconds to every
request. A presented key is hashed and compared with every stored digest by
``hmac.compare_digest``, without stopping at a match, so the time taken says nothing about
which digest, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

import msgspec

from kernel.errors import ConfigError
from kernel.setting_files import read_regular_file
from kernel.settings import Settings, chain_profile_variable
from producer.gateway.config import Device, GatewaySettings, variable
from producer.gateway.problems import Problem

ALL_DEVICES: tuple[Device, ...] = ("cpu", "gpu", "any")
_DIGEST = re.compile(r"[0-9a-f]{64}")
TENANT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
KEY_PREFIX = "rq_"
#: A keys file of a hundred thousand entries is 15 MB.
MAX_KEYS_FILE_BYTES = 16 * 1024 * 1024


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    key_sha256: str
    tenant: str
    #: A chain profile (``RERANKQ_CHAIN_<NAME>``) every stream of this key uses; None: the whole chain.
    chain: str | None = None
    #: The devices this key may send work to; the first is its default.
    devices: list[Device] = msgspec.field(default_factory=lambda: ["cpu"])


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: its tenant (None without auth), chain profile and devices."""

    tenant: str | None
    chain: str | None
    devices: tuple[Device, ...]

    def device(self, asked: str | None, default: Device) -> Device:
        """The device a request goes to: the one it asked for, if allowed; else the key's first."""
        if asked is None:
            return default if default in self.devices else self.devices[0]
        if asked not in ALL_DEVICES:
            raise Problem("invalid", f"device: must be cpu, gpu or any, got {asked[:16]!r}", field="device")
        if asked not in self.devices:
            allowed = ", ".join(self.devices)
            raise Problem(
                "forbidden", f"this API key may not use the {asked} queue (allowed: {allowed})", field="device"
            )
        return asked

    def check_chain(self, asked: str | None) -> str | None:
        """A stream's chain profile: a key bound to a profile uses it and may ask for no other;
        a key without one (or no auth) may pick any profile, or the whole chain."""
        if self.chain is None:
            return asked
        if asked is not None and asked.lower() != self.chain:
            raise Problem("forbidden", f"this API key may not use chain profile {asked[:64]!r}", field="chain")
        return self.chain


ANONYMOUS = Principal(tenant=None, chain=None, devices=ALL_DEVICES)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRing:
    """The known keys; ``authenticate`` maps an Authorization header to its principal."""

    def __init__(self, entries: list[KeyEntry], *, insecure: bool = False) -> None:
        self.insecure = insecure
        self._entries = [(bytes.fromhex(e.key_sha256), Principal(e.tenant, e.chain, tuple(e.devices))) for e in entries]

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, authorization: str | None) -> Principal:
        if self.insecure:
            return ANONYMOUS
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if not scheme:
            raise Problem("unauthenticated", "no api key supplied: send Authorization: Bearer <key>")
        if scheme.lower() != "bearer":
            # Naming the scheme, not the value: a bare key sent as the scheme must not be echoed.
            said = "a bare key" if not token else "another scheme"
            raise Problem(
                "unauthenticated",
                f"wrong authorization scheme ({said}): send Authorization: Bearer <key>",
            )
        if not token:
            raise Problem("unauthenticated", "no api key supplied after Bearer: send Authorization: Bearer <key>")
        presented = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, presented):
                found = principal
        if found is None:
            raise Problem("unauthenticated", "invalid api token")
        return found


def load_keyring(gateway: GatewaySettings, settings: Settings) -> KeyRing:
    """The keys the settings name; refuses to start without any unless auth is explicitly off."""
    if gateway.insecure_no_auth:
        return KeyRing([], insecure=True)
    if gateway.keys_file:
        source = variable("keys_file")
        raw = read_regular_file(gateway.keys_file, limit=MAX_KEYS_FILE_BYTES, variable=source)
    elif gateway.keys:
        source, raw = variable("keys"), gateway.keys.encode()
    else:
        raise ConfigError(
            variable("keys_file"),
            "no API keys configured: set it (or RERANKQ_GATEWAY_KEYS), "
            "or start with --insecure-no-auth to serve without keys",
        )
    return KeyRing(parse_entries(raw, source=source, settings=settings))


def parse_entries(raw: bytes, *, source: str, settings: Settings | None) -> list[KeyEntry]:
    """The entries of a keys file's JSON, each checked; a bad one raises ``ConfigError(source)``
    naming its index and field, never its digest. Each entry's chain must be one of the
    settings' profiles; with no settings (a file edited away from the gateway) it is not checked."""
    try:
        entries = msgspec.json.decode(raw, type=list[KeyEntry])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # msgspec's message names the path; it never quotes a value, so no digest is echoed.
        raise ConfigError(source, f"not a JSON list of key entries: {exc}") from None
    if not entries:
        raise ConfigError(source, "holds no keys")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"[{i}]"
        if not _DIGEST.fullmatch(entry.key_sha256):
            raise ConfigError(source, f"{at}.key_sha256 must be 64 lower-case hex characters (the key's SHA-256)")
        if entry.key_sha256 in seen:
            raise ConfigError(source, f"{at}.key_sha256 repeats an earlier entry")
        seen.add(entry.key_sha256)
        if not TENANT_NAME.fullmatch(entry.tenant):
            raise ConfigError(source, f"{at}.tenant must be 1-64 characters of A-Z a-z 0-9 _ . -")
        if entry.chain is not None:
            entry.chain = entry.chain.lower()
            if settings is not None and entry.chain not in settings.chain.profiles:
                raise ConfigError(
                    source, f"{at}.chain names no chain profile; set {chain_profile_variable(entry.chain)}"
                )
        if not entry.devices or len(set(entry.devices)) != len(entry.devices):
            raise ConfigError(source, f"{at}.devices must list distinct devices of cpu, gpu, any")
    return entries
