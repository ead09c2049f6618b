"""Unified diffs: headers and hunk positions stay, changed lines with names before context."""

from __future__ import annotations

import json

import orjson
import pytest

from compressors.outputs import Budget, ToolOutput
from compressors.pipeline import CompressionSettings, SessionMemo, compress
from compressors.registry import candidates, compress_output
from compressors.tools.diff import is_diff
from compressors.view import Dialect
from compressors.wire import parse_conversation
from tests.conftest import CORPUS


def git_show(files: int = 6) -> str:
    parts = [
        "commit 6f7e262f3f665ab5b007805a2e707adf8d7b4cd9",
        "Author: A Dev <a@example.org>",
        "Date:   Thu Jun 4 18:33:30 2026 +0200",
        "",
        "    Harden session handling",
        "",
    ]
    for f in range(files):
        parts += [
            f"diff --git a/internal/auth/file_{f}.go b/internal/auth/file_{f}.go",
            f"index 061d056b..fe6a7a{f:02d} 100644",
            f"--- a/internal/auth/file_{f}.go",
            f"+++ b/internal/auth/file_{f}.go",
            f"@@ -{100 + f},12 +{100 + f},13 @@ func setup{f}(t *testing.T) *api.RestAPI {{",
        ]
        parts += [f"  \tcontext line {i} of file {f} with nothing new" for i in range(12)]
        parts += [
            f'-\tkey := os.Getenv("SESSION_KEY_{f}")',
            f"+\tkey, err := loadSessionKey{f}(cfg.SessionKeyPath)",
            "+",
        ]
        parts += [f"  \tmore context {i} of file {f}" for i in range(12)]
    return "\n".join(parts) + "\n"


def bash(text: str, command: str) -> ToolOutput:
    return ToolOutput(text, "Bash", json.dumps({"command": command}))


def test_git_show_keeps_headers_hunks_and_changed_lines():
    text = git_show()
    assert is_diff(text)
    outcome = compress_output(bash(text, "git show 6f7e262f"), Budget(2500, 1, 2500))
    assert outcome is not None and outcome[0] == "diff"
    kept = outcome[1].text
    assert "Harden session handling" in kept
    for f in range(6):
        assert f"diff --git a/internal/auth/file_{f}.go" in kept
        assert f"@@ -{100 + f},12 +{100 + f},13 @@" in kept
        assert f"loadSessionKey{f}" in kept
    assert "context line 3 of file 0" not in kept
    assert "changed lines" in outcome[1].omitted


def test_not_a_diff_is_left_to_the_others():
    log = "\n".join(f"ok {i} - test_thing_{i} passed -- +1 -0" for i in range(300))
    assert not is_diff(log)
    assert candidates(bash(log, "git show HEAD"))[0].name == "json"
    assert compress_output(bash(log, "make test"), Budget(500))[0] != "diff"


def test_a_large_diff_is_not_compressed_on_arrival():
    text = git_show(files=40)  # well over the arrival size for logs
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "review the fix"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "g",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": json.dumps({"command": "git show"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "g", "content": text},
    ]
    conversation = parse_conversation(Dialect.OPENAI_CHAT, {"messages": messages})
    outcome = compress(conversation, SessionMemo(), CompressionSettings())
    assert not outcome.changed and conversation.body["messages"][-1]["content"] == text


def test_corpus_git_show_goes_to_the_diff_compressor():
    path = CORPUS / "cc-ccbackend-135c59e3.json"
    if not path.exists():
        pytest.skip("the shared corpus is not next to this clone")
    messages = orjson.loads(path.read_bytes())["messages"]
    calls = {c["id"]: c["function"] for m in messages for c in m.get("tool_calls") or []}
    function = calls[messages[9]["tool_call_id"]]
    output = ToolOutput(messages[9]["content"], function["name"], function["arguments"])
    settings = CompressionSettings()
    outcome = compress_output(output, settings.budget(output.text, 1))
    assert outcome is not None and outcome[0] == "diff"
    assert "@@ -9,7 +9,6 @@ package auth" in outcome[1].text
