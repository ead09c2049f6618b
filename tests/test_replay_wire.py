"""Replay in each wire format (proxy/replay_wire.py, proxy/replay.py).

The converter from corpus transcripts (chat messages) to Anthropic Messages and OpenAI
Responses bodies reads back to the same conversation, pairs every tool call by the dialect's
own rules, and puts cache_control where OpenCode does; a replay in each dialect gives that
dialect's figures and names the source tool and compressor of every hidden probe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.markers import ccr_key, marker
from compressors.outputs import ToolOutput
from compressors.pipeline import SessionMemo
from compressors.registry import COMPRESSORS
from compressors.tokens import TokenCounter
from compressors.view import Kind
from compressors.wire import parse_conversation
from proxy.cli import main
from proxy.compression import compression_settings
from proxy.config import Settings
from proxy.replay import handled_by, replay_transcript
from proxy.replay_wire import DIALECTS, paired_calls, payload, request_body, to_chat

ALL = tuple(DIALECTS)
NEEDLE = "worker 123 processed batch 861"


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _log(lines: int) -> str:
    return "\n".join(
        f"2024-01-01 12:00:{n % 60:02d} INFO worker {n} processed batch {n * 7}"
        for n in range(lines)
    )


def conversation() -> list[dict[str, Any]]:
    """Two user turns, reasoning, parallel tool calls, a long log and a file read."""
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "The nightly job fails; find out why."},
        {
            "role": "assistant",
            "content": "Reading the log and the job.",
            "reasoning_content": "The log first, then the job script.",
            "tool_calls": [
                _call("c1", "bash", {"command": "cat nightly.log"}),
                _call("c2", "read", {"filePath": "job.py"}),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": _log(400)},
        {"role": "tool", "tool_call_id": "c2", "content": "def run():\n    return 1\n"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c3", "bash", {"command": "pytest -q"})],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "3 passed"},
        {"role": "assistant", "content": "The tests pass; the log looks clean."},
        {"role": "user", "content": "Which batch did worker 123 process?"},
        {"role": "assistant", "content": f"The log says {NEEDLE}."},
    ]


TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "run", "parameters": {}}},
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
]


def _normal(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a conversation says, whatever the wire spelling of empty content or arguments."""
    rows = []
    for m in messages:
        calls = tuple(
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
            for c in m.get("tool_calls") or ()
        )
        rows.append(
            (
                m["role"],
                m.get("content") or "",
                m.get("reasoning_content") or "",
                calls,
                m.get("tool_call_id"),
            )
        )
    return rows


@pytest.mark.parametrize("dialect", ALL)
def test_converter_round_trips_and_pairs_by_the_dialects_rules(dialect: str) -> None:
    messages = conversation()
    body = request_body(dialect, messages, TOOLS)
    assert _normal(to_chat(dialect, body)) == _normal(messages)
    assert paired_calls(dialect, body) == {"c1", "c2", "c3"}
    assert messages == conversation()  # the transcript is not touched
    # the proxy's own parser reads every tool result and call of the body
    parsed = parse_conversation(DIALECTS[dialect], body)
    assert parsed.count(Kind.TOOL_RESULT) == 3 and parsed.count(Kind.TOOL_CALL) == 3
    assert parsed.count(Kind.REASONING) == 1


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System, then user turns of assistant steps, each step's calls answered at once."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(TEXT)}]
    calls = 0
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT)})
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"call_{calls + n}" for n in range(draw(st.integers(0, 3)))]
            calls += len(ids)
            step: dict[str, Any] = {"role": "assistant", "content": draw(TEXT) or None}
            if reasoning := draw(TEXT):
                step["reasoning_content"] = reasoning
            if ids:
                args = draw(st.dictionaries(st.sampled_from("abc"), TEXT, max_size=2))
                step["tool_calls"] = [
                    _call(i, draw(st.sampled_from(["bash", "read"])), args) for i in ids
                ]
            messages.append(step)
            messages += [{"role": "tool", "tool_call_id": i, "content": draw(TEXT)} for i in ids]
            if not ids:
                break  # a step without calls ends the turn
        else:
            messages.append({"role": "assistant", "content": draw(TEXT)})
    return messages


@settings(max_examples=40, deadline=None)
@given(conversations(), st.sampled_from(ALL))
def test_any_conversation_round_trips(messages: list[dict[str, Any]], dialect: str) -> None:
    body = request_body(dialect, messages, TOOLS)
    assert _normal(to_chat(dialect, body)) == _normal(messages)
    ids = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    assert paired_calls(dialect, body) == ids


@pytest.mark.parametrize("dialect", ALL)
def test_pairing_fails_when_a_result_goes_missing(dialect: str) -> None:
    messages = [m for m in conversation() if m.get("tool_call_id") != "c2"]
    assert paired_calls(dialect, request_body(dialect, messages, TOOLS)) == {"c1", "c3"}


def test_anthropic_result_must_follow_its_call_at_once() -> None:
    body = request_body("anthropic", conversation(), TOOLS)
    results = body["messages"][2]  # user message with the tool_result blocks of c1, c2
    body["messages"].insert(2, {"role": "assistant", "content": [{"type": "text", "text": "."}]})
    body["messages"].insert(2, {"role": "user", "content": [{"type": "text", "text": "?"}]})
    assert body["messages"][4] is results
    assert paired_calls("anthropic", body) == {"c3"}


def test_anthropic_body_as_opencode_sends_it() -> None:
    body = request_body("anthropic", conversation()[:-1], TOOLS)
    assert body["system"] == [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant"] * 3 + ["user"]  # alternating, tool results merged
    first = body["messages"][1]["content"]
    assert [b["type"] for b in first] == ["thinking", "text", "tool_use", "tool_use"]
    assert first[0]["signature"] and first[2]["input"] == {"command": "cat nightly.log"}
    marked = [
        (n, b["type"])
        for n, m in enumerate(body["messages"])
        for b in m["content"]
        if "cache_control" in b
    ]
    assert marked == [(5, "text"), (6, "text")]
    tools = body["tools"]
    assert [t["name"] for t in tools] == ["bash", "read"] and "input_schema" in tools[0]


def test_anthropic_cache_control_never_on_thinking_nor_past_four_breakpoints() -> None:
    messages = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "system", "content": "c"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "reasoning_content": "hmm"},
    ]
    body = request_body("anthropic", messages, [])
    assert "cache_control" not in body["messages"][-1]["content"][0]  # the thinking block
    text = json.dumps(body)
    assert text.count("cache_control") <= 4
    assert [("cache_control" in b) for b in body["system"]] == [True, True, False]


def test_responses_body_has_instructions_and_input_items() -> None:
    body = request_body("responses", conversation(), TOOLS)
    assert body["instructions"] == "You are a coding agent."
    kinds = [item.get("type") for item in body["input"]]
    assert kinds[:6] == [
        "message",
        "reasoning",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
    ]
    reasoning = body["input"][1]
    assert reasoning["encrypted_content"] and reasoning["summary"][0]["type"] == "summary_text"
    assert body["tools"][0] == {
        "type": "function",
        "name": "bash",
        "description": "run",
        "parameters": {},
    }


def test_payload_leaves_cache_control_out() -> None:
    body = request_body("anthropic", conversation()[:3], TOOLS)
    later = request_body("anthropic", conversation()[:6], TOOLS)
    assert "cache_control" not in json.dumps(payload("anthropic", body))
    # so an unchanged message reads the same in the next request
    assert payload("anthropic", later)[:2] == payload("anthropic", body)[:2]


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    path = tmp_path / "nightly.json"
    probes = [
        {"probe": NEEDLE, "tool_message_index": 3, "referencing_turn_index": 9},
        {"probe": "def run()", "tool_message_index": 4, "referencing_turn_index": 5},
    ]
    path.write_bytes(orjson.dumps({"messages": conversation(), "tools": TOOLS, "probes": probes}))
    return path


def test_replay_in_each_dialect_gives_its_own_figures(transcript: Path, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    counter = TokenCounter()
    reports = {d: replay_transcript(transcript, settings, counter, d) for d in ALL}
    totals = {d: r.totals() for d, r in reports.items()}
    for dialect, report in reports.items():
        assert report.dialect == dialect
        assert [r.index for r in report.requests] == [2, 5, 7, 9]
        assert totals[dialect]["pairing_errors"] == 0
        assert totals[dialect]["tokens_proxied"] < totals[dialect]["tokens_original"]
        assert [p.status for p in report.probes] == ["visible", "recoverable"]
    # the same conversation costs a different number of tokens in each wire format
    assert len({t["tokens_original"] for t in totals.values()}) == 3


def test_hidden_probes_name_source_tool_and_compressor(
    transcript: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {c.name for c in COMPRESSORS}
    settings = Settings(data_dir=tmp_path / "data")
    for dialect in ALL:
        report = replay_transcript(transcript, settings, TokenCounter(), dialect)
        visible, hidden = report.probes
        assert (visible.tool, visible.compressor) == ("read", "")
        assert hidden.tool == "bash" and hidden.compressor in names
        assert report.totals()["hidden_probes"] == [
            {"tool": "bash", "compressor": hidden.compressor, "recoverable": 1, "lost": 0}
        ]
        html = tmp_path / f"{dialect}.html"
        argv = [str(transcript), "--dialect", dialect, "--html", str(html)]
        assert main(["replay", *argv, "--data-dir", str(tmp_path / "data")]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0] == f"dialect: {dialect}"
        assert f"  nightly: bash -> {hidden.compressor} 1/0" in out
        page = html.read_text()
        assert (
            f'data-hidden-in="nightly" data-tool="bash" data-compressor="{hidden.compressor}" '
            'data-recoverable="1" data-lost="0"' in page
        )
        assert f"sent as {dialect} requests" in page


def test_replay_json_names_the_dialect(
    transcript: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", str(transcript), "--json", "--dialect", "responses"]
    assert main([*argv, "--data-dir", str(tmp_path / "data")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dialect"] == "responses"
    probes = result["transcripts"][0]["probes"]
    assert [(p["tool"], p["status"]) for p in probes] == [
        ("read", "visible"),
        ("bash", "recoverable"),
    ]


def test_handled_by_tells_what_became_of_an_output() -> None:
    settings = compression_settings(Settings())
    memo = SessionMemo()
    output = ToolOutput(_log(400), "bash", '{"command": "cat nightly.log"}')
    key = ccr_key(output.text)
    assert handled_by(None, output, memo, settings) == "dropped"
    assert handled_by(output.text, output, memo, settings) == "not compressed"
    assert handled_by(output.text[:100], output, memo, settings) == "rewritten"
    pointer = marker("identical to an earlier bash output with the same arguments", key)
    assert handled_by(pointer, output, memo, settings) == "dedup"
    forged = marker("400 lines omitted", key) + "\nsomething no compressor wrote"
    assert handled_by(forged, output, memo, settings) == "unattributed"


def test_digests_are_stable_and_a_changed_request_is_named(
    transcript: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import replay_digests

    recorded = tmp_path / "digests.json"
    assert replay_digests.main([str(transcript), "--out", str(recorded)]) == 0
    digests = orjson.loads(recorded.read_bytes())
    assert set(digests) == {"chat", "anthropic", "responses"}
    assert all(len(set(d["nightly"])) == len(d["nightly"]) > 2 for d in digests.values())
    assert replay_digests.main([str(transcript), "--compare", str(recorded)]) == 0
    assert "identical" in capsys.readouterr().out

    digests["anthropic"]["nightly"][2] = "0" * 24
    recorded.write_bytes(orjson.dumps(digests))
    assert replay_digests.main([str(transcript), "--compare", str(recorded)]) == 1
    out = capsys.readouterr().out
    assert "anthropic nightly: 1 of" in out and "first at request 2" in out


def test_digests_with_memory_carry_the_injected_blocks_and_are_stable(
    transcript: Path, tmp_path: Path
) -> None:
    from benchmarks import replay_digests

    plain, with_memory = tmp_path / "plain.json", tmp_path / "memory.json"
    assert replay_digests.main([str(transcript), "--out", str(plain)]) == 0
    assert replay_digests.main([str(transcript), "--memory", "--out", str(with_memory)]) == 0
    before, after = orjson.loads(plain.read_bytes()), orjson.loads(with_memory.read_bytes())
    pairs = [
        pair for d in before for pair in zip(before[d]["nightly"], after[d]["nightly"], strict=True)
    ]
    assert pairs and all(old != new for old, new in pairs)  # the stable block is on every one
    assert replay_digests.main([str(transcript), "--memory", "--compare", str(with_memory)]) == 0


def test_digests_of_whole_parses_match_the_incremental_ones(
    transcript: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import replay_digests

    incremental = tmp_path / "incremental.json"
    assert replay_digests.main([str(transcript), "--out", str(incremental)]) == 0
    assert replay_digests.main([str(transcript), "--whole", "--compare", str(incremental)]) == 0
    assert "identical" in capsys.readouterr().out
