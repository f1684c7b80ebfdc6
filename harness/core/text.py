"""Text from a run (an exception message, a log tail) made safe to print or to put in XML.

A rank's message can hold anything: ANSI escape sequences that would recolour or clear a
terminal or a CI log, NULs and other control characters that XML 1.0 cannot hold at all, and
bidirectional overrides (``U+202E``...) that make a line read otherwise than it is (the "Trojan
Source" trick). ``plain`` shows each such character as a visible escape (``\\x1b``, ``\\u202e``);
newlines and tabs stay.
"""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls, the bidirectional marks, embeddings, overrides
#: and isolates, and lone surrogates (invalid in UTF-8 and XML).
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(text: str) -> str:
    """``text`` with every control character shown as an escape, so it prints as it reads."""
    return _UNPRINTABLE.sub(_visible, text)
