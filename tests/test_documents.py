"""Document assembly: the exact text a provider scores and a reader gets back."""

from __future__ import annotations

import datetime as dt
import unicodedata

import regex
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kernel.wire import Candidate
from worker.scoring.documents import ELLIPSIS, assemble, clip, date_prefix, excerpt, first_match, is_boundary

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JUNE_5 = dt.datetime(2022, 6, 5, 14, 30, tzinfo=dt.timezone.utc)


def test_date_prefix_has_both_forms() -> None:
    assert date_prefix(JUNE_5) == "[Date: June 05, 2022 (2022-06-05)] "
    assert date_prefix(None) == ""


def test_date_prefix_does_not_follow_the_process_locale() -> None:
    import locale

    original = locale.setlocale(locale.LC_TIME)
    for name in ("de_DE.UTF-8", "fr_FR.UTF-8"):
        try:
            locale.setlocale(locale.LC_TIME, name)
        except locale.Error:
            continue  # not installed here; the fixed month table is what the test guards
        try:
            assert date_prefix(JUNE_5) == "[Date: June 05, 2022 (2022-06-05)] "
        finally:
            locale.setlocale(locale.LC_TIME, original)


def test_full_assembly() -> None:
    c = Candidate(
        id="m1",
        text="restart the pods",
        context="incident 42",
        heading_path=["Runbooks", "Payments"],
        occurred_start=JUNE_5,
    )
    assert assemble(c, "pods", budget=2048) == (
        "[Date: June 05, 2022 (2022-06-05)] Runbooks > Payments\n\nincident 42: restart the pods"
    )


def test_parts_are_optional() -> None:
    assert assemble(Candidate(id="m", text="plain"), "q", budget=2048) == "plain"
    assert assemble(Candidate(id="m", text="t", context="ctx"), "q", budget=2048) == "ctx: t"
    assert assemble(Candidate(id="m", text="t", heading_path=["A"]), "q", budget=2048) == "A\n\nt"


def test_the_date_is_the_effective_time() -> None:
    # Recency's coalesce order: a memory with only a mention date still carries a date.
    c = Candidate(id="m", text="t", mentioned_at=JUNE_5)
    assert assemble(c, "q", budget=2048).startswith("[Date: June 05, 2022 (2022-06-05)] ")


def test_a_long_text_keeps_the_part_around_the_first_query_match() -> None:
    text = "filler words here. " * 300 + "The certificate on the load balancer expired. " + "tail words. " * 300
    c = Candidate(id="m", text=text, heading_path=["Ops"], occurred_start=JUNE_5)
    doc = assemble(c, "why did the certificate expire", budget=300)
    assert len(doc) <= 300
    assert doc.startswith("[Date: June 05, 2022 (2022-06-05)] Ops\n\n" + ELLIPSIS)
    assert "certificate on the load balancer expired" in doc
    # Without a match the head of the text is kept.
    head = assemble(c, "kubernetes", budget=300)
    assert "filler words here." in head and "certificate" not in head and head.endswith(ELLIPSIS)


def test_a_match_near_the_end_keeps_the_tail() -> None:
    text = "x " * 2000 + "the invoice was paid"
    doc = excerpt(text, "invoice", 100)
    assert len(doc) == 100 and doc.endswith("the invoice was paid") and doc.startswith(ELLIPSIS)


def test_short_words_and_stopwords_do_not_pin_the_window() -> None:
    text = "a " * 500 + "outage report"
    assert first_match(text, "what is the outage") == text.index("outage")


# -- code-point budgets across scripts ---------------------------------------

LATIN = "abcdefghijklmnopqrstuvwxyzéèüñ "
CYRILLIC = "абвгдеёжзийклмнопрстуфхцчшщъыьэюя "
CJK = "支付网关错误恢复证书数据库迁移搜索缓存"
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "🇫🇷", "❤️", "e\u0301", " "]

scripts = st.sampled_from(["latin", "cyrillic", "cjk", "emoji", "mixed"])


@st.composite
def texts(draw: st.DrawFn) -> str:
    script = draw(scripts)
    pieces = {
        "latin": list(LATIN),
        "cyrillic": list(CYRILLIC),
        "cjk": list(CJK),
        "emoji": EMOJI,
        "mixed": list(LATIN) + list(CYRILLIC) + list(CJK) + EMOJI,
    }[script]
    return "".join(draw(st.lists(st.sampled_from(pieces), min_size=0, max_size=400)))


def graphemes(text: str) -> list[str]:
    return regex.findall(r"\X", text)


def boundaries(text: str) -> set[int]:
    out, pos = {0}, 0
    for g in graphemes(text):
        pos += len(g)
        out.add(pos)
    return out


@FAST
@given(texts(), st.integers(min_value=1, max_value=300), st.sampled_from(["", "payment", "ошибка", "证书", "🚀"]))
def test_excerpt_budget_holds_in_code_points_and_never_splits_a_character(text: str, budget: int, query: str) -> None:
    out = excerpt(text, query, budget)
    assert len(out) <= budget
    body = out.strip(ELLIPSIS) if len(out) < len(text) else out
    if out == text:
        return
    start = text.find(body)
    assert start != -1, "an excerpt is a contiguous piece of the text"
    cuts = boundaries(text)
    assert start in cuts and start + len(body) in cuts


@FAST
@given(texts(), st.lists(texts(), max_size=3), st.one_of(st.none(), texts()), st.integers(min_value=1, max_value=500))
def test_assembled_document_fits_its_budget(text: str, heading: list[str], context: str | None, budget: int) -> None:
    c = Candidate(id="m", text=text, heading_path=heading, context=context or None, occurred_start=JUNE_5)
    doc = assemble(c, "payment 证书", budget=budget)
    assert len(doc) <= budget
    assert len(doc.encode("utf-8")) >= len(doc)  # counted in code points, not bytes


def test_clip_backs_off_to_a_whole_character() -> None:
    family = "👨‍👩‍👧"  # five code points, one character
    text = "ab" + family + "cd"
    for budget in range(3, 7):
        assert clip(text, budget) == "ab"
    assert clip(text, 7) == "ab" + family
    flags = "🇩🇪🇫🇷"
    assert clip(flags, 3) == "🇩🇪"
    assert not is_boundary("e\u0301", 1)


def test_budget_counts_code_points_not_bytes() -> None:
    cjk = "证" * 100
    assert len(assemble(Candidate(id="m", text=cjk), "q", budget=50)) == 50  # 150 bytes, 50 code points


# -- dates before year 1000, cuts after a space --------------------------------


def test_dates_before_year_1000_are_zero_padded_iso() -> None:
    assert date_prefix(dt.datetime(800, 12, 25, tzinfo=dt.timezone.utc)) == "[Date: December 25, 0800 (0800-12-25)] "
    assert date_prefix(dt.datetime(1, 1, 1)) == "[Date: January 01, 0001 (0001-01-01)] "
    assert date_prefix(dt.datetime(9999, 12, 31)) == "[Date: December 31, 9999 (9999-12-31)] "


def test_an_excerpt_does_not_start_with_a_mark_that_belongs_to_the_space_before_it() -> None:
    text = "x" * 200 + " \u0301abc needle " + "y" * 200
    out = excerpt(text, "needle", 60)
    assert out.startswith(ELLIPSIS) and "needle" in out
    body = out[1:]
    assert not unicodedata.category(body[0]).startswith("M"), repr(body[:5])


# Characters that attach to the one before them; a cut before any of them splits a character.
EXTENDERS = ["\u0301", "\u0308", "\u20dd", "\u0903", "\u200d", "\ufe0f", "\U0001f3fd", "\U000e0067"]
BASES = list("abc xyz") + ["证", "😀", "🇩🇪", "👨‍👩‍👧"]


@st.composite
def texts_with_stray_marks(draw: st.DrawFn) -> tuple[str, int]:
    """Text where marks and joiners follow spaces and each other, with one query match somewhere."""
    pieces = st.lists(st.sampled_from(BASES + EXTENDERS + [" "] * 4 + [" " + e for e in EXTENDERS]), max_size=150)
    before, after = draw(pieces), draw(pieces)
    text = (
        "".join(before)
        + " "
        + "".join(draw(st.lists(st.sampled_from(EXTENDERS), min_size=1, max_size=3)))
        + "needle "
        + "".join(after)
    )
    return text, draw(st.integers(min_value=2, max_value=120))


def extends_previous(ch: str) -> bool:
    """Independent of the module: a grapheme cluster (UAX #29, via `regex`) would not start here."""
    return len(regex.findall(r"\X", "a" + ch)) == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts_with_stray_marks())
@example(("x" * 200 + " \u0301abc needle " + "y" * 200, 60))
@example(("a \u0301\u0301needle aa🇩🇪", 14))
def test_no_excerpt_begins_or_ends_inside_a_character(case: tuple[str, int]) -> None:
    text, budget = case
    out = excerpt(text, "needle", budget)
    assert len(out) <= budget
    if out == text:
        return
    head_cut, tail_cut = out.startswith(ELLIPSIS), out.endswith(ELLIPSIS)
    body = out[1 if head_cut else 0 : len(out) - 1 if tail_cut else len(out)]
    if head_cut and body:
        assert not extends_previous(body[0]), f"starts with {body[0]!r}: {body[:8]!r}"
    cuts = boundaries(text)
    # Where in the text the body lies: some occurrence must have both ends on a character boundary.
    starts = [i for i in range(len(text) - len(body) + 1) if text.startswith(body, i)]
    assert starts, "an excerpt is a contiguous piece of the text"
    assert any(i in cuts and i + len(body) in cuts for i in starts), (body, budget)
