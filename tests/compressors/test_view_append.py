"""Appending injected text through a view: after every existing byte, no new cache marks."""

from __future__ import annotations

import copy
import json

import orjson
import pytest

from compressors.view import Dialect
from compressors.wire import parse_conversation
from tests.conftest import CAPTURES

CAPTURE_FILES = {
    Dialect.OPENAI_CHAT: "opencode-1.18.33-openai-compatible-agent-with-tool-results.json",
    Dialect.ANTHROPIC: "opencode-1.18.33-anthropic-messages-agent-with-thinking.json",
    Dialect.OPENAI_RESPONSES: "opencode-1.18.33-openai-responses-agent-with-reasoning.json",
}


@pytest.mark.parametrize("dialect", list(CAPTURE_FILES))
def test_appends_keep_every_earlier_byte(dialect):
    body = json.loads((CAPTURES / CAPTURE_FILES[dialect]).read_text())["body"]
    before = copy.deepcopy(body)
    conversation = parse_conversation(dialect, body)
    index, text = conversation.user_messages()[-1]
    assert text and conversation.append_to_system("STABLE")
    assert conversation.append_to_message(index, "HITS")

    after = parse_conversation(dialect, body)
    assert after.system_text.endswith("STABLE")
    new_index, new_text = after.user_messages()[-1]
    assert new_index == index and new_text.startswith(text) and new_text.endswith("HITS")
    assert orjson.dumps(body).count(b"cache_control") == orjson.dumps(before).count(
        b"cache_control"
    )
    # Nothing but the two additions changed: removing them gives the original back.
    assert _without(body, ("STABLE", "HITS")) == _without(before, ())


def _without(value, texts):
    if isinstance(value, dict):
        if value.get("text") in texts:
            return None
        return {k: _without(v, texts) for k, v in value.items()}
    if isinstance(value, list):
        return [x for x in (_without(v, texts) for v in value) if x is not None]
    if isinstance(value, str):
        for text in texts:
            value = value.removesuffix("\n\n" + text)
        return value
    return value


def test_anthropic_without_a_system_prompt_gets_one():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    conversation = parse_conversation(Dialect.ANTHROPIC, body)
    assert conversation.append_to_system("STABLE") and body["system"] == "STABLE"


def test_chat_without_a_system_message_is_left_alone():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert not parse_conversation(Dialect.OPENAI_CHAT, body).append_to_system("STABLE")
    assert body == {"messages": [{"role": "user", "content": "hi"}]}


def test_responses_instructions_and_string_input():
    body = {"instructions": "Be brief.", "input": "hello"}
    conversation = parse_conversation(Dialect.OPENAI_RESPONSES, body)
    assert conversation.append_to_system("STABLE") and conversation.append_to_message(0, "HITS")
    assert body == {"instructions": "Be brief.\n\nSTABLE", "input": "hello\n\nHITS"}


def test_a_user_message_with_tool_results_does_not_start_a_turn():
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "r", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                    {"type": "text", "text": "a reminder"},
                ],
            },
        ]
    }
    assert parse_conversation(Dialect.ANTHROPIC, body).user_messages() == [(0, "fix it")]
