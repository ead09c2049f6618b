"""The prose compressor: subagent reports, fetched pages and docs keep their outline."""

from __future__ import annotations

import random
import re

import orjson
import pytest

from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import compress_output
from compressors.tools import prose
from tests.compressors.faithful import assert_faithful

FILLER = (
    "The module keeps a small in-memory cache in front of the database and refreshes it on "
    "a timer, which is the usual arrangement in this code base and works well in practice."
)


def _budget(text: str, level: int = 1) -> Budget:
    return Budget(max(1000, len(text) // (4 if level == 1 else 8)), level)


def _report() -> str:
    """A subagent's final report, as OpenCode's task tool or Claude Code's Task returns it."""
    sections = []
    for name in ("Storage", "Request handling", "Configuration", "Tests"):
        sections.append(f"### {name}\n\n{FILLER}\n{FILLER}\n\n{FILLER}\n")
    return "\n".join(
        [
            "I looked into why `test_session_resume` fails intermittently.",
            "",
            "## Summary",
            "",
            "The failure is a race between `SessionStore.flush()` and `SessionStore.load()`.",
            "",
            "## Files examined",
            "",
            "- `proxy/sessions.py` lines 40-212, the store",
            "- `proxy/app.py:88` calls `store.load(session_id)`",
            "- the README, for background",
            "- some older notes that turned out not to matter",
            "",
            "## Details",
            "",
            *sections,
            "### Reproduction",
            "",
            "```bash",
            "DEEP_MEMORY_FLUSH_MS=50 pytest tests/test_sessions.py::test_session_resume -x",
            "echo done",
            "echo really done",
            "```",
            "",
            "## Recommended fix",
            "",
            "1. In `SessionStore.load()`, return the pending snapshot when there is one.",
            "2. Make `close()` await the last flush.",
            "",
            "I did not change any files; the fix is about nine lines.",
        ]
    )


def _run(text: str, tool: str = "task") -> Compressed:
    result = prose.compress(ToolOutput(text, tool), _budget(text))
    assert result is not None
    return result


def test_report_keeps_outline_signals_code_and_conclusion() -> None:
    text = _report()
    result = _run(text)
    out = result.text
    assert len(out) < len(text) * 0.6
    for heading in ("## Summary", "## Files examined", "## Details", "## Recommended fix"):
        assert heading in out
    assert "`SessionStore.flush()` and `SessionStore.load()`" in out
    assert "- `proxy/app.py:88` calls `store.load(session_id)`" in out
    assert "```bash\nDEEP_MEMORY_FLUSH_MS=50 pytest tests/test_sessions.py" in out
    assert out.endswith("I did not change any files; the fix is about nine lines.")
    shown = len(assert_faithful(text, out))
    total = text.count("\n") + 1
    assert result.omitted == f"{total - shown} of {total} lines omitted"


def test_signal_list_items_outrank_plain_ones() -> None:
    signals = ("- `proxy/sessions.py` lines 40-212, the store", "- `proxy/app.py:88` calls")
    plain = "- some older notes that turned out not to matter"
    shown_plain = 0
    for max_chars in range(600, 2000, 50):
        result = prose.compress(ToolOutput(_report(), "task"), Budget(max_chars))
        assert result is not None
        if plain in result.text:
            shown_plain += 1
            assert all(signal in result.text for signal in signals), max_chars
    assert shown_plain > 0


def test_under_a_tight_budget_gaps_name_what_they_hide() -> None:
    text = _report()
    result = prose.compress(ToolOutput(text, "task"), Budget(600))
    assert result is not None
    gap = re.search(r"\[… \d+ lines omitted; they mention: ([^\n]*) …\]", result.text)
    assert gap is not None
    for name in ("proxy/sessions.py", "proxy/app.py:88"):
        assert name in result.text
    assert "in-memory" not in gap.group(1)  # a hyphenated English word is not a name
    assert_faithful(text, result.text)


def test_a_fence_is_kept_only_with_some_of_its_code() -> None:
    out = _run(_report()).text.split("\n")
    for index, line in enumerate(out):
        if line.startswith("```") and line != "```":  # an opening fence, with its language
            assert not out[index + 1].startswith(("```", "[…")), out[index : index + 2]


def _reference_page() -> str:
    """A fetched API reference: nested sections, each with prose and an example."""
    parts = ["# acme-client reference", "", "Intro paragraph about the client library.", ""]
    for group in range(6):
        parts += [f"## Group {group}", "", f"Overview of group {group}. " + FILLER, ""]
        for option in range(5):
            parts += [f"### OPT_G{group}_{option}", "", FILLER, FILLER, ""]
            parts += ["```python", f"client.call(opt=OPT_G{group}_{option})", "```", ""]
    parts += ["## License", "", "MIT."]
    return "\n".join(parts)


def test_kept_content_always_shows_its_headings() -> None:
    text = _reference_page()
    result = _run(text, "webfetch")
    lines = text.split("\n")
    shown = set(assert_faithful(text, result.text))
    for index in shown:
        if lines[index].startswith("#") or not lines[index].strip():
            continue
        parents = []  # the nearest heading of each level above this line
        for above in range(index - 1, -1, -1):
            level = len(lines[above]) - len(lines[above].lstrip("#"))
            if lines[above].startswith("#") and all(level < p for p in parents):
                parents.append(level)
                assert above in shown, (lines[index], lines[above])


def test_paragraphs_on_one_long_line_keep_their_first_and_signal_sentences() -> None:
    sentences = [f"Sentence {word} explains a general point about caching." for word in "abcdefgh"]
    sentences[6] = "Set `cache.ttl_seconds` to 0 to disable it."
    paragraph = " ".join(sentences)
    text = "\n\n".join(["# Caching guide", *[paragraph] * 8, "That is all there is to it."])
    result = _run(text, "webfetch")
    assert "Sentence a explains a general point about caching." in result.text
    assert "Set `cache.ttl_seconds` to 0 to disable it." in result.text
    gaps = [int(n) for n in re.findall(r"\[… (\d+) sentences? omitted …\]", result.text)]
    assert gaps and all(count in (5, 1) for count in gaps)  # sentences b-f, then h
    assert "sentences" in result.omitted
    assert_faithful(text, result.text)


def test_markdown_from_an_unknown_tool_is_recognised_by_its_shape() -> None:
    text = _report()
    routed = compress_output(ToolOutput(text, "mcp__context7__get-library-docs"), _budget(text))
    assert routed is not None and routed[0] == "prose"
    for tool in ("task", "Task", "agent", "WebFetch", "webfetch"):
        routed = compress_output(ToolOutput(text, tool), _budget(text))
        assert routed is not None and routed[0] == "prose", tool


PYTHON = "\n".join(
    f"def handler_{i}(request, *args):\n    value = request.args.get('k{i}')\n    return value"
    for i in range(80)
)
LOG = "\n".join(
    f"2024-06-12 08:31:{i % 60:02d} INFO worker-{i % 4} processed job {i} in {i % 9} ms"
    for i in range(300)
)
JSON = orjson.dumps([{"id": i, "name": f"item {i}", "tags": ["a"]} for i in range(80)]).decode()


@pytest.mark.parametrize("text", [PYTHON, LOG, JSON], ids=["code", "log", "json"])
def test_code_logs_and_json_are_not_prose(text: str) -> None:
    assert not prose.looks_like_prose(text)
    assert prose.compress(ToolOutput(text, "mcp__unknown__tool"), _budget(text)) is None


def test_a_prose_tool_returning_json_leaves_it_to_the_json_compressor() -> None:
    text = orjson.dumps({"results": orjson.loads(JSON)}, option=orjson.OPT_INDENT_2).decode()
    assert prose.compress(ToolOutput(text, "webfetch"), _budget(text)) is None
    routed = compress_output(ToolOutput(text, "webfetch"), _budget(text))
    assert routed is not None and routed[0] == "json"


def test_small_outputs_and_outputs_within_budget_are_left_alone() -> None:
    assert prose.compress(ToolOutput("## Done\n\nAll tests pass.", "task"), Budget(1000)) is None
    text = _report()
    assert prose.compress(ToolOutput(text, "task"), Budget(len(text))) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00" * 5000,
        "# \ud800 heading\n\n" + "word " * 3000,
        "```\n" * 3000,
        "#" * 20_000,
        "- " * 10_000,
        _report() + "\n## Trailing heading",
        "Title\n=====\n" + "Some words in a sentence here. " * 500 + "\nEnd\n---",
        bytes(random.Random(5).randrange(256) for _ in range(40_000)).decode("latin-1"),
    ],
)
def test_hostile_inputs_never_raise(text: str) -> None:
    result = prose.compress(ToolOutput(text, "task"), _budget(text))
    if result is not None:
        assert len(result.text) < len(text)


def test_deterministic_and_deeper_levels_are_smaller() -> None:
    text = _report() * 3
    first, again = _run(text), _run(text)
    deeper = prose.compress(ToolOutput(text, "task"), _budget(text, level=2))
    assert first == again
    assert deeper is not None and len(deeper.text) < len(first.text)
    assert "## Summary" in deeper.text
