"""Long documents as passages: cut each document at its own breaks, on the model's token
boundaries (``worker.scoring.passage_cut``), score every passage as a document of its own, and
aggregate the scores back per document.

A passage is a span of the candidate's ``text`` (code points, so ``text[start:end]`` is the
passage exactly) read with the document's header (date, heading path, context) in front, so
each passage reads like the document it came from. Spans come from the tokenizer's offset
mapping and are widened to whole user-visible characters, so no passage splits a grapheme
(a ZWJ emoji or a flag several tokens long is kept whole, one token more at worst).

Which tokenizer: that of the first in-process member (``local``, ``embedding``) of the
stream's chain, with its ``max_length``. A chain of remote members alone (they do not say
what they read) is cut with the packaged all-MiniLM-L6-v2 WordPiece tokenizer at
``REMOTE_PASSAGE_TOKENS``; without that package, with whitespace-separated words, each CJK
character a word of its own.
"""

from __future__ import annotations

import copy
import importlib
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.limits import MIN_PASSAGE_TOKENS, REMOTE_PASSAGE_TOKENS
from kernel.passage_budget import header_chars, passage_tokens, text_tokens
from kernel.settings import PACKAGED_EMBEDDING_MODULE
from kernel.wire import Candidate, PassageAggregate, PassageSpan, StreamSpec
from worker.providers.base import Scale
from worker.scoring.documents import ELLIPSIS, _back_to_boundary, has_text, header
from worker.scoring.passage_cut import DocumentTokens, cut_on_structure, cut_token_windows

#: A text's tokens as (start, end) code-point offsets into it, in order.
Offsets = Callable[[str], list[tuple[int, int]]]

# [CLS] query [SEP] document [SEP]: three special tokens, and one spare for models that add one.
_PAIR_SPECIAL_TOKENS = 4
# A bi-encoder reads the document alone: [CLS] document [SEP].
_SINGLE_SPECIAL_TOKENS = 2

# Han, kana, hangul: scripts written without spaces between words.
_WORDS = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]|"
    r"[^\s\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)


@dataclass(frozen=True)
class Passage:
    #: Code points into the candidate's ``text``.
    start: int
    end: int
    #: What is scored: the document's header and ``text[start:end]``.
    text: str
    #: Tokens of ``text``, as the cutter's tokenizer reads it.
    tokens: int = 0


@dataclass(frozen=True)
class Cutter:
    """A tokenizer's offsets and the number of tokens the member reads in one pair."""

    offsets: Offsets
    max_length: int
    #: The member reads the query with the document (a cross-encoder), not alone (a bi-encoder).
    reads_query: bool = True

    def passage_tokens(self, query: str, head_tokens: int) -> int:
        """The default passage length: what the member reads, less the query, the header's
        ``head_tokens`` and the special tokens; never under ``MIN_PASSAGE_TOKENS``."""
        used = head_tokens
        if self.reads_query:
            used += len(self.offsets(query)) + _PAIR_SPECIAL_TOKENS
        else:
            used += _SINGLE_SPECIAL_TOKENS
        return max(MIN_PASSAGE_TOKENS, self.max_length - used)


def tokenizer_offsets(tokenizer: Any) -> Offsets:
    """A Hugging Face fast tokenizer's offsets. The tokenizer is copied: its engine calls the
    original from other threads, and a fast tokenizer must not be used by two at once."""
    own = copy.deepcopy(tokenizer)
    lock = threading.Lock()

    def offsets(text: str) -> list[tuple[int, int]]:
        with lock:
            # verbose=False: a whole document is longer than the model reads, and is meant to be.
            encoded = own(
                text,
                add_special_tokens=False,
                return_offsets_mapping=True,
                truncation=False,
                return_attention_mask=False,
                return_token_type_ids=False,
                verbose=False,
            )
        # A token with an empty span (one added by normalisation) marks no place in the text.
        return [(int(a), int(b)) for a, b in encoded["offset_mapping"] if b > a]

    return offsets


def word_offsets(text: str) -> list[tuple[int, int]]:
    """Whitespace-separated words, each CJK character a word of its own."""
    return [m.span() for m in _WORDS.finditer(text)]


_cutters: dict[int, Cutter] = {}
_cutters_lock = threading.Lock()


def engine_cutter(engine: Any, *, reads_query: bool) -> Cutter:
    """The cutter of an in-process member's engine (its tokenizer and ``max_length``), made once."""
    key = id(engine)
    with _cutters_lock:
        cutter = _cutters.get(key)
        if cutter is None:
            cutter = _cutters[key] = Cutter(
                offsets=tokenizer_offsets(engine.tokenizer), max_length=int(engine.max_length), reads_query=reads_query
            )
        return cutter


_fallback: list[Cutter] = []


def fallback_cutter() -> Cutter:
    """For a chain without an in-process member: the packaged MiniLM tokenizer, else words."""
    with _cutters_lock:
        if not _fallback:
            _fallback.append(_load_fallback())
        return _fallback[0]


def _load_fallback() -> Cutter:
    try:
        package = importlib.import_module(PACKAGED_EMBEDDING_MODULE)
        # The tokenizers library alone: a worker of remote members need not import transformers.
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(package.get_model_path()) / "tokenizer.json"))
    except Exception:  # not installed, or unreadable: words are a stated, always-there fallback
        return Cutter(offsets=word_offsets, max_length=REMOTE_PASSAGE_TOKENS)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lock = threading.Lock()

    def offsets(text: str) -> list[tuple[int, int]]:
        with lock:
            encoded = tokenizer.encode(text, add_special_tokens=False)
        return [(a, b) for a, b in encoded.offsets if b > a]

    return Cutter(offsets=offsets, max_length=REMOTE_PASSAGE_TOKENS)


def chain_cutter(members: Sequence[Any] | None) -> Cutter:
    """The cutter of the first in-process member of ``members`` (the chain's ``Member``s) that
    has started, else the fallback."""
    for member in members or ():
        if member.settings.provider not in ("local", "embedding"):
            continue
        try:
            member.provider()
        except Exception:  # a member that cannot start is failed over by the chain; cut by the next
            continue
        engine = getattr(getattr(member.checked, "inner", None), "engine", None)
        if engine is not None and getattr(engine, "tokenizer", None) is not None:
            return engine_cutter(engine, reads_query=member.settings.provider != "embedding")
    return fallback_cutter()


# -- cutting ------------------------------------------------------------------


def passage_header(head: str, offsets: Offsets, *, chars: int, tokens: int) -> str:
    """The document's header as each passage carries it: at most ``chars`` code points and
    ``tokens`` tokens (``kernel.passage_budget``). A header cut short ends in an ellipsis and
    a space, so the passage's text still starts a word of its own."""
    return _clipped_header(head, offsets, chars=chars, tokens=tokens)[0]


def _clipped_header(head: str, offsets: Offsets, *, chars: int, tokens: int) -> tuple[str, int | None]:
    """``passage_header``, and its tokens where they are known already (None: not counted)."""
    spans = offsets(head) if head else []
    if len(head) <= chars and len(spans) <= tokens:
        return head, len(spans)
    if chars < 3 or tokens < 2:
        return "", 0
    # Room for the ellipsis: a code point and a token.
    at = chars - 2
    if len(spans) > tokens:
        at = min(at, spans[tokens - 2][1])
    kept = head[: _back_to_boundary(head, at)].rstrip()
    return (kept + ELLIPSIS + " ", None) if kept else ("", 0)


#: Tokens a passage may read differently as sent than the document's own tokens say: a
#: tokenizer may read the word at a passage's edge (a window that starts inside a word), or
#: the header's join, as more pieces on its own. A passage counted within this of the bound is
#: tokenised as sent, and its header gives way where it must.
EDGE_SLACK = 16


def split(candidate: Candidate, query: str, cutter: Cutter, spec: StreamSpec) -> list[Passage]:
    """A candidate's passages, each with the document's header (clipped to its budget) and
    counted as sent; none for a candidate without text.

    The document is tokenised once: the cut and every passage's count read its offsets (a
    passage's tokens are the header's and those of its span), so a passage costs no second
    tokenising here on top of the member's own."""
    if not has_text(candidate):
        return []
    limit = text_tokens(spec)
    head, head_tokens = _clipped_header(header(candidate), cutter.offsets, chars=header_chars(spec), tokens=limit)
    if head_tokens is None:
        head_tokens = len(cutter.offsets(head))
    # A member in process that reads less than the limit cuts shorter; never longer.
    tokens = spec.passage_tokens or min(limit, cutter.passage_tokens(query, head_tokens))
    stride = spec.passage_stride or max(1, tokens // 2)
    text = candidate.text
    offsets = cutter.offsets(text)
    cutting = cut_on_structure if spec.passage_cut == "structure" else cut_token_windows
    spans = cutting(text, offsets, tokens=tokens, stride=stride, max_passages=spec.max_passages)
    document = DocumentTokens(offsets)
    bound = passage_tokens(spec)
    return [
        _counted(head, text, a, b, cutter.offsets, counted=head_tokens + document.count(a, b), bound=bound)
        for a, b in spans
    ]


def _counted(head: str, text: str, start: int, end: int, offsets: Offsets, *, counted: int, bound: int) -> Passage:
    """The passage as sent, with ``counted`` (the header's tokens and its span's in the
    document) as its tokens; where that comes within ``EDGE_SLACK`` of the bound, counted again
    on the text as sent, and where the header and the span read more together than the bound
    allows (a tokenizer that merges across the join), the header gives way, so no passage sends
    more than ``bound`` tokens."""
    if counted + EDGE_SLACK <= bound:
        return Passage(start=start, end=end, text=head + text[start:end], tokens=counted)
    while True:
        sent = head + text[start:end]
        count = len(offsets(sent))
        if count <= bound:
            return Passage(start=start, end=end, text=sent, tokens=count)
        if head:
            spans = offsets(head)
            head = passage_header(head, offsets, chars=len(head), tokens=max(0, len(spans) - (count - bound)))
            continue
        # No header left and still over (never seen): the span gives way at its end.
        spans = offsets(text[start:end])
        end = start + spans[bound - 1][1]


# -- aggregating ---------------------------------------------------------------

#: ``max_mean``'s share of the best passage; the rest is the mean of all the document's passages.
#: A quarter: chosen on each half of the long collection's queries by the other half, the same
#: both ways (``ops.bench.passage_quality``).
MAX_MEAN_BEST_SHARE = 0.25
#: The aggregates whose score is already normalised (read on the probability scale).
NORMALISED_AGGREGATES = ("sum_top_k", "max_mean")


@dataclass(frozen=True)
class Aggregated:
    #: The document's score on the member's own scale (``sum_top_k``, ``max_mean``: normalised, see below).
    score: float
    #: Which passage decided it: the best one (``first``: the first one).
    best: int
    #: That passage's own score, on the member's scale.
    best_score: float


def aggregate(
    scores: Sequence[float | None], how: PassageAggregate, *, top_k: int, normalise: Callable[[float], float]
) -> Aggregated | None:
    """One document's score from its passages' scores; None when the member left every passage
    out (``top_n``), or ``first`` and it left the first out.

    ``max`` and ``first`` keep the member's raw score (so its scale still reads it);
    ``sum_top_k`` adds the best ``top_k`` normalised scores (a missing passage counts 0) and
    divides by ``top_k``: the same order as the sum, and still a score in [0, 1]; ``max_mean``
    is ``MAX_MEAN_BEST_SHARE`` of the best normalised score and the rest of the mean of all of
    them (a missing passage counts 0): the passage that answers, and how much of the document
    is about the query.
    """
    present = [(s, i) for i, s in enumerate(scores) if s is not None]
    if not present:
        return None
    best_score, best = max(present, key=lambda item: (item[0], -item[1]))
    if how == "max":
        return Aggregated(score=best_score, best=best, best_score=best_score)
    if how == "first":
        return None if scores[0] is None else Aggregated(score=scores[0], best=0, best_score=scores[0])
    normalised = sorted((normalise(s) for s, _ in present), reverse=True)
    if how == "max_mean":
        mean = math.fsum(normalised) / len(scores)
        score = MAX_MEAN_BEST_SHARE * normalised[0] + (1.0 - MAX_MEAN_BEST_SHARE) * mean
        return Aggregated(score=score, best=best, best_score=best_score)
    return Aggregated(score=sum(normalised[:top_k]) / top_k, best=best, best_score=best_score)


@dataclass
class WindowPassages:
    """A window's passages, in candidate order, and the way back from their scores."""

    per_candidate: list[list[Passage]]
    #: Per candidate, where its passages stopped reading short of its text's end (None: they did not).
    unread_from: list[int | None]

    @property
    def texts(self) -> list[str]:
        return [p.text for passages in self.per_candidate for p in passages]

    @property
    def tokens(self) -> int:
        """Every token the window's passages send, headers included."""
        return sum(p.tokens for passages in self.per_candidate for p in passages)

    def aggregate(
        self, scores: Sequence[float | None], spec: StreamSpec, scale: Scale, normalise: Callable[[float, str], float]
    ) -> tuple[list[float | None], list[PassageSpan | None], list[str | None]]:
        """Per candidate: its score (None: omitted, or no text), its best passage's span and
        normalised score, and that passage's text."""
        out_scores: list[float | None] = []
        spans: list[PassageSpan | None] = []
        best_texts: list[str | None] = []
        pos = 0
        for passages, unread_from in zip(self.per_candidate, self.unread_from):
            mine = scores[pos : pos + len(passages)]
            pos += len(passages)
            result = (
                aggregate(
                    mine, spec.passage_aggregate, top_k=spec.passage_top_k, normalise=lambda s: normalise(s, scale)
                )
                if passages
                else None
            )
            if result is None:
                out_scores.append(None)
                spans.append(None)
                best_texts.append(None)
                continue
            best = passages[result.best]
            out_scores.append(result.score)
            best_score = normalise(result.best_score, scale)
            spans.append(PassageSpan(start=best.start, end=best.end, score=best_score, unread_from=unread_from))
            best_texts.append(best.text)
        return out_scores, spans, best_texts


def window_passages(candidates: Sequence[Candidate], spec: StreamSpec, cutter: Cutter) -> WindowPassages:
    per_candidate = [split(c, spec.query, cutter, spec) for c in candidates]
    return WindowPassages(
        per_candidate=per_candidate,
        unread_from=[unread_from(c.text or "", passages) for c, passages in zip(candidates, per_candidate)],
    )


def unread_from(text: str, passages: Sequence[Passage]) -> int | None:
    """Where the passages stopped reading, when they stopped before the text's last word."""
    if not passages:
        return None
    read = max(p.end for p in passages)
    return read if text[read:].strip() else None


def scored_passages(
    passages: WindowPassages, outcome: Any, spec: StreamSpec, documents: list[str]
) -> list[PassageSpan | None] | None:
    """Turn a chain outcome over a window's passages into one over its candidates, in place:
    each candidate's aggregated score, its document the best passage as scored (what was
    scored is what a reader gets back). Returns each candidate's best passage span; None when
    nothing was scored (a failed or passthrough window keeps its excerpts)."""
    from worker.scoring.decide import normalise

    if outcome.scores is None or outcome.scale is None:
        outcome.scores = None if outcome.scores is None else [None] * len(documents)
        return None
    if outcome.scale == "rank":
        scores, spans, best_texts = _ranked_passages(passages, outcome.scores, spec)
    else:
        scores, spans, best_texts = passages.aggregate(outcome.scores, spec, outcome.scale, normalise)
        if spec.passage_aggregate in NORMALISED_AGGREGATES:
            outcome.scale = "probability"  # already normalised: read as it is
    outcome.scores = scores
    for i, text in enumerate(best_texts):
        if text is not None:
            documents[i] = text
    return spans


def _ranked_passages(
    passages: WindowPassages, places: list[float | None], spec: StreamSpec
) -> tuple[list[float | None], list[PassageSpan | None], list[str | None]]:
    """A rank-declaring member's places of passages as places of candidates: each passage's
    place seeded over all of the window's passages (so ``max`` picks the best placed one, and a
    span's score is that seed), aggregated, then the candidates placed in the aggregates'
    order, still declared ranks (``worker.scoring.decide`` seeds them over the candidates)."""
    from worker.scoring.decide import rank_scores

    scores, spans, best_texts = passages.aggregate(rank_scores(places), spec, "probability", _as_it_is)
    order = sorted((i for i, s in enumerate(scores) if s is not None), key=lambda i: (-(scores[i] or 0.0), i))
    candidate_places: list[float | None] = [None] * len(scores)
    for place, i in enumerate(order):
        candidate_places[i] = float(place)
    return candidate_places, spans, best_texts


def _as_it_is(score: float, scale: str) -> float:
    return score
