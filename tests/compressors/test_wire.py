"""The wire formats: one list, one protocol, and nobody else branching on the dialect."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressors.view import Dialect
from compressors.wire import (
    FORMATS,
    Usage,
    chat_dialect,
    read_usage,
    usage_markers,
    without_cache_mark_bytes,
    without_cache_marks,
)
from compressors.wire.base import WireFormat

ROOT = Path(__file__).resolve().parents[2]


def test_every_dialect_has_one_format_and_routes_to_it() -> None:
    assert set(FORMATS) == set(Dialect)
    for dialect, wire in FORMATS.items():
        assert wire.dialect is dialect
        assert chat_dialect("POST", "/v1" + wire.path_suffix) is dialect
        assert chat_dialect("POST", "/v1" + wire.path_suffix + "/") is dialect
    assert len({wire.path_suffix for wire in FORMATS.values()}) == len(FORMATS)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_history_puts_the_system_prompt_first(dialect: Dialect) -> None:
    wire: WireFormat = FORMATS[dialect]
    bodies = {
        Dialect.OPENAI_CHAT: {"messages": [{"role": "system", "content": "S"}, {"role": "user"}]},
        Dialect.ANTHROPIC: {"system": "S", "messages": [{"role": "user", "content": "u"}]},
        Dialect.OPENAI_RESPONSES: {"instructions": "S", "input": [{"role": "user"}]},
    }
    history = wire.history_messages(bodies[dialect])
    assert history[0] == {"role": "system", "content": "S"} and len(history) == 2
    assert wire.message_count(bodies[dialect]) == (2 if dialect is Dialect.OPENAI_CHAT else 1)


def test_usage_is_read_by_the_format_whose_shape_it_has() -> None:
    events = [
        ({"usage": {"prompt_tokens": 9, "completion_tokens": 2}}, (9, 2)),
        ({"type": "message_start", "message": {"usage": {"input_tokens": 9}}}, (9, 0)),
        ({"type": "response.completed", "response": {"usage": {"input_tokens": 9}}}, (9, 0)),
    ]
    for event, expected in events:
        usage = Usage()
        assert read_usage(usage, event)
        assert (usage.input_tokens, usage.output_tokens) == expected
        assert any(marker in orjson.dumps(event) for marker in usage_markers())
    assert not read_usage(Usage(), {"type": "ping"})
    assert not read_usage(Usage(), ["not", "an", "event"])


def _branches_on_a_dialect(tree: ast.AST) -> list[int]:
    """Lines that compare with, or look up, a named member of ``Dialect``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if (
                    isinstance(side, ast.Attribute)
                    and isinstance(side.value, ast.Name)
                    and side.value.id == "Dialect"
                ):
                    lines.append(node.lineno)
    return lines


def test_nothing_outside_the_wire_formats_branches_on_the_dialect() -> None:
    offenders = []
    for package in ("compressors", "memory", "proxy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "wire" in path.relative_to(ROOT).parts:
                continue
            for line in _branches_on_a_dialect(ast.parse(path.read_text(encoding="utf-8"))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == []


def test_without_cache_marks_leaves_out_every_breakpoint_and_nothing_else() -> None:
    mark = {"type": "ephemeral"}
    nested = [{"type": "text", "text": "b", "cache_control": mark}]
    message = {
        "role": "user",
        "cache_control": mark,
        "content": [
            {"type": "text", "text": "a", "cache_control": mark},
            {"type": "tool_result", "content": nested},
            "plain",
        ],
    }
    assert without_cache_marks(message) == {
        "role": "user",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "tool_result", "content": [{"type": "text", "text": "b"}]},
            "plain",
        ],
    }
    assert message["cache_control"] is mark  # the message itself is not changed
    assert without_cache_marks("text") == "text"


_MARKS = st.fixed_dictionaries(
    {"type": st.sampled_from(["ephemeral", 'e}ph{"', "x,y"])},
    optional={"ttl": st.sampled_from(["5m", "1h"]), "n": st.integers(-5, 5) | st.none()},
)
_KEYS = st.sampled_from(["type", "text", "content", "x_cache_control", '"q'])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_KEYS, inner, max_size=4)
        | st.tuples(
            st.dictionaries(_KEYS, inner, max_size=3), _MARKS | inner, st.integers(0, 3)
        ).map(lambda t: {**dict(list(t[0].items())[: t[2]]), "cache_control": t[1], **t[0]})
    ),
    max_leaves=20,
)


@given(_JSON)
def test_without_cache_mark_bytes_is_without_cache_marks_on_compact_json(value: object) -> None:
    """Marks anywhere, first, last or alone in their object, with values holding braces,
    quotes and commas; a key that only ends in cache_control, a string that spells one, or a
    cache_control member of another value (a list, an object holding one) stays."""
    assert without_cache_mark_bytes(orjson.dumps(value)) == orjson.dumps(without_cache_marks(value))


def test_a_mark_of_another_shape_is_left_in_by_both() -> None:
    value = {"a": 1, "cache_control": {"nested": {"deep": 1}}}
    data = orjson.dumps(value)
    assert without_cache_mark_bytes(data) == data
    assert without_cache_marks(value) is value


def test_without_cache_marks_copies_only_the_containers_that_hold_a_mark() -> None:
    mark = {"type": "ephemeral"}
    unmarked = {"type": "text", "text": "kept"}
    marked = {"type": "tool_result", "content": "out", "cache_control": mark}
    message = {"role": "user", "content": [unmarked, marked]}
    without = without_cache_marks(message)
    assert without == {
        "role": "user",
        "content": [unmarked, {"type": "tool_result", "content": "out"}],
    }
    assert without["content"][0] is unmarked  # no mark inside: the same object
    assert without["content"][1]["content"] is marked["content"]
    assert without_cache_marks(unmarked) is unmarked
    spelled = orjson.dumps({"text": '"cache_control":{"type":"ephemeral"}'})
    assert without_cache_mark_bytes(spelled) == spelled
