"""What counts as no text: the one rule for a blank document at every door and in the worker.

A text is blank when it holds nothing a reader (or a tokenizer) would read: it is empty, or
every character is white space (Unicode's, so U+2028 LINE SEPARATOR and U+3000 IDEOGRAPHIC
SPACE too), a control character (U+0000, ESC, ...) or a format character (ZERO WIDTH SPACE
U+200B, the BOM U+FEFF, SOFT HYPHEN U+00AD, the joiners and direction marks). A
cross-encoder's tokenizer drops exactly these (BERT's ``clean_text`` removes controls, its
``strip_accents``/whitespace split the rest), so a blank text would be scored as an empty
one: a confident-looking number for nothing.

So a blank candidate is accepted everywhere (the real services score an empty text, and RAG
frameworks pass empty chunks along), is never sent to a provider, scores minus infinity and
sinks to the bottom of its window, never dropped. A text that has something to read keeps its
control characters as they are (an ANSI-coloured log line is a document): they are data, and
what prints one escapes it. A blank query is refused: there is nothing to rank against.
"""

from __future__ import annotations

import unicodedata

#: ASCII's blank characters: its white space and its control characters (C0 and DEL).
_ASCII_BLANK = "".join(chr(c) for c in (*range(0x21), 0x7F))
#: Unicode categories read as nothing: control and format characters.
_NOTHING = frozenset({"Cc", "Cf"})


def is_blank(text: str | None) -> bool:
    """Whether ``text`` has nothing to read (``None`` and ``""`` included)."""
    if not text:
        return True
    if text.isascii():  # a flag CPython keeps on every str: the usual case costs one strip
        return not text.strip(_ASCII_BLANK)
    # Stops at the first character with something to read: usually the first.
    return all(ch.isspace() or unicodedata.category(ch) in _NOTHING for ch in text)
