"""What in a conversation is worth remembering: keyword captures and nudge triggers.

Plain patterns in English and Chinese, no model. ``capture`` picks the user's own words when
they ask to remember something ("remember: …", "记住…"); ``nudge_reasons`` notices a turn that
settled a decision, stated a constraint or fixed an error, so the model can be reminded to
store it with ``memory_store``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CAPTURE_CHARS = 2000

_CAPTURE_KEYWORDS = re.compile(
    r"\b(?:remember|don'?t\s+forget|do\s+not\s+forget|keep\s+in\s+mind|note\s+to\s+self|"
    r"must\s+not|must\s+never|never\s+ever|from\s+now\s+on)\b|\bimportant\s*:"
    r"|记住|记得|别忘|不要忘|重要[:\uff1a]|绝不能|千万不要|务必|以后都|从现在起",
    re.IGNORECASE,
)
# "Do you remember …?" asks; it does not tell us anything to keep.
_QUESTION_ONLY = re.compile(r"^\s*(?:do|did|can|could)\s+you\s+remember\b[^.!\n]*\?\s*$", re.I)
_ENDS = ".!?\n\u3002\uff01\uff1f"  # ASCII and fullwidth sentence ends
_SENTENCE = re.compile(rf"[^{_ENDS}]*(?:[{_ENDS}]+|$)")


def capture(user_text: str) -> str | None:
    """The part of a user message to keep in notes.md, or None when it asks for nothing.

    A short message is kept whole; a long one keeps the sentences that hold a keyword.
    """
    text = user_text.strip()
    if not text or _CAPTURE_KEYWORDS.search(text) is None or _QUESTION_ONLY.match(text):
        return None
    if len(text) <= MAX_CAPTURE_CHARS // 4:
        return text
    sentences = [
        s.strip() for s in _SENTENCE.findall(text) if s.strip() and _CAPTURE_KEYWORDS.search(s)
    ]
    kept = " ".join(sentences)
    return kept[:MAX_CAPTURE_CHARS] or None


@dataclass(frozen=True, slots=True)
class Signal:
    kind: str  # "decision", "constraint" or "fix"
    section: str  # the MEMORY.md section it belongs in
    excerpt: str  # the sentence that matched


SIGNAL_PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "decision",
        "Decisions",
        re.compile(
            r"\b(?:we|i)\s+(?:have\s+|'ve\s+)?(?:decided|chose|agreed|settled\s+on|went\s+with)\b"
            r"|\b(?:let'?s|we'?ll|we\s+will)\s+(?:use|go\s+with|switch\s+to|stick\s+with)\b"
            r"|\bdecision\s*:|决定|选择了|采用|改用|就用",
            re.IGNORECASE,
        ),
    ),
    (
        "constraint",
        "Constraints",
        re.compile(
            r"\b(?:must\s+not|must\s+never|never\s+use|always\s+use|do\s+not\s+use|don'?t\s+use|"
            r"is\s+not\s+allowed|are\s+not\s+allowed|is\s+required\s+to)\b"
            r"|必须|不能用|不允许|禁止|不要用",
            re.IGNORECASE,
        ),
    ),
    (
        "fix",
        "Gotchas",
        re.compile(
            r"\b(?:the\s+fix\s+(?:was|is)|root\s+cause|the\s+(?:problem|issue|bug)\s+was|"
            r"(?:was|is)\s+caused\s+by|fixed\s+(?:it|this|the)\s+by|resolved\s+by)\b"
            r"|修复了|原因是|根本原因|问题出在|解决了",
            re.IGNORECASE,
        ),
    ),
)


def nudge_reasons(texts: list[str]) -> list[Signal]:
    """At most one signal per kind, from the first sentence that shows it."""
    found: dict[str, Signal] = {}
    for text in texts:
        for kind, section, pattern in SIGNAL_PATTERNS:
            if kind in found:
                continue
            match = pattern.search(text)
            if match is not None:
                found[kind] = Signal(kind, section, _sentence_around(text, match.start()))
    return [found[kind] for kind, _, _ in SIGNAL_PATTERNS if kind in found]


def _sentence_around(text: str, at: int, limit: int = 160) -> str:
    start = max(text.rfind(mark, 0, at) for mark in _ENDS) + 1
    ends = [i for i in (text.find(mark, at) for mark in _ENDS) if i >= 0]
    end = min(ends) + 1 if ends else len(text)
    sentence = " ".join(text[start:end].split())
    return sentence if len(sentence) <= limit else sentence[: limit - 1] + "…"
