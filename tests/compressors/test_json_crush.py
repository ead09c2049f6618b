"""The JSON compressor: lossless tables, trimmed arrays and objects, cut strings, JSON Lines."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest

from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import compress_output
from compressors.tools import json_crush

HEADER = re.compile(r"^ *columns: (\[.*\]) \(one row of values per object, (\d+) objects\)$")
GAP = re.compile(r"^ *\[… (\d+) (rows?|items?|keys?|lines?) omitted …\],?$")


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _budget(text: str, level: int = 1) -> Budget:
    return Budget(max(1000, len(text) // (4 if level == 1 else 8)), level)


def _crush(text: str, budget: Budget | None = None) -> Compressed:
    output = ToolOutput(text, "mcp__github__list_issues")
    result = json_crush.compress(output, budget or _budget(text))
    assert result is not None
    return result


def _table(out: str) -> tuple[list[str], int, list[list[Any]], int]:
    """Columns, object count, the rows shown and the rows a gap line counts."""
    columns: list[str] = []
    count = omitted = 0
    rows: list[list[Any]] = []
    for line in out.split("\n"):
        header = HEADER.match(line)
        gap = GAP.match(line)
        if header:
            columns, count = orjson.loads(header.group(1)), int(header.group(2))
        elif gap and columns:
            omitted += int(gap.group(1))
        elif columns and line.strip().startswith("["):
            rows.append(orjson.loads(line.strip()))
    return columns, count, rows, omitted


def _pipeline_runs(count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": 9100 + i,
            "name": f"build-{i}",
            "path": f".github/workflows/ci-{i % 4}.yml",
            "status": "failure" if i in (37, 151) else "success",
            "duration_s": 60 + i % 17,
        }
        for i in range(count)
    ]


def test_uniform_objects_become_a_lossless_table() -> None:
    runs = _pipeline_runs(60)
    text = _pretty(runs)
    result = _crush(text, Budget(len(text) // 2))
    assert result.omitted == "tabular form of 60 objects, no values omitted"
    columns, count, rows, omitted = _table(result.text)
    assert (columns, count, omitted) == (["id", "name", "path", "status", "duration_s"], 60, 0)
    assert [dict(zip(columns, row, strict=True)) for row in rows] == runs


def test_a_long_table_keeps_ends_and_failures_and_counts_every_row() -> None:
    runs = _pipeline_runs(400)
    text = _pretty(runs)
    result = _crush(text)
    _, count, rows, omitted = _table(result.text)
    assert count == 400 and len(rows) + omitted == 400
    ids = [row[0] for row in rows]
    assert ids[0] == 9100 and ids[-1] == 9499
    assert 9137 in ids and 9251 in ids  # the two failed runs
    assert result.omitted == f"{omitted} of 400 array items omitted (tabular form of 400 objects)"
    assert len(result.text) <= _budget(text).max_chars * 1.1


def test_objects_of_a_new_shape_in_the_middle_are_kept() -> None:
    events = [{"type": "push", "ref": f"refs/heads/f{i}", "sha": f"{i:040x}"} for i in range(300)]
    events[170] = {"type": "deployment", "environment": "prod", "deployment_id": 88211}
    events[171] = {"type": "push", "sha": "d" * 40, "forced": True, "ref": "refs/heads/main"}
    result = _crush(_pretty(events))
    assert '"deployment_id":88211' in result.text.replace(" ", "")
    assert '"forced":true' in result.text.replace(" ", "")
    assert re.search(r"\[… \d+ (?:items|rows) omitted …\]", result.text)


def _container() -> dict[str, Any]:
    return {
        "Id": "4f66ad9a0b2b" * 5,
        "Name": "/payments-api",
        "State": {
            "Status": "exited",
            "ExitCode": 137,
            "Error": "OOMKilled: container exceeded its 512Mi memory limit",
            "StartedAt": "2024-06-12T08:31:02.114Z",
        },
        "Config": {
            "Env": [f"FEATURE_FLAG_{i}=on" for i in range(150)],
            "Labels": {f"com.example.team.label{i}": f"value-{i}" for i in range(80)},
            "Image": "registry.example.com/payments-api:2.14.0",
        },
        "LogTail": "GC pause 12ms; " * 3000 + "fatal: out of memory in allocator arena 3",
    }


def test_nested_object_keeps_error_fields_and_cuts_with_exact_counts() -> None:
    container = _container()
    text = _pretty(container)
    result = _crush(text)
    out = result.text
    assert '"Name": "/payments-api"' in out
    assert '"ExitCode": 137' in out
    assert "OOMKilled: container exceeded its 512Mi memory limit" in out
    assert "registry.example.com/payments-api:2.14.0" in out
    # the long string keeps its start and its end, and the cut is exact
    cut = re.search(r'"LogTail": "(.*?)\[… (\d+) characters omitted …\](.*?)"', out)
    assert cut is not None
    head, omitted, tail = cut.group(1), int(cut.group(2)), cut.group(3)
    log = container["LogTail"]
    assert log.startswith(head) and log.endswith(tail)
    assert len(head) + omitted + len(tail) == len(log)
    assert tail.endswith("fatal: out of memory in allocator arena 3")
    # arrays and objects say how much they lost, and the phrase adds it up
    env_gap = re.search(r"\[… (\d+) items omitted …\]", out)
    assert env_gap is not None
    assert f"{omitted} characters of 1 long string" in result.omitted
    assert "array items" in result.omitted and "object keys" in result.omitted
    assert len(out) < len(text) // 3


def test_key_order_is_the_original_order() -> None:
    document = {"zeta": list(range(400)), "alpha": "x" * 3000, "mid": {"b": 1, "a": 2}}
    out = _crush(_pretty(document)).text
    assert out.index('"zeta"') < out.index('"alpha"') < out.index('"mid"')
    assert '{"b":1,"a":2}' in out


def test_json_lines_keep_one_record_per_line() -> None:
    records = [
        {"ts": f"08:{i // 60:02d}:{i % 60:02d}", "level": "info", "msg": f"GET /api/items/{i} 200"}
        for i in range(300)
    ]
    records[211] = {"ts": "08:03:31", "level": "error", "msg": "POST /api/pay 500: card declined"}
    text = "\n".join(orjson.dumps(record).decode() for record in records)
    result = _crush(text)
    lines = result.text.split("\n")
    assert lines[0].startswith("columns: ")
    assert "POST /api/pay 500: card declined" in result.text
    _, count, rows, omitted = _table(result.text)
    assert count == 300 and len(rows) + omitted == 300
    assert result.omitted == f"{omitted} of 300 lines omitted (tabular form of 300 objects)"
    assert all(not line.startswith(("  ", "[\n")) for line in lines)


@pytest.mark.parametrize(
    "text",
    [
        "[File: /apispec/src/apispec/ext/marshmallow/openapi.py (296 lines total)]\n1:import re\n"
        * 40,
        "{ this is not json " * 100,
        "plain text output\n" * 100,
        "[1, 2, 3]\nnot json at all\n" * 60,
        '{"a": 1}' + " trailing" * 100,
    ],
)
def test_text_that_is_not_json_is_left_to_others(text: str) -> None:
    assert json_crush.compress(ToolOutput(text, "x"), Budget(1000)) is None


def test_integers_beyond_64_bits_step_aside_rather_than_print_floats() -> None:
    big = [{"id": 123456789012345678901234567890 + i, "v": "x" * 40} for i in range(100)]
    text = json.dumps(big, indent=2)
    assert json_crush.compress(ToolOutput(text, "x"), _budget(text)) is None
    # a long digit run inside a string is fine
    text = _pretty([{"sha": "1" * 40, "v": "x" * 40, "n": i} for i in range(100)])
    assert json_crush.compress(ToolOutput(text, "x"), _budget(text)) is not None


@pytest.mark.parametrize(
    "text",
    [
        "[" * 300 + "]" * 300,
        "[" * 5000 + "]" * 5000,
        "[" + ",".join(["[]"] * 3000) + "]",
        '{"s": "' + "\\u0000" * 20_000 + '"}',
        '["\\ud800 lone surrogate escape", ' + ",".join(['"x"'] * 500) + "]",
        "[" + ",".join(str(i) for i in range(20_000)) + "]",
    ],
)
def test_hostile_documents_never_raise(text: str) -> None:
    result = json_crush.compress(ToolOutput(text, "x"), _budget(text))
    if result is not None:
        assert len(result.text) < len(text)


def test_small_documents_and_documents_within_budget_are_left_alone() -> None:
    small = _pretty(_pipeline_runs(2))
    assert json_crush.compress(ToolOutput(small, "x"), Budget(1000)) is None
    text = _pretty(_pipeline_runs(50))
    assert json_crush.compress(ToolOutput(text, "x"), Budget(len(text))) is None


def test_deterministic_and_deeper_levels_are_smaller() -> None:
    text = _pretty(_container())
    first, again = _crush(text), _crush(text)
    deeper = _crush(text, _budget(text, level=2))
    assert first == again
    assert len(deeper.text) < len(first.text)
    assert '"ExitCode": 137' in deeper.text


def test_routing_of_json_from_tools_of_any_agent() -> None:
    text = _pretty({"total_count": 400, "items": _pipeline_runs(400)})
    for tool in ("mcp__github__list_workflow_runs", "WebFetch", "webfetch", "fetch"):
        routed = compress_output(ToolOutput(text, tool), _budget(text))
        assert routed is not None
        assert routed[0] == "json", tool
        assert "tabular form of 400 objects" in routed[1].omitted


def test_items_naming_task_terms_are_kept() -> None:
    runs = [{"id": i, "workflow": f"ci-{i % 5}", "note": "routine"} for i in range(500)]
    runs[260]["workflow"] = "athena-nightly"
    text = _pretty(runs)
    plain = json_crush.compress(ToolOutput(text, "x"), _budget(text))
    focused = json_crush.compress(ToolOutput(text, "x", "", frozenset({"athena"})), _budget(text))
    assert plain is not None and focused is not None
    assert "athena-nightly" not in plain.text
    assert "athena-nightly" in focused.text


def test_a_string_is_cut_only_when_its_gap_line_is_shorter_than_the_cut() -> None:
    for length in range(41, 400):
        for budget in range(20, length + 40, 7):
            value = "x" * length
            cut = json_crush._cut_string(value, budget, json_crush.Crush())
            if isinstance(cut, json_crush.Cut):
                assert len(cut.text()) < len(orjson.dumps(value))
