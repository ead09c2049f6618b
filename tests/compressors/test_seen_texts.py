"""What compress derives from a text is remembered by the text's identity, and only while
requests still carry the text."""

from __future__ import annotations

from compressors.outputs import ToolOutput
from compressors.pipeline import SeenTexts, fingerprint
from compressors.tokens import estimate_tokens


def test_a_text_is_fingerprinted_with_its_tool_and_arguments_every_time() -> None:
    seen = SeenTexts()
    text = "line\n" * 200
    read = ToolOutput(text, "read", '{"path":"a"}', frozenset())
    other = ToolOutput(text, "read", '{"path":"b"}', frozenset())
    assert seen.fingerprint(read) == (fingerprint(read), estimate_tokens(text))
    assert seen.fingerprint(other) == (fingerprint(other), estimate_tokens(text))
    assert seen.fingerprint(read)[0] != seen.fingerprint(other)[0]
    assert seen.tokens(text) == estimate_tokens(text)


def test_only_what_the_last_request_used_is_kept() -> None:
    seen = SeenTexts()
    kept, dropped = "a" * 1000, "b" * 1000
    seen.tokens(kept), seen.tokens(dropped)
    seen.next_request()
    seen.tokens(kept)
    seen.next_request()
    assert [entry[0] for entry in seen._previous.values()] == [kept]
