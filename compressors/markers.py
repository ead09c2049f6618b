"""The one key scheme and the one marker grammar.

Key: the first 24 hex characters of BLAKE2b over the original's UTF-8 bytes.

Markers read as plain English to a model that has never heard of deepmem:

    [deep-memory: 412 of 480 lines omitted — original intact: deep_expand("ccr:3f9a…")]

and inside a compressed body, a run of left-out lines is one gap line, optionally naming
what the left-out lines mention:

    [… 23 lines omitted …]
    [… 23 lines omitted; they mention: get_named_query, self.work_groups …]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

KEY_LENGTH = 24
KEY_PREFIX = "ccr:"
MARKER_START = "[deep-memory: "  # every marker begins so; its key follows within 200 chars
MARKER_RE = re.compile(
    r"\[deep-memory: (?P<what>[^\]\n]*?) — original intact: "
    r'deep_expand\("ccr:(?P<key>[0-9a-f]{24})"\)\]'
)
KEY_RE = re.compile(r"^(?:ccr:)?([0-9a-f]{24})$")


def utf8(text: str) -> bytes:
    """UTF-8 bytes of any Python string, lone surrogates included (they survive a round trip)."""
    return text.encode("utf-8", "surrogatepass")


def ccr_key(text: str) -> str:
    return hashlib.blake2b(utf8(text), digest_size=KEY_LENGTH // 2).hexdigest()


def normalize_key(raw: str) -> str | None:
    """``ccr:KEY`` or ``KEY`` → ``KEY``; None when it is not a key of this scheme."""
    match = KEY_RE.match(raw.strip().strip('"').lower())
    return match.group(1) if match else None


def marker(what: str, key: str) -> str:
    return f'{MARKER_START}{what} — original intact: deep_expand("{KEY_PREFIX}{key}")]'


def gap_line(count: int, unit: str = "lines", names: Sequence[str] = (), where: str = "") -> str:
    """``unit`` is plural; the singular drops its final s (pass a singular unit yourself for
    irregular or compound ones). ``where`` says which ones, in terms the model can ask for
    (``file lines 44-85``)."""
    if count == 1 and unit.endswith("s"):
        unit = unit[:-1]
    place = f" ({where})" if where else ""
    mention = f"; they mention: {', '.join(names)}" if names else ""
    return f"[… {count} {unit} omitted{place}{mention} …]"


# What a gap line costs a compressor's budget, in characters, when it plans before the counts
# are known: one with a four-digit count of the longest plain unit, and its newline. Gap lines
# that name what they left out cost more; a compressor that knows the exact gap line it
# writes measures ``len(gap_line(...))`` instead.
GAP_COST = len(gap_line(1000, "characters")) + 1


def marker_keys(text: str) -> list[str]:
    """Every key named by a marker in ``text``, in order."""
    return [match.group("key") for match in MARKER_RE.finditer(text)]
