"""JSON text in and out: orjson for speed, the stdlib only where orjson would lose a value.

orjson reads a JSON integer outside -2**63 .. 2**64-1 as a float (changing its text and value:
from -9223372036854775809, 19 digits, and 18446744073709551616, 20 digits, on) and refuses to
write one. A run of 19 digits is looked for at C speed first, the exact pattern only when one
exists; a body that has such an integer is parsed by the stdlib, which keeps it exact.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_NINETEEN_DIGITS = b"0" * 19
_BIG_INTEGER = re.compile(rb"[:\[,]\s*(?:-\d{19,}|\d{20,})\s*[,}\]]")


def loads(raw: bytes) -> tuple[Any, bool]:
    """The parsed value, and whether it was parsed exactly (it holds a huge integer)."""
    value = orjson.loads(raw)  # also what decides which bodies are JSON at all
    if raw.translate(_DIGITS_ONLY).find(_NINETEEN_DIGITS) >= 0 and _BIG_INTEGER.search(raw):
        return json.loads(raw), True
    return value, False


def dumps(value: Any, *, indent: bool = False) -> bytes:
    """Compact (or two-space indented) UTF-8 JSON, exact for integers of any size."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else None)
    except TypeError:  # an integer beyond 64 bits
        if indent:
            return json.dumps(value, ensure_ascii=False, indent=2).encode()
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
