"""The provider registry: the one place a provider name maps to its implementation.

Implementations are imported on first use so a worker that never runs the local
model never imports torch.
"""

from __future__ import annotations

import importlib

from producer.settings import MemberSettings, Settings
from worker.providers.base import Provider, ProviderStartError

_REGISTRY: dict[str, str] = {
    "local": "worker.providers.local:LocalProvider",
    "embedding": "worker.providers.embedding:EmbeddingProvider",
    "tei": "worker.providers.tei:TeiProvider",
    "cohere": "worker.providers.cohere:CohereProvider",
    "http": "worker.providers.generic:HttpProvider",
    "rrf": "worker.providers.rrf:RrfProvider",
}


def provider_names() -> list[str]:
    return sorted(_REGISTRY)


def build_provider(member: MemberSettings, settings: Settings) -> Provider:
    # A name with a colon is an import path ("package.module:Class") to a custom provider.
    target = member.provider if ":" in member.provider else _REGISTRY.get(member.provider)
    if target is None:
        raise ProviderStartError("unknown_provider", f"{member.provider!r}; known: {', '.join(provider_names())}")
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ProviderStartError("unknown_provider", f"cannot import {target!r}: {exc}") from None
    return cls(member, settings)
