"""The bi-encoder engine behind the embedding provider.

A bi-encoder embeds the query and each document on its own and scores a pair by the
cosine similarity of the two embeddings. A request's distinct queries are prepared as
``encode_query`` prepares them and its distinct documents as ``encode_document`` does (the
model's prompts, by sentence-transformers' own preprocess), then ordered by token length
and cut into batches by the same padded-token budget as the cross-encoder engine, under the same precision
policy and parity probe (``worker.engine.forward``). Embeddings are L2-normalised here,
whatever the model's own last module does, so a dot product is the cosine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import structlog

from producer.settings import Settings
from worker.engine.batching import Batch, pad_batches
from worker.engine.forward import ForwardEngine, shared
from worker.engine.loading import load_sentence_transformer
from worker.engine.parity import SCORE_TOLERANCE, EngineDisagrees, disagreement_with
from worker.engine.precision import library_probe

log = structlog.get_logger("rerankq.engine")

#: A document's scored pair and its embedding: (cosine similarity, normalised embedding).
Scored = tuple[float, list[float]]


#: The roles a text plays, as sentence-transformers names them (encode_query / encode_document's ``task``).
Role = Literal["query", "document"]
#: The prompt names encode_query and encode_document look for, in their order.
_PROMPT_NAMES: dict[str, tuple[str, ...]] = {"query": ("query",), "document": ("document", "passage", "corpus")}


class EmbeddingEngine(ForwardEngine):
    """Cosines of ``encode_query`` and ``encode_document`` embeddings, batched by the engine.

    Queries are prepared as ``encode_query`` prepares them (the model's query prompt, or the
    stream's instruction in its place, and ``task="query"``) and documents as
    ``encode_document`` does; sentence-transformers' preprocess and module chain do both, the
    engine orders and batches. A query and a document with the same text are two texts here.
    At load the engine's cosines on the probe are held to the library's (``EngineDisagrees``).
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: Settings,
        precision: str | None = None,
        token_budget: int | None = None,
        verify_parity: bool = True,
    ) -> None:
        self.sentence_transformer = model
        module = model[0]
        self.tokenizer = getattr(module, "tokenizer", None) or module.processor
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.left_padding = getattr(self.tokenizer, "padding_side", "right") == "left"
        # sentence-transformers 6 renamed get_sentence_embedding_dimension.
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dimensions = int(dimension())
        model.eval()
        super().__init__(
            device=model.device,
            settings=settings,
            precision=precision,
            token_budget=token_budget,
            verify_parity=verify_parity,
        )

    def _choose_precision(self, requested: str, *, verify: bool) -> None:
        if verify and not getattr(self, "_agreed", False):
            self._agree_with_library()
        super()._choose_precision(requested, verify=verify)

    def _agree_with_library(self) -> None:
        import torch

        for window, prompt in library_probe():
            query, documents = window[0][0], [d for _, d in window]
            st = self.sentence_transformer
            with torch.inference_mode():
                q = st.encode_query([query], prompt=prompt, convert_to_tensor=True, normalize_embeddings=True)
                d = st.encode_document(documents, convert_to_tensor=True, normalize_embeddings=True)
            expected = (d.float() @ q[0].float()).tolist()
            disagreement = disagreement_with(expected, self.score_pairs(window, prompt=prompt))
            if disagreement:
                raise EngineDisagrees(
                    f"the engine's cosines are not encode_query/encode_document's "
                    f"({disagreement}, prompt {'given' if prompt else 'default'}): refused"
                )
        self._agreed = True
        log.info(
            "engine_agrees_with_library",
            engine="embedding",
            tolerance=SCORE_TOLERANCE,
            prompts=sorted(k for k, v in self.sentence_transformer.prompts.items() if v),
        )

    def prompt_for(self, role: Role, prompt: str | None = None) -> str | None:
        """The prompt encode_query / encode_document would apply: ``prompt`` when given, else the
        model's prompt for the role, else its default prompt."""
        if prompt is not None:
            return prompt
        prompts = self.sentence_transformer.prompts
        name = next((n for n in _PROMPT_NAMES[role] if n in prompts), None)
        return self.sentence_transformer._resolve_prompt(None, name)

    def _prepare(
        self, texts: Sequence[str], role: Role, prompt: str | None
    ) -> tuple[dict[str, list[list[int]]], dict[str, Any]]:
        """Token ids as encode_query / encode_document make them, unpadded, and what preprocess
        adds beside them (the prompt's length, for a pooling that leaves the prompt out)."""
        features = self.sentence_transformer.preprocess(list(texts), prompt=self.prompt_for(role, prompt), task=role)
        mask = features["attention_mask"].bool()
        encoded = {
            name: [row[keep].tolist() for row, keep in zip(features[name], mask)]
            for name in ("input_ids", "token_type_ids")
            if name in features
        }
        extras = {k: v for k, v in features.items() if k not in ("input_ids", "token_type_ids", "attention_mask")}
        return encoded, extras

    def tokenize(
        self, texts: Sequence[str], *, role: Role = "document", prompt: str | None = None
    ) -> dict[str, list[list[int]]]:
        """Each text's token ids as the library makes them for its role, unpadded."""
        return self._prepare(texts, role, prompt)[0] if texts else {"input_ids": []}

    def batches(self, encoded: dict[str, list[list[int]]]) -> list[Batch]:
        return pad_batches(encoded, self.token_budget, pad_id=self.tokenizer.pad_token_id or 0, left=self.left_padding)

    def encode(self, texts: Sequence[str], *, role: Role = "document", prompt: str | None = None) -> Any:
        """L2-normalised embeddings, one float32 row per text, on the CPU: encode_document's
        (or encode_query's, by ``role``)."""
        import torch

        if not texts:
            return torch.zeros((0, self.dimensions), dtype=torch.float32)
        encoded, extras = self._prepare(texts, role, prompt)
        out = torch.zeros((len(texts), self.dimensions), dtype=torch.float32)
        with torch.inference_mode(), self._autocast():
            for batch in self.batches(encoded):
                tensors = {k: v.to(self.device, non_blocking=True) for k, v in batch.tensors.items()}
                embeddings = self.sentence_transformer({**tensors, **extras}, task=role)["sentence_embedding"].float()
                out[batch.indices] = torch.nn.functional.normalize(embeddings, dim=-1).cpu()
                self._count(batch)
        return out

    def score_and_embed(self, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None) -> list[Scored]:
        """Each pair's cosine similarity and its document's embedding.

        Distinct queries are embedded once as queries (``prompt``, the stream's instruction, in
        place of the model's query prompt), distinct documents once as documents; a coalesced
        call carries several windows' queries in one batch.
        """
        if not pairs:
            return []
        queries = list(dict.fromkeys(q for q, _ in pairs))
        documents = list(dict.fromkeys(d for _, d in pairs))
        query_rows = {t: i for i, t in enumerate(queries)}
        document_rows = {t: i for i, t in enumerate(documents)}
        query_vectors = self.encode(queries, role="query", prompt=prompt)
        document_vectors = self.encode(documents, role="document")
        q = query_vectors[[query_rows[q] for q, _ in pairs]]
        d = document_vectors[[document_rows[d] for _, d in pairs]]
        cosines = (q * d).sum(dim=-1).clamp(-1.0, 1.0).tolist()
        return [(float(c), v) for c, v in zip(cosines, d.tolist())]

    def score_pairs(self, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None) -> list[float]:
        return [cosine for cosine, _ in self.score_and_embed(pairs, prompt=prompt)]


def shared_embedding_engine(model_name: str, *, device: str, settings: Settings) -> EmbeddingEngine:
    """The process's bi-encoder engine for this model; members naming the same model share it."""
    return shared(
        "embedding",
        model_name,
        device=device,
        settings=settings,
        build=lambda: EmbeddingEngine(load_sentence_transformer(model_name, device=device), settings=settings),
    )
