"""Tools of real agents found by name and by the command their shell runs: Codex CLI's
``shell_command`` (a file view through ``sed -n``/``cat``), argv-list commands."""

from __future__ import annotations

import json

import orjson
import pytest

from compressors.outputs import ToolOutput
from compressors.pipeline import CompressionSettings
from compressors.registry import FILE_READ, SEARCH, candidates, command_text, compress_output
from tests.conftest import CORPUS

SETTINGS = CompressionSettings()


def codex_view(command: str) -> ToolOutput:
    source = "\n".join(
        f"export function handler{i}(input: Request{i}): Response{i} {{ return run{i}(input); }}"
        for i in range(240)
    )
    text = f"Exit code: 0\nWall time: 0 seconds\nOutput:\n{source}\n"
    arguments = json.dumps({"command": command, "workdir": "/repo", "timeout_ms": 1000})
    return ToolOutput(text, "shell_command", arguments)


def test_codex_shell_command_viewing_a_file_is_a_file_view():
    output = codex_view("sed -n '1,240p' src/checkpoints/transcript.ts")
    assert candidates(output)[0] is FILE_READ
    outcome = compress_output(output, SETTINGS.budget(output.text, 1))
    assert outcome is not None and outcome[0] == "file_read"
    assert outcome[1].text.startswith("Exit code: 0")


def test_codex_shell_command_search_is_a_search():
    assert candidates(codex_view("rg -n handler src"))[0] is SEARCH


def test_argv_list_commands_name_their_script():
    assert command_text(json.dumps({"command": ["bash", "-lc", "cat src/a.py"]})) == "cat src/a.py"
    assert command_text(json.dumps({"command": ["ls", "-la", "src dir"]})) == "ls -la 'src dir'"
    assert command_text(json.dumps({"cmd": "nl -ba a.py"})) == "nl -ba a.py"
    assert command_text("not json") == ""


def test_codex_corpus_file_views_go_to_the_file_compressor():
    path = CORPUS / "cx-sessionbridge-019d6bdc.json"
    if not path.exists():
        pytest.skip("the shared corpus is not next to this clone")
    messages = orjson.loads(path.read_bytes())["messages"]
    calls = {
        call["id"]: call["function"]
        for message in messages
        for call in message.get("tool_calls") or []
    }
    seen = 0
    for message in messages:
        function = calls.get(message.get("tool_call_id", ""))
        if function is None or not command_text(function["arguments"]).startswith("sed -n"):
            continue
        output = ToolOutput(message["content"], function["name"], function["arguments"])
        if len(output.text) < 4000:
            continue
        outcome = compress_output(output, SETTINGS.budget(output.text, 1))
        assert outcome is not None and outcome[0] == "file_read"
        seen += 1
    assert seen >= 5


def test_an_unnumbered_view_names_the_file_lines_each_gap_stands_for():
    output = codex_view("sed -n '101,340p' src/checkpoints/transcript.ts")
    outcome = compress_output(output, SETTINGS.budget(output.text, 1))
    assert outcome is not None and outcome[0] == "file_read"
    text = outcome[1].text
    assert text.startswith("Exit code: 0\nWall time: 0 seconds\nOutput:\n")
    assert outcome[1].omitted.endswith(" of 241 file lines omitted")  # not the 3 header lines
    # the first file line is line 101, so a gap after the kept head says where it is
    gaps = [line for line in text.split("\n") if line.startswith("[… ")]
    assert gaps and all("(file lines " in gap or "(file line " in gap for gap in gaps)
    first_kept = text.split("\n")[3]
    assert first_kept.startswith("export function handler0(")
    following = text.split("\n")[4:6]
    assert any(line.startswith("[… ") and "(file lines " in line for line in following) or (
        "handler1(" in following[0]
    )


def test_a_view_of_unknown_start_names_no_lines():
    output = codex_view("cat src/a.ts | tr a b")  # a pipeline: not a plain file view
    outcome = compress_output(output, SETTINGS.budget(output.text, 1))
    assert outcome is None or "(file line" not in outcome[1].text
