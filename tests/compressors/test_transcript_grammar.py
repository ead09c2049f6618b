"""The compaction transcript's grammar: the conversation span, labelled blocks, tool calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compressors.transcript_grammar import Label, blocks, conversation_span, tool_call

BODY = (
    "\n[User]: make the tests pass\n\n\n"
    "[Assistant reasoning]: Run them first.\n"
    '[Assistant tool call]: bash({"command":"pytest -q"})\n'
    "[Tool result]: 1 failed\n[User]: not a block: mid-line labels do not count\n\n"
    "[Assistant]: The failure is in parser.py.\n"
)


def test_blocks_are_labelled_and_keep_every_byte() -> None:
    found = blocks(BODY)
    assert [block.label for block in found] == [
        Label.USER,
        Label.REASONING,
        Label.TOOL_CALL,
        Label.TOOL_RESULT,
        Label.USER,
        Label.ASSISTANT,
    ]
    assert found[3].text == "1 failed\n"
    assert BODY[: found[0].start] + "".join(BODY[b.start : b.end] for b in found) == BODY
    assert all(BODY[b.start : b.end] == b.label.head + b.text for b in found)


def test_a_label_must_start_a_line_and_be_followed_by_a_space() -> None:
    assert blocks("x [User]: hi") == []
    assert blocks("[User]:hi\n[Tool]: x\n[user]: y") == []
    assert [b.label for b in blocks("[Tool error]: boom")] == [Label.TOOL_ERROR]


def test_the_conversation_span_needs_both_tags_in_order() -> None:
    text = "before <conversation>\n[User]: a\n</conversation> after </conversation>"
    start, end = conversation_span(text) or (0, 0)
    assert text[start:end] == "\n[User]: a\n</conversation> after "
    assert conversation_span("<conversation> never closed") is None
    assert conversation_span("</conversation> <conversation>") is None
    assert conversation_span("no tags") is None


def test_a_tool_call_is_a_name_then_arguments_in_parentheses() -> None:
    assert tool_call('bash({"command":"ls (x)"})\n') == ("bash", '{"command":"ls (x)"}')
    assert tool_call("context7_resolve-library-id({})") == ("context7_resolve-library-id", "{}")
    assert tool_call("fs:read/file({})") == ("fs:read/file", "{}")
    assert tool_call('multi({"a":\n"b"})') == ("multi", '{"a":\n"b"}')
    assert tool_call("  no arguments at all \n") == ("no arguments at all", "")


@given(st.lists(st.tuples(st.sampled_from(list(Label)), st.text("ab \n)(]:["))))
def test_any_run_of_blocks_reads_back(parts: list[tuple[Label, str]]) -> None:
    texts = [text.replace("\n[", "\n (") for _, text in parts]  # no accidental block starts
    body = "".join(label.head + text + "\n" for (label, _), text in zip(parts, texts, strict=True))
    found = blocks(body)
    assert [b.label for b in found] == [label for label, _ in parts]
    assert [b.text for b in found] == [text + "\n" for text in texts]
