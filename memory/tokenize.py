"""Tokenizer for memory search: latin words and identifiers, CJK runs as bigrams or jieba words.

- Latin / other alphabetic text is lowercased and split on whitespace and punctuation.
  Identifiers joined by ``_`` or ``.`` are kept whole *and* split into their parts:
  ``memory_store`` gives ``memory_store``, ``memory``, ``store``.
- CJK runs (Han ideographs incl. extension A/B+ and compatibility ideographs, Hiragana,
  Katakana, Hangul) are cut into single characters plus adjacent bigrams (``mode="bigram"``,
  the default) or, with ``mode="jieba"``, Han runs are segmented by jieba's search mode
  (kana / Hangul runs still use bigrams). jieba's dictionary is loaded lazily, once, quietly.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Literal

TokenizerMode = Literal["bigram", "jieba"]
MODES: tuple[TokenizerMode, ...] = ("bigram", "jieba")

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_KANA_HANGUL = "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
_CJK = _HAN + _KANA_HANGUL

_WORD = rf"[^\W{_CJK}]+"
_TOKEN_RE = re.compile(rf"(?P<cjk>[{_CJK}]+)|(?P<word>{_WORD}(?:\.{_WORD})*)")
_HAN_SPLIT_RE = re.compile(rf"([{_HAN}]+)")
_PART_SPLIT_RE = re.compile(r"[._]+")

_jieba: Any = None
_jieba_lock = threading.Lock()


def tokenize(text: str, mode: TokenizerMode = "bigram") -> list[str]:
    """Tokens of ``text`` in order (duplicates kept, so callers can count term frequency)."""
    if mode not in MODES:
        raise ValueError(f"unknown tokenizer mode {mode!r}; expected one of {MODES}")
    tokens: list[str] = []
    for match in _TOKEN_RE.finditer(text):
        word = match.group("word")
        if word is not None:
            tokens.extend(_word_tokens(word.lower()))
        elif mode == "jieba":
            tokens.extend(_jieba_tokens(match.group("cjk")))
        else:
            tokens.extend(_bigram_tokens(match.group("cjk")))
    return tokens


def _word_tokens(word: str) -> list[str]:
    """The word itself, then its ``_`` / ``.`` separated parts when it has any."""
    if "_" not in word and "." not in word:  # most words: no split to make
        return [word]
    parts = [part for part in _PART_SPLIT_RE.split(word) if part]
    if len(parts) == 1 and parts[0] == word:
        return [word]
    if not parts:  # only separators, e.g. "__"
        return []
    return [word, *parts]


def _bigram_tokens(run: str) -> list[str]:
    """Every character of a CJK run, then every pair of adjacent characters."""
    if len(run) == 1:
        return [run]
    return [*run, *(run[i : i + 2] for i in range(len(run) - 1))]


def _jieba_tokens(run: str) -> list[str]:
    """Han sub-runs segmented by jieba (search mode); kana / Hangul sub-runs as bigrams."""
    tokens: list[str] = []
    for index, piece in enumerate(_HAN_SPLIT_RE.split(run)):
        if not piece:
            continue
        if index % 2 == 1:  # captured group: a Han run
            tokens.extend(word for word in _load_jieba().lcut_for_search(piece) if word.strip())
        else:
            tokens.extend(_bigram_tokens(piece))
    return tokens


def _load_jieba() -> Any:
    """Import and initialise jieba once, with its logging turned down."""
    global _jieba
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                _jieba = jieba
    return _jieba
