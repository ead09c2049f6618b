"""Session identity and request classification, by structure."""

from __future__ import annotations

from compressors.view import Dialect
from compressors.wire import parse_conversation
from proxy.sessions import RequestKind, SessionRegistry, classify, session_id_for


def chat(messages, **extra):
    return parse_conversation(Dialect.OPENAI_CHAT, {"model": "m", "messages": messages, **extra})


def test_session_header_wins():
    conversation = chat([{"role": "user", "content": "hi"}])
    assert session_id_for({"x-session-id": "ses_1"}, conversation) == "ses_1"


def test_fingerprint_is_stable_and_depends_on_the_start():
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task A"}]
    later = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    other = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task B"}]
    a = session_id_for({}, chat(first))
    assert a.startswith("fp_")
    assert session_id_for({}, chat(later)) == a
    assert session_id_for({}, chat(other)) != a


def test_fingerprint_same_across_dialects_for_same_start():
    anthropic = parse_conversation(
        Dialect.ANTHROPIC,
        {
            "system": "sys",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}],
        },
    )
    openai = chat([{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}])
    assert session_id_for({}, anthropic) == session_id_for({}, openai)


def test_compaction_detected_by_structure_not_wording():
    transcript = "Summarise please.\n<conversation>\n[User]: hi\n</conversation>\nTemplate..."
    conversation = chat(
        [
            {"role": "system", "content": "Some future wording about condensing history."},
            {"role": "user", "content": transcript},
        ]
    )
    assert classify(conversation) is RequestKind.COMPACTION


def test_compaction_in_anthropic_and_responses():
    text = "Here is the conversation so far:\n<conversation>\nx\n</conversation>"
    anthropic = parse_conversation(
        Dialect.ANTHROPIC,
        {
            "system": [{"type": "text", "text": "summarizer"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        },
    )
    responses = parse_conversation(
        Dialect.OPENAI_RESPONSES,
        {
            "input": [
                {"role": "developer", "content": "summarizer"},
                {"role": "user", "content": [{"type": "input_text", "text": text}]},
            ]
        },
    )
    assert classify(anthropic) is RequestKind.COMPACTION
    assert classify(responses) is RequestKind.COMPACTION


def test_tools_make_an_agent_step_and_title_needs_no_assistant_turns():
    tools = [{"type": "function", "function": {"name": "read"}}]
    assert (
        classify(chat([{"role": "user", "content": "<conversation></conversation>"}], tools=tools))
        is RequestKind.AGENT
    )
    title = chat(
        [
            {"role": "system", "content": "You write a Title."},
            {"role": "user", "content": "fix the bug"},
        ]
    )
    assert classify(title) is RequestKind.TITLE
    talk = chat(
        [
            {"role": "system", "content": "title"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert classify(talk) is RequestKind.OTHER


def test_registry_evicts_least_recently_seen():
    registry = SessionRegistry(capacity=2)
    registry.touch("a", "default")
    registry.touch("b", "default")
    registry.touch("a", "default")
    registry.touch("c", "default")
    assert registry.get("b") is None
    assert registry.get("a") is not None and registry.get("c") is not None
    assert len(registry) == 2
