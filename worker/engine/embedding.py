"""The bi-encoder engine behind the embedding provider.

A bi-encoder embeds the query and each document on its own and scores a pair by the
cosine similarity of the two embeddings. The texts of a request (its distinct queries
and documents) are tokenised in one call, ordered by token length and cut into batches
by the same padded-token budget as the cross-encoder engine, under the same precision
policy and parity probe (``worker.engine.forward``). Embeddings are L2-normalised here,
whatever the model's own last module does, so a dot product is the cosine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producer.settings import Settings
from worker.engine.forward import ForwardEngine, shared
from worker.engine.loading import load_sentence_transformer

#: A document's scored pair and its embedding: (cosine similarity, normalised embedding).
Scored = tuple[float, list[float]]


class EmbeddingEngine(ForwardEngine):
    def __init__(self, model: Any, *, settings: Settings, precision: str | None = None,
                 token_budget: int | None = None, verify_parity: bool = True) -> None:
        self.sentence_transformer = model
        module = model[0]
        self.tokenizer = getattr(module, "processor", None) or module.tokenizer
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        # sentence-transformers 6 renamed get_sentence_embedding_dimension.
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dimensions = int(dimension())
        model.eval()
        super().__init__(device=model.device, settings=settings, precision=precision, token_budget=token_budget,
                         verify_parity=verify_parity)

    def tokenize(self, texts: Sequence[str]) -> dict[str, list[list[int]]]:
        """One tokeniser call for every text, unpadded."""
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length, padding=False,
                                 return_attention_mask=False)
        return dict(encoded)

    def encode(self, texts: Sequence[str]) -> Any:
        """L2-normalised embeddings, one float32 row per text, on the CPU."""
        import torch

        if not texts:
            return torch.zeros((0, self.dimensions), dtype=torch.float32)
        out = torch.zeros((len(texts), self.dimensions), dtype=torch.float32)
        with torch.inference_mode(), self._autocast():
            for batch in self.batches(self.tokenize(texts)):
                tensors = {k: v.to(self.device, non_blocking=True) for k, v in batch.tensors.items()}
                embeddings = self.sentence_transformer(tensors)["sentence_embedding"].float()
                out[batch.indices] = torch.nn.functional.normalize(embeddings, dim=-1).cpu()
                self._count(batch)
        return out

    def score_and_embed(self, pairs: Sequence[tuple[str, str]]) -> list[Scored]:
        """Each pair's cosine similarity and its document's embedding.

        Distinct texts are embedded once, queries and documents in the same batches (a
        coalesced call carries several windows' queries).
        """
        if not pairs:
            return []
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        row = {t: i for i, t in enumerate(texts)}
        vectors = self.encode(texts)
        queries = vectors[[row[q] for q, _ in pairs]]
        documents = vectors[[row[d] for _, d in pairs]]
        cosines = (queries * documents).sum(dim=-1).clamp(-1.0, 1.0).tolist()
        return [(float(c), v) for c, v in zip(cosines, documents.tolist())]

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return [cosine for cosine, _ in self.score_and_embed(pairs)]


def shared_embedding_engine(model_name: str, *, device: str, settings: Settings) -> EmbeddingEngine:
    """The process's bi-encoder engine for this model; members naming the same model share it."""
    return shared("embedding", model_name, device=device, settings=settings,
                  build=lambda: EmbeddingEngine(load_sentence_transformer(model_name, device=device),
                                                settings=settings))
