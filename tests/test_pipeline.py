"""The cache-safe policy of the compression pipeline, request by request."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings

from compressors.markers import marker_keys
from compressors.pipeline import CompressionSettings, SessionMemo, compress
from compressors.view import Dialect
from compressors.wire import parse_conversation
from memory.ccr import OriginalStore
from memory.db import open_database
from memory.memo import MemoStore
from proxy.addons import build_addons
from proxy.config import Settings
from proxy.pipeline import Outcome, rewrite_request
from proxy.replay_wire import DIALECTS, paired_calls, request_body, to_chat
from proxy.stores import open_stores
from tests.conftest import CAPTURES
from tests.strategies import rendered_sessions

SETTINGS = CompressionSettings(arrival_kinds=frozenset())  # arrival has its own test


def big_log(tag: str, lines: int = 400) -> str:
    body = [
        f"{tag} step {i}: processed item_{i} in module pkg.sub_{i % 7}.worker ok"
        for i in range(lines)
    ]
    body[lines // 2] = f"ERROR {tag}: ValueError: bad value in handler_{tag} at pkg/core.py:88"
    return "\n".join(body)


def call(call_id: str, command: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": command})},
            }
        ],
    }


def result(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def session(steps: int) -> list[dict]:
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the failing build."},
    ]
    for index in range(steps):
        messages += [
            call(f"c{index}", f"make step{index}"),
            result(f"c{index}", big_log(f"s{index}")),
        ]
    return messages


def run(
    messages: list[dict],
    memo: SessionMemo,
    settings: CompressionSettings = SETTINGS,
    dialect: Dialect = Dialect.OPENAI_CHAT,
    **body: object,
):
    conversation = parse_conversation(dialect, {"messages": copy.deepcopy(messages), **body})
    outcome = compress(conversation, memo, settings)
    return conversation.body, outcome


def test_latest_step_and_head_untouched_older_outputs_compressed_and_recoverable():
    messages = session(3)
    body, outcome = run(messages, SessionMemo())
    sent = body["messages"]
    assert sent[:2] == messages[:2]
    assert sent[-1] == messages[-1]  # the latest step: in full
    for index in (3, 5):
        text = sent[index]["content"]
        assert text.startswith("[deep-memory: ") and len(text) < len(messages[index]["content"]) / 2
        [key] = marker_keys(text)
        assert outcome.originals[key] == messages[index]["content"]
        assert "ValueError: bad value" in text  # the error line survives
    assert outcome.tokens_after < outcome.tokens_before


def test_each_message_keeps_its_bytes_in_later_requests():
    memo = SessionMemo()
    messages = session(6)
    previous: list[dict] | None = None
    for length in range(4, len(messages) + 1, 2):
        body, _ = run(messages[:length], memo)
        sent = body["messages"]
        if previous is not None:
            # only the step that just left the protected tail may change (a counted event)
            assert sent[: len(previous) - 1] == previous[:-1]
        previous = sent


def test_tail_budget_batches_rewrites():
    settings = CompressionSettings(tail_tokens=20_000, arrival_kinds=frozenset())
    memo = SessionMemo()
    messages = session(8)
    events = []
    for length in range(4, len(messages) + 1, 2):
        _, outcome = run(messages[:length], memo, settings)
        events.append(outcome.event)
    assert events.count("batch") >= 1
    assert events.count(None) > events.count("batch")  # most requests rewrite nothing


def test_duplicate_output_becomes_a_pointer_to_the_first_copy():
    text = big_log("same")
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        call("a", "pytest"),
        result("a", text),
        call("b", "pytest"),
        result("b", text),
        call("c", "ls"),
        result("c", "x"),
    ]
    body, _ = run(messages, SessionMemo())
    first, second = body["messages"][3]["content"], body["messages"][5]["content"]
    assert "identical to an earlier bash output" in second
    assert marker_keys(first) == marker_keys(second)
    assert len(second) < 200


def test_protected_tools_and_small_outputs_are_never_compressed():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "e", "type": "function", "function": {"name": "edit", "arguments": "{}"}}
            ],
        },
        result("e", big_log("edit")),
        call("s", "git status"),
        result("s", "clean"),
        call("z", "ls"),
        result("z", "x"),
    ]
    body, outcome = run(messages, SessionMemo())
    assert body["messages"] == messages
    assert not outcome.changed


def test_memo_survives_a_restart(tmp_path):
    db_path = tmp_path / "state.sqlite3"
    messages = session(4)
    memos = MemoStore(open_database(db_path))
    memo = memos.load("s1")
    body, outcome = run(messages, memo)
    memos.save("s1", memo, outcome.decisions)
    restarted = MemoStore(open_database(db_path)).load("s1")
    assert restarted.decisions == memo.decisions
    again, _ = run(messages, restarted)
    assert again == body


def test_pressure_cuts_later_outputs_deeper_without_rewriting_earlier_ones():
    settings = CompressionSettings(pressure_thresholds=(3_500,), arrival_kinds=frozenset())
    memo = SessionMemo()
    messages = session(0)
    for index in range(14):  # logs of about 1,500 tokens, compressed to about 200 each
        messages += [call(f"c{index}", "make"), result(f"c{index}", big_log(f"s{index}", 100))]
    previous: list[dict] | None = None
    events = []
    for length in range(4, len(messages) + 1, 2):
        body, outcome = run(messages[:length], memo, settings)
        events.append(outcome.event)
        sent = body["messages"]
        if previous is not None:  # a rewrite reaches back one step at most, never further
            assert sent[: len(previous) - 1] == previous[:-1]
        previous = sent
    assert "pressure" not in events
    assert memo.level == 2
    assert previous[3]["content"].startswith("[deep-memory: ")
    levels = [d.level for d in memo.decisions.values() if d.text is not None]
    assert levels[0] == 1 and levels[-1] == 2  # compressed once the context was large: deeper
    # A cold cache makes a rewrite free: then the older outputs are cut deeper too.
    conversation = parse_conversation(Dialect.OPENAI_CHAT, {"messages": copy.deepcopy(messages)})
    outcome = compress(conversation, memo, settings, cache_cold=True)
    assert outcome.event == "cold"
    assert {d.level for d in memo.decisions.values() if d.text is not None} == {2}


def test_pressure_recompresses_deeper_once_when_asked():
    settings = CompressionSettings(
        pressure_thresholds=(8_000,), arrival_kinds=frozenset(), recompress_on_pressure=True
    )
    memo = SessionMemo()
    messages = session(12)
    sizes, events = [], []
    for length in range(4, len(messages) + 1, 2):
        body, outcome = run(messages[:length], memo, settings)
        events.append(outcome.event)
        sizes.append(len(orjson.dumps(body)))
    assert events.count("pressure") == 1
    assert memo.level == 2


def subagent_session(report: str) -> list[dict]:
    task_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "t",
                "type": "function",
                "function": {"name": "Agent", "arguments": json.dumps({"prompt": "audit"})},
            }
        ],
    }
    return [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        task_call,
        result("t", report),
        call("a", "make"),
        result("a", big_log("a")),
        call("b", "ls"),
        result("b", "x"),
    ]


def test_a_subagent_report_stays_whole_up_to_its_cap():
    report = "\n".join(
        f"- Finding {i}: `pkg/auth/jwt_{i}.go:{i * 7}` validateUser_{i} skips the expiry check"
        for i in range(120)
    )
    body, _ = run(subagent_session(report), SessionMemo())
    assert body["messages"][3]["content"] == report  # what the subagent concluded, whole
    assert body["messages"][5]["content"].startswith("[deep-memory: ")  # older log: cut
    small_cap = CompressionSettings(arrival_kinds=frozenset(), whole_report_tokens=500)
    body, _ = run(subagent_session(report), SessionMemo(), small_cap)
    cut = body["messages"][3]["content"]
    assert cut.startswith("[deep-memory: ")
    # cut to about the cap (500 tokens, 2,000 characters), not to a tenth of the report
    assert len(report) * 0.11 + 400 < len(cut) < 2_600


def test_recent_window_keeps_the_newest_outputs_whole_and_moves_forward_only():
    settings = CompressionSettings(arrival_kinds=frozenset(), recent_tokens=(13_000,))
    memo = SessionMemo()
    messages = session(8)  # each log is about 6,000 tokens
    previous: list[dict] | None = None
    for length in range(4, len(messages) + 1, 2):
        body, _ = run(messages[:length], memo, settings)
        sent = body["messages"]
        if previous is not None:  # only what just left the window may change
            assert sent[: len(previous) - 3] == previous[:-3]
        previous = sent
    assert previous[-1] == messages[-1] and previous[-3] == messages[-3]  # within the window
    assert previous[-5]["content"].startswith("[deep-memory: ")


def test_strict_live_turn_changes_nothing_after_the_last_user_message():
    settings = CompressionSettings(compress_live_turn=False)
    messages = session(4)
    body, outcome = run(messages, SessionMemo(), settings)
    assert body["messages"] == messages and not outcome.changed
    with_new_turn = [
        *messages,
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next task"},
    ]
    body, outcome = run(with_new_turn, SessionMemo(), settings)
    assert body["messages"][-2:] == with_new_turn[-2:]
    assert outcome.changed


def _capture(name: str) -> tuple[str, dict]:
    capture = json.loads(next(CAPTURES.glob(f"*{name}*.json")).read_text())
    return capture["path"], capture["body"]


def test_anthropic_old_turn_thinking_dropped_live_turn_byte_identical():
    _, body = _capture("anthropic-messages-agent-with-thinking")
    live_start = max(
        i
        for i, m in enumerate(body["messages"])
        if m["role"] == "user" and all(b.get("type") == "text" for b in m["content"])
    )
    extended = copy.deepcopy(body)
    extended["messages"] += [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "live reasoning", "signature": "sig-live"},
                {
                    "type": "tool_use",
                    "id": "toolu_live",
                    "name": "bash",
                    "input": {"command": "ls"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_live", "content": "a\nb"}],
        },
    ]
    conversation = parse_conversation(Dialect.ANTHROPIC, copy.deepcopy(extended))
    outcome = compress(conversation, SessionMemo(), SETTINGS)
    sent = conversation.body["messages"]
    assert orjson.dumps(sent[live_start:]) == orjson.dumps(extended["messages"][live_start:])
    for message in sent[:live_start]:
        if message["role"] == "assistant":
            assert all(b["type"] != "thinking" for b in message["content"])
            assert any(b["type"] in ("tool_use", "text") for b in message["content"])
    assert outcome.counters["reasoning_dropped"] == 3


def test_responses_old_reasoning_items_dropped_live_turn_byte_identical():
    _, body = _capture("openai-responses-agent-with-reasoning")
    extended = copy.deepcopy(body)
    extended["input"] += [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "done"}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
        {"type": "reasoning", "encrypted_content": "LIVE-ENCRYPTED", "summary": []},
        {"type": "function_call", "call_id": "call_live", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_live", "output": "ok"},
    ]
    live = extended["input"][-4:]
    conversation = parse_conversation(Dialect.OPENAI_RESPONSES, copy.deepcopy(extended))
    compress(conversation, SessionMemo(), SETTINGS)
    sent = conversation.body["input"]
    assert orjson.dumps(sent[-4:]) == orjson.dumps(live)
    assert [e for e in sent[:-4] if e.get("type") == "reasoning"] == []
    assert sum(1 for e in sent if e.get("type") == "reasoning") == 1


def test_chat_reasoning_content_of_old_turns_dropped():
    _, body = _capture("openai-compatible-agent-with-tool-results")
    extended = copy.deepcopy(body)
    extended["messages"] += [
        {"role": "assistant", "content": "done", "reasoning_content": "why"},
        {"role": "user", "content": "thanks, next"},
    ]
    conversation = parse_conversation(Dialect.OPENAI_CHAT, copy.deepcopy(extended))
    compress(conversation, SessionMemo(), SETTINGS)
    sent = conversation.body["messages"]
    assert all("reasoning_content" not in m for m in sent[:-1])
    assert sent[-1] == extended["messages"][-1]


def test_originals_reach_the_store_and_expand(tmp_path):
    store = OriginalStore(open_database(tmp_path / "s.sqlite3"))
    body, outcome = run(session(3), SessionMemo())
    store.put_many(outcome.originals)
    for message in body["messages"]:
        for key in marker_keys(message.get("content") or ""):
            assert store.get(key) is not None


def test_huge_logs_and_listings_are_compressed_on_arrival_file_reads_are_not():
    listing = "\n".join(f"/repo/pkg{i % 40}/module_{i}.py" for i in range(3000))
    source = "\n".join(f"{n}: value_{n} = compute_{n}(value_{n - 1})" for n in range(1, 1500))
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        call("a", "make build"),
        result("a", big_log("huge", 2000)),
        call("b", "find /repo -name '*.py'"),
        result("b", listing),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "r",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"filePath": "/repo/a.py"}'},
                }
            ],
        },
        result("r", source),
    ]
    settings = CompressionSettings()
    body, _ = run(messages[:4], SessionMemo(), settings)
    assert body["messages"][3]["content"].startswith("[deep-memory: ")  # the log, at once
    memo = SessionMemo()
    for length in (6, 8):
        body, _ = run(messages[:length], memo, settings)
    sent = body["messages"]
    assert sent[5]["content"].startswith("[deep-memory: ")
    assert sent[7] == messages[7]  # a file read is shown in full on the step that asked for it


def _written_file_session() -> list[dict]:
    """Two user turns; in each the agent writes a long file, then reports."""
    body = "\n".join(f"def handler_{n}(request):\n    return respond({n})" for n in range(60))
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(2):
        path = f"/repo/handlers_{turn}.py"
        arguments = json.dumps({"file_path": path, "content": f"# turn {turn}\n{body}"})
        messages += [
            {"role": "user", "content": f"write handlers file {turn}"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"w{turn}",
                        "type": "function",
                        "function": {"name": "Write", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"w{turn}", "content": f"Wrote {path}"},
            {"role": "assistant", "content": f"Done with turn {turn}."},
        ]
    return messages[:-1]  # the request before the agent's last reply


@pytest.mark.parametrize("dialect", ["chat", "anthropic", "responses"])
def test_old_turns_calls_are_cut_live_turn_calls_are_byte_identical(dialect: str) -> None:
    messages = _written_file_session()
    wire = DIALECTS[dialect]
    original = request_body(dialect, messages, [])
    memo = SessionMemo()
    conversation = parse_conversation(wire, copy.deepcopy(original))
    outcome = compress(conversation, memo, SETTINGS)
    sent = conversation.body
    assert outcome.counters["calls_cut"] == 1
    old, live = (to_chat(dialect, sent)[i] for i in (2, 6))
    assert live == to_chat(dialect, original)[6]  # the live turn's call, byte for byte
    old_arguments = old["tool_calls"][0]["function"]["arguments"]
    cut = old_arguments if isinstance(old_arguments, dict) else json.loads(old_arguments)
    assert cut["file_path"] == "/repo/handlers_0.py"
    assert cut["content"].startswith("# turn 0\ndef handler_0(request):")
    keys = marker_keys(cut["content"])
    assert len(keys) == 1
    stored = outcome.originals[keys[0]]
    first_call = to_chat(dialect, original)[2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(stored) == (
        first_call if isinstance(first_call, dict) else json.loads(first_call)
    )
    assert paired_calls(dialect, sent) == paired_calls(dialect, original)
    # the next request sends the same bytes for the old call, from the memo
    again = parse_conversation(wire, copy.deepcopy(original))
    compress(again, memo, SETTINGS)
    assert orjson.dumps(again.body) == orjson.dumps(sent)


def test_responses_live_turn_call_kept_when_old_reasoning_items_go() -> None:
    """Regression: dropping an old turn's reasoning items renumbers the Responses input, and
    calls were then cut against the live turn's index as it arrived: with two items gone, the
    live turn's own call was cut."""
    original = request_body("responses", _written_file_session(), [])
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]}
    first_call = next(
        i for i, e in enumerate(original["input"]) if e.get("type") == "function_call"
    )
    original["input"][first_call:first_call] = [thought, copy.deepcopy(thought)]
    live_call = original["input"][-2]
    assert live_call["type"] == "function_call"
    conversation = parse_conversation(Dialect.OPENAI_RESPONSES, copy.deepcopy(original))
    outcome = compress(conversation, SessionMemo(), SETTINGS)
    assert outcome.counters["reasoning_dropped"] == 2
    assert outcome.counters["calls_cut"] == 1  # the old turn's, not the live one's
    assert conversation.body["input"][-2] == live_call


def test_cutting_old_calls_can_be_turned_off() -> None:
    messages = _written_file_session()
    settings = CompressionSettings(cut_old_calls=False)
    body, outcome = run(messages, SessionMemo(), settings)
    assert outcome.counters["calls_cut"] == 0
    assert body["messages"] == messages


def test_later_requests_hand_over_every_original_without_hashing_it_again(monkeypatch):
    import compressors.pipeline as pipeline

    memo = SessionMemo()
    messages = _written_file_session()
    _, first = run(messages, memo)
    assert first.originals and memo.original_keys
    hashed: list[str] = []
    real = pipeline.ccr_key
    monkeypatch.setattr(pipeline, "ccr_key", lambda text: hashed.append(text) or real(text))
    _, again = run(messages, memo)
    assert again.originals == first.originals  # each still reaches the store, to stay alive
    assert hashed == []  # but its key comes from the memo


def test_two_replicas_on_one_state_forward_the_bytes_one_process_would(tmp_path) -> None:
    """Replica B's copy of the session is stale (A served the request in between): its save
    conflicts, it decides again on A's state, and forwards what a single process forwards."""

    def replica(data_dir):
        settings = replace(Settings(), data_dir=data_dir)
        return build_addons(settings, open_stores(settings))

    shared, alone = tmp_path / "shared", tmp_path / "alone"
    shared.mkdir()
    alone.mkdir()
    a, b, single = replica(shared), replica(shared), replica(alone)
    headers = {"x-session-id": "s"}
    steps = session(6)
    bodies = [orjson.dumps({"model": "m", "messages": steps[: 2 + 2 * k]}) for k in range(2, 6)]
    served_by = [b, a, b, a]
    for raw, replica_addons in zip(bodies, served_by, strict=True):
        reference = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, single)
        got = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, replica_addons)
        assert got.outcome == reference.outcome == Outcome.REWRITTEN
        assert got.body == reference.body


def test_the_clock_tells_the_addons_how_long_a_session_was_idle() -> None:
    from memory.in_process import LocalClock

    idle: list[float | None] = []

    class Spy:
        def request(self, conversation, flow) -> bool:
            idle.append(flow.idle_seconds)
            return False

    clock = LocalClock(capacity=2)
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    for session in ("s", "s", "t", "u", "s"):  # "s" is forgotten once two others came since
        rewrite_request(raw, Dialect.OPENAI_CHAT, {"x-session-id": session}, [Spy()], clock)
    assert idle[0] is None and idle[1] is not None and 0 <= idle[1] < 5
    assert idle[2:] == [None, None, None]
    clock.seen("old", time.time() - 400)
    rewrite_request(raw, Dialect.OPENAI_CHAT, {"x-session-id": "old"}, [Spy()], clock)
    assert idle[-1] is not None and 399 < idle[-1] < 405


@settings(max_examples=60, deadline=None)
@given(rendered_sessions(1, 4))
def test_the_turn_fingerprint_counts_the_user_messages_and_reads_the_last_one(rendered):
    """``_turn_fingerprint`` counts the user messages that carry text in one pass and reads
    only the last one's texts: the same as from every user message's text joined."""
    import xxhash

    from compressors.pipeline import _turn_fingerprint

    conversation = parse_conversation(rendered.dialect, copy.deepcopy(rendered.body))
    texts = conversation.user_message_texts()
    last = texts[-1] if texts else ""
    expected = xxhash.xxh3_64_hexdigest(f"{len(texts)}\x00{last}".encode("utf-8", "surrogatepass"))
    assert _turn_fingerprint(conversation) == expected
