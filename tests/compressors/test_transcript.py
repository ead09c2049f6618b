"""Compressing the tool results inside a compaction transcript."""

from __future__ import annotations

import json

from compressors.markers import marker_keys
from compressors.pipeline import CompressionSettings
from compressors.transcript import compress_transcript
from tests.conftest import CAPTURES

SETTINGS = CompressionSettings()


def transcript(result: str, tool: str = "bash", args: str = '{"command":"pytest -q"}') -> str:
    return (
        "Here is the conversation so far:\n\n<conversation>\n"
        "[User]: make the tests pass\n\n\n"
        f"[Assistant tool call]: {tool}({args})\n"
        f"[Tool result]: {result}\n\n"
        "[Assistant]: The failure is in parser.py.\n"
        "</conversation>\n\nCreate a new anchored summary."
    )


def test_a_long_log_keeps_its_errors_and_the_original():
    lines = [f"tests/test_mod{n}.py::test_case PASSED" for n in range(600)]
    lines[420] = "tests/test_parser.py::test_dates FAILED"
    lines.append("E   ValueError: invalid date '2026-13-01' in parser.py:88")
    lines.append("==== 1 failed, 599 passed in 12.3s ====")
    log = "\n".join(lines)
    text = transcript(log)
    result = compress_transcript(text, SETTINGS)
    assert result.compressed == 1 and result.tokens_after < result.tokens_before / 4
    assert "ValueError: invalid date '2026-13-01' in parser.py:88" in result.text
    assert "1 failed, 599 passed" in result.text
    [key] = marker_keys(result.text)
    assert result.originals[key] == log
    before, after = text.split(log)
    assert result.text.startswith(before.split("[Tool result]: ")[0])
    assert result.text.endswith(after)  # everything after the result is untouched


def test_small_results_protected_tools_and_text_outside_are_left_alone():
    small = transcript("README.md\nhello.py")
    assert compress_transcript(small, SETTINGS).text == small
    edit = transcript("x\n" * 3000, tool="edit", args='{"filePath":"/a.py"}')
    assert compress_transcript(edit, SETTINGS).text == edit
    no_block = "[Tool result]: " + "line\n" * 3000
    assert compress_transcript(no_block, SETTINGS).text == no_block


def test_the_opencode_capture_is_unchanged_because_it_is_small():
    capture = json.loads(
        (CAPTURES / "opencode-1.18.33-openai-compatible-compaction.json").read_text()
    )
    text = capture["body"]["messages"][1]["content"]
    assert compress_transcript(text, SETTINGS).text == text


def test_a_transcript_output_is_cut_only_when_it_pays_off_as_tool_outputs_are() -> None:
    from compressors.pipeline import CompressionSettings

    settings = CompressionSettings()
    assert settings.pays_off(1000, 700)  # 300 tokens and 30 %
    assert not settings.pays_off(1000, 910)  # 90 tokens: under the floor
    assert not settings.pays_off(4000, 3200)  # 800 tokens but 20 %: under the share


def test_a_result_belongs_to_its_own_call_whatever_the_tool_is_named() -> None:
    """A call named outside ``[\\w.-]`` (``fs:read``) used to leave the previous call in
    charge, so this log was taken for the protected ``edit`` call's result and kept whole."""
    log = "\n".join(f"tests/test_mod{n}.py::test_case PASSED" for n in range(600))
    text = (
        "<conversation>\n"
        '[Assistant tool call]: edit({"filePath":"/a.py"})\n'
        "[Tool result]: Edit applied successfully.\n"
        '[Assistant tool call]: fs:run_tests({"path":"tests"})\n'
        f"[Tool result]: {log}\n"
        "</conversation>"
    )
    result = compress_transcript(text, SETTINGS)
    assert result.compressed == 1
    [key] = marker_keys(result.text)
    assert result.originals[key] == log
