"""Old tool-call arguments: long strings cut to their start behind a marker, shape kept."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from compressors.calls import KEPT_VALUE_CHARS, MIN_ARGUMENTS_CHARS, cut_call
from compressors.markers import MARKER_RE, ccr_key

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "data"


def _cut(arguments: dict | str) -> dict:
    original = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    text = cut_call(arguments, original, ccr_key(original))
    assert text is not None
    return orjson.loads(text)


def test_an_edit_keeps_its_path_and_flags_and_the_start_of_each_long_string() -> None:
    new = "\n".join(f"    total_{n} = compute_{n}(amount)" for n in range(80))
    old = "\n".join(f"    value_{n} = legacy_{n}(amount)" for n in range(60))
    arguments = {"file_path": "/repo/billing.py", "replace_all": False, "old_string": old}
    arguments["new_string"] = new
    cut = _cut(arguments)
    assert list(cut) == list(arguments)  # same keys, same order
    assert cut["file_path"] == "/repo/billing.py" and cut["replace_all"] is False
    for name, value in (("old_string", old), ("new_string", new)):
        head, _, _rest = cut[name].partition("\n[deep-memory: ")
        assert value.startswith(head) and 0 < len(head) <= KEPT_VALUE_CHARS
        found = MARKER_RE.search(cut[name])
        assert found is not None
        kept = head.count("\n") + 1
        total = value.count("\n") + 1
        assert found.group("what") == f"{total - kept} of {total} lines of {name} omitted"
        key = ccr_key(orjson.dumps(arguments).decode())
        assert found.group("key") == key  # the whole original call, one key


def test_small_calls_and_arguments_that_are_not_an_object_pass() -> None:
    small = orjson.dumps({"command": "ls -la"}).decode()
    assert cut_call(small, small, ccr_key(small)) is None
    not_json = "*** Begin Patch\n" + "+line\n" * 400
    assert cut_call(not_json, not_json, ccr_key(not_json)) is None
    a_list = orjson.dumps(["x" * 2000]).decode()
    assert cut_call(a_list, a_list, ccr_key(a_list)) is None
    short_values = orjson.dumps({f"k{n}": "v" * 50 for n in range(40)}).decode()
    assert len(short_values) >= MIN_ARGUMENTS_CHARS
    assert cut_call(short_values, short_values, ccr_key(short_values)) is None


def test_an_object_input_and_nested_strings_are_cut_in_place() -> None:
    findings = [{"file": "a.go", "line": n, "summary": "why " * 120} for n in range(3)]
    arguments = {"findings": findings, "note": "short"}
    original = orjson.dumps(arguments).decode()
    text = cut_call(arguments, original, ccr_key(original))  # Anthropic: an object
    assert text is not None
    cut = orjson.loads(text)
    assert arguments["findings"][0]["summary"] == "why " * 120  # the input is not mutated
    assert [f["file"] for f in cut["findings"]] == ["a.go"] * 3
    assert [f["line"] for f in cut["findings"]] == [0, 1, 2]
    assert all("characters of summary omitted" in f["summary"] for f in cut["findings"])
    assert cut["note"] == "short"


def test_huge_integers_keep_their_value() -> None:
    original = '{"id": 123456789012345678901234567890, "content": "' + "x\\n" * 400 + '"}'
    text = cut_call(original, original, ccr_key(original))
    assert text is not None
    assert json.loads(text)["id"] == 123456789012345678901234567890


def _corpus_calls(name: str, tool: str) -> list[str]:
    path = CORPUS / f"{name}.json"
    if not path.exists():
        pytest.skip("the shared corpus is not beside this checkout")
    messages = json.loads(path.read_text())["messages"]
    return [
        call["function"]["arguments"]
        for message in messages
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == tool
        and len(call["function"]["arguments"]) >= MIN_ARGUMENTS_CHARS
    ]


@pytest.mark.parametrize(
    ("transcript", "tool", "kept_field"),
    [
        ("cc-ccbackend-020fd1ca", "Edit", "file_path"),
        ("cc-ccbackend-135c59e3", "Agent", "subagent_type"),
        ("cx-sessionbridge-019d6bdc", "apply_patch", None),
        ("oc-restartyhn-1b6de136", "write", "filePath"),
    ],
)
def test_real_calls_get_smaller_and_keep_their_short_fields(
    transcript: str, tool: str, kept_field: str | None
) -> None:
    calls = _corpus_calls(transcript, tool)
    assert calls
    for raw in calls:
        text = cut_call(raw, raw, ccr_key(raw))
        if text is None:
            continue
        before, after = orjson.loads(raw), orjson.loads(text)
        assert list(after) == list(before)
        assert len(text) < len(raw)
        if kept_field:
            assert after[kept_field] == before[kept_field]
        assert ccr_key(raw) in text
        if tool == "apply_patch":  # the patch names its file in its first lines
            assert after["input"].startswith("*** Begin Patch\n*** ")
