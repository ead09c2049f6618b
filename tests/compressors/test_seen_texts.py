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


def test_a_derived_fact_is_computed_once_per_text_object_and_tag() -> None:
    seen = SeenTexts()
    calls: list[str] = []

    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    text = "".join(["<think>", "x" * 50])  # built at run time: not an interned constant
    twin = "".join(["<think>", "x" * 50])
    assert seen.derive(text, "upper", upper) == text.upper()
    seen.next_request()
    assert seen.derive(text, "upper", upper) == text.upper()
    assert seen.derive(twin, "upper", upper) == text.upper()  # equal, but another object
    assert seen.derive(text, "other", upper) == text.upper()  # another fact of the same text
    assert len(calls) == 3
