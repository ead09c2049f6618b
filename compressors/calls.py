"""Old tool-call arguments: the long strings an agent wrote itself.

A file an agent wrote, a patch it applied, the prompt it gave a subagent or a heredoc in a
shell command travel in every later request as the call's arguments. Once their turn is over
the work is on disk (or in the subagent's report), so each long string value is cut to its
first lines, followed by a marker naming what was left out; the arguments stay a JSON object
of the same shape, so the call still matches the tool's schema and stays paired.

Nothing an agent later needs from a tool output lives only here: the agent wrote these strings
itself, after reading whatever they contain.
"""

from __future__ import annotations

from typing import Any

from compressors import jsontext
from compressors.markers import marker, utf8

MIN_ARGUMENTS_CHARS = 600  # smaller calls pass unchanged
LONG_VALUE_CHARS = 300  # a string value at least this long is cut
KEPT_VALUE_CHARS = 160  # about this much of its start stays, in whole lines where it can
MIN_SAVED_CHARS = 200


def cut_call(arguments: str | dict[str, Any], original: str, key: str) -> str | None:
    """The JSON text of ``arguments`` with their long string values cut (``original`` is
    their JSON text, stored under ``key``); None when the call is small, not a JSON object,
    or would not get meaningfully smaller."""
    if len(original) < MIN_ARGUMENTS_CHARS:
        return None
    if isinstance(arguments, str):
        try:
            parsed: Any = jsontext.loads(utf8(arguments))[0]
        except ValueError:  # not JSON: left as it is
            return None
    else:
        parsed = arguments
    if not isinstance(parsed, dict):
        return None
    cut = _cut_values(parsed, key, "")
    if cut is parsed:
        return None
    text = jsontext.dumps(cut).decode()
    return text if len(original) - len(text) >= MIN_SAVED_CHARS else None


def _cut_values(value: Any, key: str, field: str) -> Any:
    """``value`` with every long string inside it cut; the same object when nothing was."""
    if isinstance(value, str):
        return _cut_string(value, key, field) if len(value) >= LONG_VALUE_CHARS else value
    if isinstance(value, dict):
        changed = {name: _cut_values(item, key, name) for name, item in value.items()}
        same = all(changed[name] is item for name, item in value.items())
        return value if same else changed
    if isinstance(value, list):
        items = [_cut_values(item, key, field) for item in value]
        same = all(new is old for new, old in zip(items, value, strict=True))
        return value if same else items
    return value


def _cut_string(value: str, key: str, field: str) -> str:
    lines = value.split("\n")
    kept: list[str] = []
    size = 0
    for line in lines:
        if kept and size + len(line) > KEPT_VALUE_CHARS:
            break
        kept.append(line)
        size += len(line) + 1
    head = "\n".join(kept)
    what = f" of {field}" if field else ""
    if len(head) > KEPT_VALUE_CHARS * 2:  # one long first line
        head = head[:KEPT_VALUE_CHARS]
        left_out = f"{len(value) - len(head)} of {len(value)} characters{what} omitted"
    else:
        omitted = len(lines) - len(kept)
        left_out = f"{omitted} of {len(lines)} lines{what} omitted"
    return f"{head}\n{marker(left_out, key)}"
