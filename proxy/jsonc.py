"""Read JSONC (JSON with comments and trailing commas) and edit it in place.

OpenCode's configuration files are JSONC. ``deepmem init`` must change a few values in them
and keep everything else — comments, trailing commas, key order, indentation, line endings —
exactly as the user wrote it. So the parser keeps the character span of every value and
member, and an edit replaces or inserts text at one span; the rest of the file is copied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_WHITESPACE = " \t\n\r\f\v\u00a0\ufeff"
_NUMBER_CHARS = frozenset("+-0123456789.eE")


class JsoncError(ValueError):
    """The text is not JSONC, or an edit cannot be made; the message says where and why."""


@dataclass(slots=True)
class Member:
    key: str
    key_start: int
    value: Node
    comma: int | None = None  # offset of the comma after the value, if there is one


@dataclass(slots=True)
class Node:
    kind: str  # object | array | string | number | literal
    start: int
    end: int  # one past the value's last character
    value: Any = None  # the scalar's value
    members: list[Member] = field(default_factory=list)  # an object's, in order
    items: list[Node] = field(default_factory=list)  # an array's

    def member(self, key: str) -> Member | None:
        """The member named ``key`` (the last one, as JSON parsers keep the last duplicate)."""
        for member in reversed(self.members):
            if member.key == key:
                return member
        return None


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str, offset: int | None = None) -> JsoncError:
        return JsoncError(
            f"{_position(self.text, self.pos if offset is None else offset)}: {message}"
        )

    def skip_trivia(self) -> None:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in _WHITESPACE:
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = len(text) if end == -1 else end
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end == -1:
                    raise self.fail("unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def document(self) -> Node | None:
        self.skip_trivia()
        if self.pos == len(self.text):
            return None
        root = self.value()
        self.skip_trivia()
        if self.pos != len(self.text):
            raise self.fail("unexpected text after the end of the JSON value")
        return root

    def value(self) -> Node:
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of file, expected a value")
        char = self.text[self.pos]
        if char == "{":
            return self.object()
        if char == "[":
            return self.array()
        if char == '"':
            return self.string()
        if char == "-" or char.isdigit():
            return self.number()
        for word, value in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                start = self.pos
                self.pos += len(word)
                return Node("literal", start, self.pos, value)
        raise self.fail(f"unexpected character {char!r}")

    def object(self) -> Node:
        node = Node("object", self.pos, self.pos)
        self.pos += 1
        self.skip_trivia()
        while not self.text.startswith("}", self.pos):
            if not self.text.startswith('"', self.pos):
                raise self.fail("expected a property name in double quotes or '}'")
            key = self.string()
            self.skip_trivia()
            if not self.text.startswith(":", self.pos):
                raise self.fail("expected ':' after the property name")
            self.pos += 1
            self.skip_trivia()
            member = Member(key.value, key.start, self.value())
            node.members.append(member)
            self.skip_trivia()
            if self.text.startswith(",", self.pos):
                member.comma = self.pos
                self.pos += 1
                self.skip_trivia()
            elif not self.text.startswith("}", self.pos):
                raise self.fail("expected ',' or '}' after a property value")
        self.pos += 1
        node.end = self.pos
        return node

    def array(self) -> Node:
        node = Node("array", self.pos, self.pos)
        self.pos += 1
        self.skip_trivia()
        while not self.text.startswith("]", self.pos):
            node.items.append(self.value())
            self.skip_trivia()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                self.skip_trivia()
            elif not self.text.startswith("]", self.pos):
                raise self.fail("expected ',' or ']' after an array item")
        self.pos += 1
        node.end = self.pos
        return node

    def string(self) -> Node:
        start, text = self.pos, self.text
        pos = start + 1
        while True:
            if pos >= len(text):
                raise self.fail("unterminated string", start)
            char = text[pos]
            if char == '"':
                break
            if char == "\\":
                pos += 2
            elif char in "\r\n":
                raise self.fail("string not closed before the end of its line", start)
            elif char < " ":
                raise self.fail("control character in a string (escape it)", pos)
            else:
                pos += 1
        self.pos = pos + 1
        try:
            value = json.loads(text[start : self.pos])
        except ValueError as exc:
            raise self.fail(
                f"bad escape in a string ({exc.args[0].split(':')[0]})", start
            ) from None
        return Node("string", start, self.pos, value)

    def number(self) -> Node:
        start, pos = self.pos, self.pos
        while pos < len(self.text) and self.text[pos] in _NUMBER_CHARS:
            pos += 1
        try:
            value = json.loads(self.text[start:pos])
        except ValueError:
            raise self.fail(f"bad number {self.text[start:pos]!r}", start) from None
        self.pos = pos
        return Node("number", start, pos, value)


def parse(text: str) -> Node | None:
    """The tree of ``text``, or None when it holds only whitespace and comments."""
    return _Parser(text).document()


def to_python(node: Node) -> Any:
    if node.kind == "object":
        return {member.key: to_python(member.value) for member in node.members}
    if node.kind == "array":
        return [to_python(item) for item in node.items]
    return node.value


def loads(text: str) -> Any:
    """The Python value of JSONC ``text`` (None for a document without a value)."""
    root = parse(text)
    return None if root is None else to_python(root)


# ---------------------------------------------------------------- editing


def _line_start(text: str, offset: int) -> int:
    return text.rfind("\n", 0, offset) + 1


def _indent_of_line(text: str, offset: int) -> str:
    start = _line_start(text, offset)
    end = start
    while end < len(text) and text[end] in " \t":
        end += 1
    return text[start:end]


def _first_on_its_line(text: str, offset: int) -> bool:
    return text[_line_start(text, offset) : offset].strip(" \t") == ""


@dataclass(frozen=True, slots=True)
class _Style:
    eol: str
    unit: str  # one level of indentation
    multiline: bool  # the document spreads over several lines


def _style(text: str, root: Node) -> _Style:
    eol = "\r\n" if "\r\n" in text else "\n"
    multiline = "\n" in text[root.start : root.end]
    unit = "  "
    for member in root.members:
        if _first_on_its_line(text, member.key_start):
            indent = _indent_of_line(text, member.key_start)
            base = _indent_of_line(text, root.start)
            if indent.startswith(base) and len(indent) > len(base):
                unit = indent[len(base) :]
                break
    return _Style(eol, unit, multiline)


def _render(value: Any, indent: str, style: _Style, multiline: bool) -> str:
    if not multiline or not isinstance(value, dict | list) or not value:
        return json.dumps(value, ensure_ascii=False)
    rendered = json.dumps(value, ensure_ascii=False, indent=style.unit)
    return rendered.replace("\n", style.eol + indent)


def _nest(path: Sequence[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _insert_member(text: str, node: Node, key: str, value: Any, style: _Style, root: bool) -> str:
    entry = json.dumps(key, ensure_ascii=False) + ": "
    if not node.members:
        inner = text[node.start + 1 : node.end - 1]
        if "\n" not in inner and not (root or style.multiline):
            member = entry + _render(value, "", style, False)
            return text[: node.start] + "{ " + member + " }" + text[node.end :]
        closing_indent = _indent_of_line(text, node.start)
        indent = closing_indent + style.unit
        member = style.eol + indent + entry + _render(value, indent, style, True)
        if "\n" in inner:  # keep what is inside (comments) after the new member
            return text[: node.start + 1] + member + text[node.start + 1 :]
        closing = style.eol + closing_indent
        return text[: node.start + 1] + member + closing + text[node.end - 1 :]

    last = node.members[-1]
    multiline = _first_on_its_line(text, last.key_start)
    after = last.value.end if last.comma is None else last.comma + 1
    comma = "," if last.comma is None else ""
    if not multiline:
        member = " " + entry + _render(value, "", style, False)
        return text[:after] + comma + member + text[after:]
    indent = _indent_of_line(text, last.key_start)
    member = style.eol + indent + entry + _render(value, indent, style, True)
    if last.comma is not None:
        member += ","  # the object's style: a trailing comma after every member
    # A comment on the same line after the last member stays on that line.
    end = _end_of_line_trivia(text, after)
    if end is None:
        return text[:after] + comma + member + text[after:]
    return text[:after] + comma + text[after:end] + member + text[end:]


def _end_of_line_trivia(text: str, pos: int) -> int | None:
    """Where the line of ``pos`` ends, if only blanks and comments follow ``pos`` on it."""
    while pos < len(text):
        char = text[pos]
        if char in " \t":
            pos += 1
        elif char in "\r\n":
            return pos
        elif text.startswith("//", pos):
            end = text.find("\n", pos)
            end = len(text) if end == -1 else end
            return end - 1 if text[end - 1 : end] == "\r" else end
        elif text.startswith("/*", pos):
            end = text.find("*/", pos)
            if end == -1 or "\n" in text[pos:end]:
                return None
            pos = end + 2
        else:
            return None
    return pos


def set_value(text: str, path: Sequence[str], value: Any) -> str:
    """``text`` with the value at ``path`` (object keys from the root) set to ``value``.

    An existing value is replaced in its span; missing objects on the way are created, as a
    new last member of the deepest object that exists, in the file's indentation and with its
    trailing-comma habit. Everything else stays byte for byte. Raises ``JsoncError`` when the
    text is not JSONC, its root is not an object, or a step of ``path`` is not an object."""
    if not path:
        raise ValueError("set_value needs a non-empty path")
    root = parse(text)
    if root is None:
        raise JsoncError("the file holds no JSON object")
    if root.kind != "object":
        raise JsoncError(f"{_position(text, root.start)}: the top level is not an object")
    style = _style(text, root)
    node = root
    for depth, key in enumerate(path):
        member = node.member(key)
        if member is None:
            return _insert_member(
                text, node, key, _nest(path[depth + 1 :], value), style, node is root
            )
        if depth == len(path) - 1:
            indent = _indent_of_line(text, member.key_start)
            multiline = style.multiline and _first_on_its_line(text, member.key_start)
            rendered = _render(value, indent, style, multiline)
            return text[: member.value.start] + rendered + text[member.value.end :]
        if member.value.kind != "object":
            where = ".".join(path[: depth + 1])
            raise JsoncError(
                f"{_position(text, member.value.start)}: {where} is not an object, "
                f"it is {json.dumps(to_python(member.value), ensure_ascii=False)[:60]}"
            )
        node = member.value
    raise AssertionError("unreachable")


def get_value(data: Any, path: Sequence[str]) -> Any:
    """The value at ``path`` in parsed ``data``, or None when a step is missing."""
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data
