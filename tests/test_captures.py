"""Every request the real OpenCode client sent reaches the upstream byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from compressors.view import Dialect, Kind, Role
from compressors.wire import chat_dialect, parse_conversation
from proxy.sessions import RequestKind, classify
from tests.conftest import CAPTURES

CAPTURE_FILES = sorted(p for p in CAPTURES.glob("*.json") if "-db-" not in p.name)  # requests only
EXPECTED_KIND = {
    "agent-tool1": RequestKind.AGENT,
    "agent-final": RequestKind.AGENT,
    "title": RequestKind.TITLE,
    "compaction": RequestKind.COMPACTION,
}
PREFIX_FOR = {
    Dialect.OPENAI_CHAT: "/v1",
    Dialect.ANTHROPIC: "/anthropic",
    Dialect.OPENAI_RESPONSES: "/openai",
}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_captures_are_present():
    assert len(CAPTURE_FILES) >= 5, f"expected OpenCode captures in {CAPTURES}"


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.name)
async def test_capture_arrives_byte_identical_through_the_relay(
    start_proxy, upstream, client, path
):
    proxy = await start_proxy(
        compress="false",
        upstream=[
            f"{upstream.url}/v1",
            f"anthropic={upstream.url}/v1",
            f"openai={upstream.url}/v1",
        ],
    )
    capture = _load(path)
    body = json.dumps(capture["body"], ensure_ascii=False, indent=1).encode()
    dialect = chat_dialect("POST", capture["path"])
    assert dialect is not None
    headers = {
        key: value
        for key, value in capture["headers"].items()
        if key.lower() not in {"host", "content-length", "connection"}
    }
    url = proxy.url + PREFIX_FOR[dialect] + capture["path"].removeprefix("/v1")
    async with client.post(url, data=body, headers=headers) as response:
        assert response.status == 200
        await response.read()
    [seen] = upstream.requests
    assert seen.body == body
    assert seen.path == capture["path"]
    for key, value in headers.items():
        assert seen.header(key) == value, key
    session_id = capture["headers"]["x-session-id"]
    session = proxy.state.sessions.get(session_id)
    assert session is not None
    assert dict(session.tally.kinds) == {EXPECTED_KIND[capture["kind"]].value: 1}


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.name)
def test_capture_view_and_classification(path):
    capture = _load(path)
    dialect = chat_dialect("POST", capture["path"])
    conversation = parse_conversation(dialect, orjson.loads(orjson.dumps(capture["body"])))
    assert classify(conversation) is EXPECTED_KIND[capture["kind"]]
    assert conversation.system_text, "every OpenCode request has a system prompt"
    assert conversation.last_user_message >= 0
    if capture["kind"].startswith("agent"):
        calls = {item.call_id for item in conversation.items if item.kind is Kind.TOOL_CALL}
        results = {item.call_id for item in conversation.items if item.kind is Kind.TOOL_RESULT}
        assert calls and calls == results
        for item in conversation.items:
            if item.kind is Kind.TOOL_RESULT:
                assert item.tool_name, "every result knows the tool that produced it"
        assert conversation.count(Kind.REASONING) > 0
    users = conversation.user_message_texts()
    assert users and all(isinstance(text, str) for text in users)
    assert all(
        item.role is not Role.TOOL or item.kind is Kind.TOOL_RESULT for item in conversation.items
    )
