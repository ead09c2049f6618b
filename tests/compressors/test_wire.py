"""The wire formats: one list, one protocol, and nobody else branching on the dialect."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

from compressors.view import Dialect
from compressors.wire import (
    FORMATS,
    Usage,
    chat_dialect,
    read_usage,
    usage_markers,
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
