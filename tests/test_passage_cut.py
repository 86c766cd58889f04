"""Passages cut where the document breaks: paragraphs kept whole when they fit, a long one cut at
its sentences, a heading kept with its paragraph, never more tokens than the member reads, the
whole document covered within max_passages where full passages can cover it, and token windows
only for text without a break."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kernel.cost import candidate_cost
from kernel.wire import Candidate, StreamSpec
from worker.scoring.passage_cut import blocks, cut_on_structure, cut_token_windows
from worker.scoring.passages import Cutter, fallback_cutter, split, word_offsets

QUERY = "how do I recover from a payment gateway 502 outage"

NOTES = [
    "The office coffee machine on the third floor is descaled every Friday morning by facilities.",
    "Annual leave requests go through the people portal at least two weeks ahead of the first day.",
    "To recover from a payment gateway 502 outage, restart the gateway pods, then fail over checkout.",
    "Vendor invoices are paid on the fifteenth and the last day of each month by the finance team.",
    "The mobile release train leaves every second Tuesday; features that miss it wait for the next.",
]


def spec(**options: Any) -> StreamSpec:
    return StreamSpec(query=QUERY, window_size=10, long_documents="passages", **options)


def words() -> Cutter:
    return Cutter(offsets=word_offsets, max_length=512)


def spans_of(text: str, *, tokens: int, max_passages: int = 128) -> list[str]:
    spans = cut_on_structure(text, word_offsets(text), tokens=tokens, stride=tokens // 2, max_passages=max_passages)
    return [text[a:b] for a, b in spans]


@pytest.mark.parametrize("cutter", ["words", "minilm"])
def test_paragraphs_that_fit_are_kept_whole_and_no_passage_reads_more_than_the_member(cutter: str) -> None:
    offsets = word_offsets if cutter == "words" else fallback_cutter().offsets
    text = "\n\n".join(NOTES * 4)
    paragraphs = set(NOTES)
    fits = max(len(offsets(note)) for note in NOTES)
    for tokens in (fits, 2 * fits, 3 * fits):
        spans = cut_on_structure(text, offsets(text), tokens=tokens, stride=tokens // 2, max_passages=128)
        for a, b in spans:
            # A passage is one or more whole paragraphs: never one cut inside.
            assert set(re.split(r"\n\n", text[a:b])) <= paragraphs, text[a:b]
            assert len(offsets(text[a:b])) <= tokens
        # Together they read the document end to end, each paragraph once.
        assert "\n\n".join(text[a:b] for a, b in spans) == text


def test_short_neighbours_are_merged_up_to_the_fill_never_past_the_passage(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernel.passage_budget

    text = "\n\n".join(NOTES)  # five paragraphs of 15-18 words
    # As shipped a passage takes neighbours in while they fit: three notes in 64 words, not four.
    assert [len(p.split("\n\n")) for p in spans_of(text, tokens=64)] == [3, 2]
    # A passage of 20: no two notes fit in one; each stands alone.
    assert spans_of(text, tokens=20) == NOTES
    # Filled at half, 32: two notes merge (about 32), never three.
    monkeypatch.setattr(kernel.passage_budget, "PASSAGE_FILL_SHARE", 0.5)
    assert [len(p.split("\n\n")) for p in spans_of(text, tokens=64)] == [2, 2, 1]


def test_a_long_paragraph_is_cut_at_its_sentences_and_a_heading_travels_with_its_text() -> None:
    long_paragraph = " ".join(NOTES)  # one paragraph, five sentences, 80 words
    text = "# Payments runbook\n" + long_paragraph + "\n\n## Contacts\nThe on-call rota is in the wiki."
    passages = spans_of(text, tokens=40)
    assert passages[0].startswith("# Payments runbook\nThe office coffee machine")
    for passage in passages:
        assert len(passage.split()) <= 40
        # Every cut falls at a sentence's end.
        assert passage.endswith((".", "wiki.")), passage
    assert passages[-1] == "## Contacts\nThe on-call rota is in the wiki."
    assert [(a, b) for a, b in blocks(text)][:2] == [(0, 18), (19, 19 + len(long_paragraph))]


def test_cjk_text_is_cut_at_its_full_width_sentence_ends() -> None:
    sentence = "東京都は日本の首都です。"  # twelve words for word_offsets: one per character
    text = sentence * 10
    for passage in spans_of(text, tokens=30):
        assert passage.endswith("。") and len(word_offsets(passage)) <= 30
        assert sentence in passage


def test_a_sentence_longer_than_a_passage_is_cut_into_side_by_side_token_windows() -> None:
    run_on = " ".join(f"w{i}" for i in range(50))
    text = NOTES[0] + "\n\n" + run_on + "\n\n" + NOTES[1]
    passages = spans_of(text, tokens=20)
    assert passages[0] == NOTES[0] and passages[-1] == NOTES[1]
    middle = passages[1:-1]
    assert " ".join(middle) == run_on  # no overlap, nothing dropped
    assert all(len(p.split()) <= 20 for p in middle)


def test_text_without_a_break_is_cut_into_overlapping_token_windows_as_before() -> None:
    run_on = " ".join(f"w{i}" for i in range(100))
    offsets = word_offsets(run_on)
    assert cut_on_structure(run_on, offsets, tokens=20, stride=10, max_passages=32) == cut_token_windows(
        run_on, offsets, tokens=20, stride=10, max_passages=32
    )


@pytest.mark.parametrize("fill_share", [1.0, 0.25])
def test_max_passages_covers_the_whole_document_when_full_passages_can_and_else_keeps_the_first(
    fill_share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernel.passage_budget

    monkeypatch.setattr(kernel.passage_budget, "PASSAGE_FILL_SHARE", fill_share)
    text = "\n\n".join(NOTES * 12)  # sixty notes
    # One note a passage would be 60; passages filled further (a fill of a quarter passage
    # doubled until they fit) cover all sixty notes in 20.
    covering = spans_of(text, tokens=64, max_passages=20)
    assert len(covering) <= 20 and covering[-1].endswith(NOTES[-1])
    assert "\n\n".join(covering) == text
    # Sixty notes cannot fit in five passages of 64 words: the first five, full, are read.
    first = spans_of(text, tokens=64, max_passages=5)
    assert len(first) == 5 and text.startswith("\n\n".join(first))
    assert all(len(p.split("\n\n")) >= 3 and len(p.split()) <= 64 for p in first)


def test_split_reads_the_stream_option_and_the_cost_bound_holds_either_way() -> None:
    text = "\n\n".join(NOTES * 6)
    candidate = Candidate(id="d", text=text)
    structure = split(candidate, QUERY, words(), spec(passage_tokens=40))
    tokens = split(candidate, QUERY, words(), spec(passage_tokens=40, passage_cut="tokens"))
    assert all(p.text.endswith(".") for p in structure)
    assert any(not p.text.endswith(".") for p in tokens)
    for options in ({}, {"passage_cut": "tokens"}):
        for tokens_asked in (16, 40, 64):
            s = spec(passage_tokens=tokens_asked, **options)
            passages = split(candidate, QUERY, words(), s)
            # The cost fixed at open counts at least what the worker sends: each passage as sent
            # (its header and text) with the query.
            assert candidate_cost(s, candidate) >= sum(len(QUERY) + p.tokens for p in passages)
    # A header rides in every passage, and is counted in each.
    headed = Candidate(id="h", text=text, context="Payments runbook " * 20, heading_path=["Ops", "Payments"])
    for tokens_asked in (16, 64):
        s = spec(passage_tokens=tokens_asked)
        passages = split(headed, QUERY, words(), s)
        assert candidate_cost(s, headed) >= sum(len(QUERY) + p.tokens for p in passages)
    # Past the bare header (the date's room) a longer header costs more, up to the passage's tokens.
    assert candidate_cost(spec(passage_tokens=64), headed) > candidate_cost(spec(passage_tokens=64), candidate)


def test_a_window_says_where_each_documents_passages_stopped_reading() -> None:
    from worker.scoring.passages import window_passages

    text = "\n\n".join(NOTES * 12)
    whole, short = Candidate(id="w", text=NOTES[0]), Candidate(id="l", text=text)
    read = window_passages([whole, short], spec(passage_tokens=64, max_passages=2), words())
    assert read.unread_from[0] is None
    stop = read.unread_from[1]
    assert stop == read.per_candidate[1][-1].end and 0 < stop < len(text)
    assert window_passages([short], spec(passage_tokens=64), words()).unread_from == [None]
