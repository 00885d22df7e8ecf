"""Text from URLs, headers and forms: read as numbers, or checked for what it shows, the one way everywhere."""
from __future__ import annotations

import unicodedata
from typing import Any


def control_character(text: str) -> str | None:
    """The first C0 or C1 control character in `text` (a newline, a tab, DEL...), else None."""
    return next((c for c in text if ord(c) < 32 or 0x7F <= ord(c) <= 0x9F), None)


# Bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): a name holding one shows
# its characters in another order than they are stored ("Trojan Source", CVE-2021-42574).
BIDI_CONTROLS = frozenset(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]))


def bidi_control(text: str) -> str | None:
    """The first bidi control character (BIDI_CONTROLS) in `text`, else None."""
    return next((c for c in text if c in BIDI_CONTROLS), None)


def hidden_character(text: str) -> str | None:
    """The first character of `text` that changes how it shows without showing itself, else None: a
    bidi control (BIDI_CONTROLS), or any other format character (Unicode category Cf: the zero-width
    space, joiners and non-joiner, LRM/RLM, the word joiner, the byte order mark, the soft hyphen). In
    a name, one makes "\u202eevil.exe" read "exe.live", or `x` and `x\u200b` two names that look alike."""
    return next((c for c in text if c in BIDI_CONTROLS or unicodedata.category(c) == "Cf"), None)


def hidden_character_problem(text: str, what: str) -> str | None:
    """What a name field says of hidden_character(text): `what` ("a run name") cannot hold it, by code point."""
    c = hidden_character(text)
    if c is None:
        return None
    effect = ("a bidirectional control, which shows the characters after it in another order" if c in BIDI_CONTROLS
              else "an invisible character, which makes two different names look the same")
    return f"{what} cannot contain U+{ord(c):04X} ({unicodedata.name(c, 'a format character')}), {effect}: remove it"


# Letters and symbols that render as blank space: the Hangul fillers, the Braille blank, and the
# combining grapheme joiner (a mark that draws nothing).
BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f")


def invisible(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace, format characters (Unicode category Cf:
    zero-width spaces, bidi marks and overrides, the byte order mark), blank-rendering letters
    (BLANK_CHARACTERS) and combining marks with nothing to combine with (categories Mn, Me). A name
    like that is a 0-px link on screen, or turns the text beside it around."""
    return all(c.isspace() or c in BLANK_CHARACTERS or unicodedata.category(c) in ("Cf", "Mn", "Me") for c in text)


def isolated(name: object) -> str:
    """`name` between FSI and PDI (U+2068 ... U+2069), for putting a user-given name into one of the
    Studio's own sentences (a message, a confirm dialog): a bidi override or an RTL script inside it
    then stays inside it, instead of turning the rest of the sentence around."""
    return f"\u2068{name}\u2069"


def ascii_int(text: Any) -> int | None:
    """The whole number `text` spells in ASCII digits (no sign, no spaces), else None.

    str.isdigit() is not the test: "²".isdigit() is True yet int("²") raises (a 500), and int()
    reads other scripts' digits ("٣" is 3), so one object would answer to several URLs."""
    return int(text) if isinstance(text, str) and text.isascii() and text.isdecimal() else None
