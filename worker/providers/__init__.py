"""The provider registry: the one place a provider name maps to its implementation.

Implementations are imported on first use so a worker that never runs the local
model never imports torch.
"""

from __future__ import annotations

import importlib

from kernel.settings import MemberSettings, Settings
from worker.providers.base import Provider, ProviderStartError

_REGISTRY: dict[str, str] = {
    "local": "worker.providers.local:LocalProvider",
    "embedding": "worker.providers.embedding:EmbeddingProvider",
    "tei": "worker.providers.tei:TeiProvider",
    "cohere": "worker.providers.cohere:CohereProvider",
    "vllm": "worker.providers.vllm:VllmProvider",
    "http": "worker.providers.generic:HttpProvider",
    "listwise": "worker.providers.listwise:ListwiseProvider",
    "rrf": "worker.providers.rrf:RrfProvider",
}


def provider_names() -> list[str]:
    return sorted(_REGISTRY)


def provider_class(name: str) -> type:
    """The class behind a provider name; ProviderStartError when there is none."""
    # A name with a colon is an import path ("package.module:Class") to a custom provider.
    target = name if ":" in name else _REGISTRY.get(name)
    if target is None:
        raise ProviderStartError("unknown_provider", f"{name!r}; known: {', '.join(provider_names())}")
    module_name, _, class_name = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise ProviderStartError("unknown_provider", f"cannot import {target!r}: {exc}") from None


def build_provider(member: MemberSettings, settings: Settings) -> Provider:
    return provider_class(member.provider)(member, settings)  # type: ignore[no-any-return]
