"""JSON documents (an object or array, or JSON Lines), shrunk to a budget.

The document is parsed and printed again, compact where a value fits on a line and indented
where it does not, with three kinds of cut, each saying exactly what it left out:

- an array keeps its first and last items and, from the middle, items of a shape (key list)
  not seen yet or that mention an error; each run of dropped items is ``[… 38 items omitted …]``;
- an object keeps identity and error keys (``id``, ``name``, ``path``, ``error``, ``message``,
  ``code``, ``status`` …) first and gives them a larger share; dropped keys are
  ``[… 5 keys omitted …]``;
- a long string keeps its start and end: ``"abc[… 1200 characters omitted …]xyz"``.

An array of at least three objects with the same keys in the same order is printed as a table:
a ``columns: [...]`` line, then one JSON array of values per object. That form is lossless, so
when nothing else was cut the marker says so ("tabular form of 120 objects, no values
omitted"). The printed text is readable JSON-like text, not JSON.

Numbers are printed by orjson from their parsed value, so ``1.50`` shows as ``1.5``. Integers of
20 or more digits, which orjson would turn into floats, make this compressor step aside.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import orjson

from compressors.markers import GAP_COST, gap_line, utf8
from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.tools.generic import focus_hits_at

MIN_CHARS = 400
MAX_RATIO = 0.8  # a result is kept only when it saves at least 20%
WIDTH = 100  # a container whose compact form fits this is printed on one line
INDENT = "  "
PACK_WIDTH = 24  # array items this short share lines
ITEM_OVERHEAD = 6  # an array item's indentation, comma and newline, near enough
MIN_STRING = 40  # a cut string keeps at least this many characters
MIN_VALUE = 12  # what a kept key's value needs at least
MIN_ITEM = 80  # an array item is given at least this much
HEAD_ITEMS = 2  # and the last item
SPREAD_ITEMS = 16  # a cut array shows about this many items at least, each cut to its share
PRIORITY_WEIGHT = 3.0  # identity and error keys get this many shares of an object's budget
MIN_TABLE_ROWS = 3
TABLE_HEADER_COST = 40  # the header line's words around its column list
ATTEMPTS = 4  # budget scalings tried before settling
BIG_INT_DIGITS = 20  # orjson parses integers from 2**64 up as floats

PRIORITY_KEYS = frozenset(
    {
        "id", "uuid", "key", "name", "title", "path", "file", "filename", "filepath", "url",
        "uri", "href", "type", "kind", "status", "state", "code", "error", "errors", "message",
        "msg", "reason", "detail", "details", "exception", "stderr", "line", "column", "version",
        "exit_code", "exitcode", "returncode", "severity", "level", "result", "success", "ok",
    }
)  # fmt: skip
PRIORITY_SUFFIXES = ("_id", "id", "_name", "name", "path", "_url", "error", "_code")
ERROR_MARKS = (b"error", b"fail", b"exception", b"fatal", b"panic")

_DIGIT_MAP = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_RUN = b"0" * BIG_INT_DIGITS


class _NotJson(Exception):
    """The text is not a JSON document this compressor can print faithfully."""


def recognises(output: ToolOutput, budget: Budget) -> bool:
    return _document(output, budget) is not None


def _document(output: ToolOutput, budget: Budget) -> tuple[Any, bool] | None:
    text = output.text
    start = text[:256].lstrip()[:1]
    if start not in ("{", "[") or len(text) < MIN_CHARS or len(text) <= budget.max_chars:
        return None
    try:
        return _parse(text)
    except (_NotJson, RecursionError):
        return None


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    found = _document(output, budget)
    if found is None:
        return None
    document, lines = found
    try:
        return _fit(document, lines, len(output.text), budget.max_chars, output.focus)
    except (orjson.JSONEncodeError, RecursionError):
        # nested deeper than orjson or Python recursion can print: the next compressor takes it
        return None


def _parse(text: str) -> tuple[Any, bool]:
    """The document and whether it was JSON Lines (then it is the list of its records)."""
    if _has_big_integer(text):
        raise _NotJson
    try:
        return orjson.loads(text), False
    except orjson.JSONDecodeError:
        pass
    rows = [row for row in text.split("\n") if row.strip()]
    if len(rows) < 2 or any(row.lstrip()[:1] not in ("{", "[") for row in rows):
        raise _NotJson
    try:
        return [orjson.loads(row) for row in rows], True
    except orjson.JSONDecodeError:
        raise _NotJson from None


def _has_big_integer(text: str) -> bool:
    """Whether a number token (not a string) may have 20 or more digits."""
    digits = utf8(text).translate(_DIGIT_MAP)  # every digit is b"0", everything else b" "
    position = digits.find(_LONG_RUN)
    if position != -1 and not text.isascii():
        return True  # byte offsets are not character offsets: when in doubt, step aside
    while position != -1:
        before = text[max(position - 8, 0) : position].rstrip(" \t\r\n-")
        if before[-1:] in (":", ",", "["):
            return True
        end = digits.find(b" ", position)
        position = -1 if end == -1 else digits.find(_LONG_RUN, end)
    return False


def _fit(
    document: Any, lines: bool, original: int, max_chars: int, focus: frozenset[str]
) -> Compressed | None:
    """Crush and print, scaling the crush budget until the printed text fits (indentation
    and gap lines are only estimated while crushing)."""
    size = len(orjson.dumps(document))
    target = max_chars
    text, crush = "", Crush(focus)
    for _ in range(ATTEMPTS):
        crush = Crush(focus)
        if lines:
            node = _crush_list(document, target, size, crush, "lines")
        else:
            node = _crush(document, target, size, crush)
        text = _print(node, lines)
        if len(text) <= max_chars * 1.1:
            break
        target = int(target * max_chars / len(text) * 0.9)
    if len(text) > original * MAX_RATIO:
        return None
    return Compressed(text, crush.phrase(lines))


@dataclass(slots=True)
class Crush:
    """One crush: the task's terms (items naming them rank high) and what was left out, for
    the ``omitted`` phrase."""

    focus: frozenset[str] = frozenset()
    items: int = 0
    items_total: int = 0  # items of the arrays that lost some
    keys: int = 0
    keys_total: int = 0  # keys of the objects that lost some
    chars: int = 0
    strings: int = 0
    tables: list[int] = field(default_factory=list)  # objects per table

    def phrase(self, lines: bool) -> str:
        parts: list[str] = []
        if self.items:
            unit = "lines" if lines else "array items"
            parts.append(f"{self.items} of {self.items_total} {unit}")
        if self.keys:
            parts.append(f"{self.keys} of {self.keys_total} object keys")
        if self.chars:
            where = "1 long string" if self.strings == 1 else f"{self.strings} long strings"
            parts.append(f"{self.chars} characters of {where}")
        tables = sum(self.tables)
        if not parts:
            if tables:
                return f"tabular form of {tables} objects, no values omitted"
            return "whitespace re-indented, no values omitted"
        cut = _join(parts) + " omitted"
        return f"{cut} (tabular form of {tables} objects)" if tables else cut


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# Nodes of a crushed document. Plain JSON values are nodes too: they are printed whole.


@dataclass(frozen=True, slots=True)
class Gap:
    count: int
    unit: str

    def text(self) -> str:
        return gap_line(self.count, self.unit)


@dataclass(frozen=True, slots=True)
class Cut:
    """A string with its middle left out."""

    head: str
    omitted: int
    tail: str

    def text(self) -> str:
        head = orjson.dumps(self.head).decode()[:-1]
        tail = orjson.dumps(self.tail).decode()[1:]
        return f"{head}{gap_line(self.omitted, 'characters')}{tail}"


@dataclass(frozen=True, slots=True)
class Obj:
    entries: list[Any]  # (key, node) pairs and Gaps
    size: int  # estimated compact length


@dataclass(frozen=True, slots=True)
class Arr:
    items: list[Any]  # nodes and Gaps
    size: int


@dataclass(frozen=True, slots=True)
class Table:
    columns: list[str]
    rows: list[Any]  # value lists, Arr nodes (rows with cut values) and Gaps
    count: int  # objects in the original array


def _crush(value: Any, budget: int, size: int, crush: Crush) -> Any:
    if isinstance(value, str):
        return value if size <= budget else _cut_string(value, budget, crush)
    if isinstance(value, dict) and value and size > min(budget, WIDTH):
        return _crush_dict(value, budget, size, crush)
    if isinstance(value, list) and value and size > min(budget, WIDTH):
        return _crush_list(value, budget, size, crush, "items")
    return value


def _cut_string(value: str, budget: int, crush: Crush) -> str | Cut:
    keep = max(budget - len(gap_line(len(value), "characters")), MIN_STRING)
    if len(value) - keep <= len(gap_line(len(value) - keep, "characters")):
        return value
    head = keep * 2 // 3
    tail = keep - head
    crush.chars += len(value) - keep
    crush.strings += 1
    return Cut(value[:head], len(value) - keep, value[len(value) - tail :])


def _crush_dict(value: dict[str, Any], budget: int, size: int, crush: Crush) -> Obj:
    keys = list(value)
    sizes = list(map(len, map(orjson.dumps, value.values())))
    overheads = [len(key) + 6 for key in keys]  # quotes, colon, space, comma
    kept = _kept_keys(keys, sizes, overheads, budget)
    if len(kept) < len(keys):
        crush.keys += len(keys) - len(kept)
        crush.keys_total += len(keys)
    room = budget - sum(overheads[i] for i in kept) - 2 * GAP_COST
    weights = [PRIORITY_WEIGHT if _is_priority(keys[i]) else 1.0 for i in kept]
    shares = _waterfill([sizes[i] for i in kept], weights, room)
    crushed = {
        i: (keys[i], _crush(value[keys[i]], share, sizes[i], crush))
        for i, share in zip(kept, shares, strict=True)
    }
    return Obj(_with_gaps(len(keys), crushed, "keys"), min(size, budget))


def _is_priority(key: str) -> bool:
    lowered = key.lower()
    return lowered in PRIORITY_KEYS or lowered.endswith(PRIORITY_SUFFIXES)


def _kept_keys(
    keys: Sequence[str], sizes: Sequence[int], overheads: Sequence[int], budget: int
) -> list[int]:
    """Indices of the keys to keep: all when each can show something, else identity and
    error keys first and then the others in their order, while they fit."""
    needs = [
        overhead + (size if size < MIN_VALUE else MIN_VALUE)
        for overhead, size in zip(overheads, sizes, strict=True)
    ]
    if sum(needs) <= budget:
        return list(range(len(keys)))
    priority = [index for index, key in enumerate(keys) if _is_priority(key)]
    others = sorted(set(range(len(keys))).difference(priority))
    kept: list[int] = []
    spent = 2 * GAP_COST
    for index in priority + others:
        if spent + needs[index] <= budget or not kept:
            kept.append(index)
            spent += needs[index]
        elif budget - spent < MIN_VALUE:
            break
    return sorted(kept)


def _crush_list(value: list[Any], budget: int, size: int, crush: Crush, unit: str) -> Arr | Table:
    columns = _table_columns(value)
    if columns is not None:
        return _crush_table(value, columns, budget, crush, unit)
    encoded = list(map(orjson.dumps, value))
    sizes = list(map(len, encoded))
    kept = _kept_items(value, encoded, sizes, budget, crush.focus)
    _count_dropped(crush, len(value), len(kept))
    shares = _waterfill([sizes[i] for i in kept], [1.0] * len(kept), _room(budget, kept))
    crushed = {
        i: _crush(value[i], share, sizes[i], crush) for i, share in zip(kept, shares, strict=True)
    }
    return Arr(_with_gaps(len(value), crushed, unit), min(size, budget))


def _count_dropped(crush: Crush, total: int, kept: int) -> None:
    if kept < total:
        crush.items += total - kept
        crush.items_total += total


def _table_columns(value: list[Any]) -> list[str] | None:
    """The shared keys when ``value`` holds at least three objects with the same two or more
    keys in the same order, else None."""
    if len(value) < MIN_TABLE_ROWS or not isinstance(value[0], dict) or len(value[0]) < 2:
        return None
    columns = tuple(value[0])
    for item in value:
        if not isinstance(item, dict) or len(item) != len(columns) or tuple(item) != columns:
            return None
    return list(columns)


def _crush_table(
    value: list[dict[str, Any]], columns: list[str], budget: int, crush: Crush, unit: str
) -> Table:
    rows = [list(item.values()) for item in value]
    encoded = list(map(orjson.dumps, rows))
    sizes = list(map(len, encoded))
    room = budget - len(orjson.dumps(columns)) - TABLE_HEADER_COST
    crush.tables.append(len(rows))
    if sum(sizes) + ITEM_OVERHEAD * len(sizes) <= room:
        return Table(columns, rows, len(rows))
    kept = _kept_items(rows, encoded, sizes, room, crush.focus)
    _count_dropped(crush, len(rows), len(kept))
    shares = _waterfill([sizes[i] for i in kept], [1.0] * len(kept), _room(room, kept))
    crushed = {
        i: _crush_row(rows[i], share, sizes[i], crush)
        for i, share in zip(kept, shares, strict=True)
    }
    row_unit = "lines" if unit == "lines" else "rows"
    return Table(columns, _with_gaps(len(rows), crushed, row_unit), len(rows))


def _crush_row(row: list[Any], budget: int, size: int, crush: Crush) -> list[Any] | Arr:
    """A table row keeps every column: its values share the row's budget."""
    if size <= budget:
        return row
    sizes = list(map(len, map(orjson.dumps, row)))
    shares = _waterfill(sizes, [1.0] * len(row), budget - len(row))
    values = [_crush(v, share, n, crush) for v, share, n in zip(row, shares, sizes, strict=True)]
    return Arr(values, budget)


def _kept_items(
    items: Sequence[Any],
    encoded: Sequence[bytes],
    sizes: Sequence[int],
    budget: int,
    focus: frozenset[str],
) -> list[int]:
    """Indices of the items to keep, ascending: the first and last, then items of a new
    shape, mentioning an error or naming task terms, then more from both ends, while their
    shares fit."""
    cap = max(MIN_ITEM, budget // min(len(items), SPREAD_ITEMS))
    smallest = min(min(sizes), cap) + ITEM_OVERHEAD
    kept: set[int] = set()
    spent = 2 * GAP_COST
    for index in _item_order(items, encoded, sizes, focus):
        cost = min(sizes[index], cap) + ITEM_OVERHEAD
        if index in kept or (spent + cost > budget and kept):
            if budget - spent < smallest:
                break
            continue
        kept.add(index)
        spent += cost
    return sorted(kept)


def _item_order(
    items: Sequence[Any], encoded: Sequence[bytes], sizes: Sequence[int], focus: frozenset[str]
) -> Iterator[int]:
    count = len(items)
    head = min(HEAD_ITEMS, count)
    yield 0
    yield count - 1  # the last item outranks the second: logs and pages end with the latest
    yield from range(1, head)
    yield from sorted({*_new_shapes(items, head), *_notable(encoded, sizes, focus)})
    for offset in range(1, count):  # then both ends, inwards
        if offset >= head:
            yield offset
        yield count - 1 - offset


def _new_shapes(items: Sequence[Any], head: int) -> list[int]:
    """Where an item of a new shape (an object's key list, else its type) first occurs."""
    types = list(map(type, items))
    shapes: list[Any] = list(map(tuple, items)) if set(types) == {dict} else types
    first = dict(zip(reversed(shapes), range(len(shapes) - 1, -1, -1), strict=True))
    seen = set(shapes[:head])
    return [index for shape, index in first.items() if shape not in seen]


def _notable(encoded: Sequence[bytes], sizes: Sequence[int], focus: frozenset[str]) -> set[int]:
    """Items that mention an error or name a term of the task."""
    blob = b"\n".join(encoded).lower()
    starts = list(accumulate((size + 1 for size in sizes), initial=0))
    found = set(focus_hits_at(blob, starts, len(sizes), focus))
    for mark in ERROR_MARKS:
        position = blob.find(mark)
        while position != -1:
            index = bisect_right(starts, position) - 1
            found.add(index)
            position = blob.find(mark, starts[index + 1])
    return found


def _room(budget: int, kept: Sequence[int]) -> int:
    """What the kept items of an array share, as ``_kept_items`` counted it: every item then
    gets at least its counted cost, and most items fit whole."""
    return budget - 2 * GAP_COST - ITEM_OVERHEAD * len(kept)


def _with_gaps(count: int, crushed: dict[int, Any], unit: str) -> list[Any]:
    """The kept entries in order, with a Gap for each run of left-out ones."""
    out: list[Any] = []
    previous = -1
    for index in [*sorted(crushed), count]:
        if index > previous + 1:
            out.append(Gap(index - previous - 1, unit))
        if index < count:
            out.append(crushed[index])
        previous = index
    return out


def _waterfill(wants: Sequence[int], weights: Sequence[float], total: int) -> list[int]:
    """Max-min fair shares of ``total``: small wants are met whole, the others split the
    rest in proportion to their weights."""
    if sum(wants) <= total:
        return list(wants)
    shares = [0] * len(wants)
    remaining = float(max(total, 0))
    weight_left = float(sum(weights))
    for index in sorted(range(len(wants)), key=lambda i: wants[i] / weights[i]):
        share = remaining * weights[index] / weight_left
        shares[index] = min(wants[index], int(share))
        remaining -= shares[index]
        weight_left -= weights[index]
    return shares


# Printing


def _print(node: Any, lines: bool) -> str:
    out: list[str] = []
    if not lines:
        _emit(node, "", "", "", out)
    elif isinstance(node, Table):  # JSON Lines: one record per line, no brackets
        out.append(_table_header(node))
        out.extend(map(_inline, node.rows))
    else:
        out.extend(map(_inline, node.items))
    return "\n".join(out)


def _emit(node: Any, indent: str, prefix: str, suffix: str, out: list[str]) -> None:
    if isinstance(node, Table):
        inner = indent + INDENT
        out.append(f"{indent}{prefix}[")
        out.append(inner + _table_header(node))
        out.extend(inner + _inline(row) for row in node.rows)
        out.append(f"{indent}]{suffix}")
    elif isinstance(node, (Obj, Arr)) and node.size > WIDTH:
        _emit_block(node, indent, prefix, suffix, out)
    else:
        out.append(f"{indent}{prefix}{_inline(node)}{suffix}")


def _emit_block(node: Obj | Arr, indent: str, prefix: str, suffix: str, out: list[str]) -> None:
    inner = indent + INDENT
    entries = node.entries if isinstance(node, Obj) else node.items
    opening, closing = ("{", "}") if isinstance(node, Obj) else ("[", "]")
    out.append(f"{indent}{prefix}{opening}")
    last = max((i for i, entry in enumerate(entries) if not isinstance(entry, Gap)), default=-1)
    packed = ""  # short array items share a line, as formatters print number lists
    for position, entry in enumerate(entries):
        comma = "," if position < last else ""
        short = "" if isinstance(node, Obj) else _short_inline(entry)
        if short and len(inner) + len(packed) + len(short) + 2 <= WIDTH:
            packed = f"{packed} {short}{comma}" if packed else short + comma
            continue
        if packed:
            out.append(inner + packed)
        packed = short + comma if short else ""
        if short:
            continue
        if isinstance(entry, Gap):
            out.append(inner + entry.text())
        elif isinstance(node, Obj):
            _emit(entry[1], inner, orjson.dumps(entry[0]).decode() + ": ", comma, out)
        else:
            _emit(entry, inner, "", comma, out)
    if packed:
        out.append(inner + packed)
    out.append(f"{indent}{closing}{suffix}")


def _short_inline(node: Any) -> str:
    """A scalar or short string array item, inline; '' for anything else."""
    if isinstance(node, (str, int, float, bool)) or node is None:
        text = orjson.dumps(node).decode()
        return text if len(text) <= PACK_WIDTH else ""
    return ""


def _table_header(table: Table) -> str:
    columns = orjson.dumps(table.columns).decode()
    return f"columns: {columns} (one row of values per object, {table.count} objects)"


def _inline(node: Any) -> str:
    """The node on one line, compact."""
    if isinstance(node, (Gap, Cut)):
        return node.text()
    if isinstance(node, Obj):
        return "{" + ",".join(map(_inline_entry, node.entries)) + "}"
    if isinstance(node, Arr):
        return "[" + ",".join(map(_inline, node.items)) + "]"
    if isinstance(node, Table):
        return f"[{_table_header(node)}: " + ",".join(map(_inline, node.rows)) + "]"
    return orjson.dumps(node).decode()


def _inline_entry(entry: Any) -> str:
    if isinstance(entry, Gap):
        return entry.text()
    return orjson.dumps(entry[0]).decode() + ":" + _inline(entry[1])
