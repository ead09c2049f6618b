"""The search compressor: grep/ripgrep output and the search tools of each agent."""

from __future__ import annotations

import re
import time

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import compress_output
from compressors.tools import search

GAP = re.compile(r"^\[… (\d+) (match|matches|line|lines|file|files)\b.* omitted …\]$")
SOURCE = "    result = handle_request(ctx, payload)"


def _run(text: str, tool: str, arguments: dict[str, object], level: int = 1) -> Compressed:
    """Through the registry, as the pipeline calls it; the search compressor must answer."""
    budget = Budget(max(1000, len(text) // (4 if level == 1 else 8)), level)
    routed = compress_output(ToolOutput(text, tool, orjson.dumps(arguments).decode()), budget)
    assert routed is not None and routed[0] == "search"
    return routed[1]


def _compress(text: str, tool: str, arguments: dict[str, object] | None = None):
    args = orjson.dumps(arguments).decode() if arguments is not None else ""
    return search.compress(ToolOutput(text, tool, args), Budget(max(1000, len(text) // 4)))


def _grep_rn(counts: dict[str, int]) -> list[str]:
    return [f"{path}:{10 + 7 * j}:{SOURCE}{j}" for path, n in counts.items() for j in range(n)]


def _gap_total(text: str) -> int:
    return sum(int(m.group(1)) for m in map(GAP.match, text.split("\n")) if m)


def _check_lines(original: list[str], result: Compressed) -> list[str]:
    """Kept lines are verbatim, in order; kept plus gap counts give every counted line."""
    kept = [line for line in result.text.split("\n") if not GAP.match(line)]
    at = 0
    for line in kept:
        at = original.index(line, at) + 1
    assert len(result.text) < len("\n".join(original))
    return kept


def test_grep_rn_keeps_each_files_first_match_and_counts_the_rest() -> None:
    counts = {f"src/app/module_{i}.py": 1 + (i * 7) % 12 for i in range(30)}
    lines = _grep_rn(counts)
    text = "\n".join(lines) + "\n"
    for tool, arguments in (
        ("bash", {"command": "grep -rn handle_request src"}),  # OpenCode, SWE-agent
        ("execute_bash", {"command": "cd /workspace && grep -rn handle_request src"}),
        ("Bash", {"command": "rg -n handle_request src | head -500"}),  # Claude Code
        ("Grep", {"pattern": "handle_request", "output_mode": "content", "-n": True}),
    ):
        result = _run(text, tool, arguments)
        kept = _check_lines(lines, result)
        assert len(kept) + _gap_total(result.text) == len(lines)
        for path in counts:  # the budget allows every file's first match
            assert f"{path}:10:{SOURCE}0" in kept
        assert result.omitted == f"{len(lines) - len(kept)} of {len(lines)} matches omitted"
        assert len(result.text) <= len(text) // 4 + 100


def test_gap_lines_name_the_files_they_span() -> None:
    counts = {f"src/app/module_{i}.py": 40 for i in range(30)}
    lines = _grep_rn(counts)
    result = _run("\n".join(lines), "grep", {"pattern": "handle_request"}, level=2)
    assert any(re.match(r"^\[… \d+ matches omitted …\]$", line) for line in result.text.split("\n"))
    assert len(_check_lines(lines, result)) + _gap_total(result.text) == len(lines)
    assert "files not shown" in result.omitted or _gap_total(result.text) > 0


def test_source_files_and_files_with_more_matches_come_first() -> None:
    counts = {"docs/guide.md": 1, "node_modules/lib/index.js": 1}
    counts |= {f"src/pkg/mod_{i}.py": 1 for i in range(150)}
    counts["src/pkg/hot_path.py"] = 30
    lines = _grep_rn(counts)
    result = _compress("\n".join(lines), "grep", {"pattern": "handle_request"})
    assert result is not None
    assert "docs/guide.md:10:" not in result.text
    assert "node_modules/lib/index.js:10:" not in result.text
    assert "src/pkg/hot_path.py:10:" in result.text
    assert "files not shown" in result.omitted


def test_many_matches_in_one_file_keep_the_first_few_then_identifier_rich_ones() -> None:
    lines = [f"{n}:        x = {n}" for n in range(100, 160)]
    lines[40] = "140:        info.slots = generated_slots  # self._api.named_type(slots_type)"
    text = "grep -n 'slots' /repo/mypy/plugins/dataclasses.py\n" + "\n".join(lines)
    result = _run(text, "execute_bash", {"command": "grep -n x /repo/mypy/plugins/dataclasses.py"})
    kept = result.text.split("\n")
    assert kept[0] == "grep -n 'slots' /repo/mypy/plugins/dataclasses.py"
    assert kept[1:4] == lines[:3]
    assert lines[40] in kept


def test_grep_context_output_keeps_hunks_and_separators_between_shown_lines() -> None:
    lines: list[str] = []
    for f in range(20):
        for j in range(3):
            base, path = 20 + 40 * j, f"src/app/module_{f}.py"
            lines += [f"{path}-{base - 1}-    ctx = make_ctx()", f"{path}:{base}:{SOURCE}",
                      f"{path}-{base + 1}-    return result", "--"]  # fmt: skip
    lines.pop()
    text = "\n".join(lines)
    result = _run(text, "bash", {"command": "grep -rn -C1 handle_request src"})
    _check_context_result(lines, result)
    assert "src/app/module_19.py:20:" + SOURCE in result.text  # every file's first match
    roomy = search.compress(ToolOutput(text, "rg", ""), Budget(len(text) * 2 // 3))
    assert roomy is not None and "\n--\n" in roomy.text
    _check_context_result(lines, roomy)


def _check_context_result(lines: list[str], result: Compressed) -> None:
    kept = _check_lines(lines, result)
    shown_lines = result.text.split("\n")
    for at, line in enumerate(shown_lines):
        if line == "--":  # a separator is never first, last, or next to a gap
            assert 0 < at < len(shown_lines) - 1
            assert not GAP.match(shown_lines[at - 1]) and not GAP.match(shown_lines[at + 1])
    counted = [line for line in lines if line != "--"]
    shown = [line for line in kept if line != "--"]
    assert len(shown) + _gap_total(result.text) == len(counted)
    assert result.omitted.startswith(f"{len(counted) - len(shown)} of {len(counted)} lines omitted")


def test_opencode_grep_keeps_group_headers_with_their_lines() -> None:
    lines = ["Found 100 matches"]
    for f in range(20):
        lines.append(f"/home/dev/proj/src/app/module_{f}.py:")
        lines += [f"  Line {10 + 9 * j}: from app.core import handle_request as hr{f}_{j}"
                  for j in range(5)]  # fmt: skip
        lines.append("")
    lines.append("(Results are truncated. Consider using a more specific path or pattern.)")
    result = _run("\n".join(lines), "grep", {"pattern": "handle_request", "path": "src"})
    kept = _check_lines(lines, result)
    assert kept[0] == "Found 100 matches"
    assert kept[-1].startswith("(Results are truncated.")
    for at, line in enumerate(kept):
        if line.startswith("  Line "):  # under its file's header
            header = next(k for k in reversed(kept[:at]) if k.startswith("/home/dev/"))
            assert lines.index(header) < lines.index(line)
        if line.startswith("/home/dev/"):  # no header without a line under it
            assert kept[at + 1].startswith("  Line ")


def test_swe_agent_search_file_keeps_header_footer_and_trailers() -> None:
    lines = ['Found 60 matches for "self" in /repo/src/app/module_1.py:']
    lines += [
        f"Line {j * 4 + 3}:        self.value_{j} = compute_{j}(self.base)" for j in range(60)
    ]
    lines += [
        'End of matches for "self" in /repo/src/app/module_1.py',
        "(Open file: /repo/src/app/module_1.py)",
        "(Current directory: /repo)",
        "bash-$",
    ]
    text = "\n".join(lines)
    for tool, arguments in (
        ("search_file", {"search_term": "self"}),
        ("bash", {"command": 'search_file "self"'}),
    ):
        result = _run(text, tool, arguments)
        kept = _check_lines(lines, result)
        assert kept[0] == lines[0] and kept[-4:] == lines[-4:]
        assert "Line 3:        self.value_0 = compute_0(self.base)" in kept
        assert len(kept) - 5 + _gap_total(result.text) == 60


def test_swe_agent_search_dir_counts_files_and_their_matches() -> None:
    lines = ['Found 2000 matches for "handle_request" in /repo:']
    lines += [f"/repo/src/app/module_{i}.py ({i % 9 + 1} matches)" for i in range(200)]
    lines.append('End of matches for "handle_request" in /repo')
    result = _run("\n".join(lines), "search_dir", {"search_term": "handle_request"})
    kept = _check_lines(lines, result)
    gaps = [GAP.match(line) for line in result.text.split("\n") if GAP.match(line)]
    assert gaps and all(m.group(2).startswith("file") for m in gaps)
    assert re.search(r"\[… \d+ files \(\d+ matches\) omitted …\]", result.text)
    dropped = 200 - (len(kept) - 2)
    assert result.omitted == f"{dropped} of 200 files omitted"
    dropped_matches = sum(int(m) for m in re.findall(r"files? \((\d+) match", result.text))
    shown_matches = sum(int(m) for m in re.findall(r"\.py \((\d+) match", result.text))
    assert dropped_matches + shown_matches == sum(i % 9 + 1 for i in range(200))


def test_ripgrep_heading_output() -> None:
    lines: list[str] = []
    for f in range(15):
        lines.append(f"src/app/module_{f}.py")
        lines += [f"{10 + j}:    handle_request(x{j})" for j in range(8)]
        lines.append("")
    result = _run("\n".join(lines), "bash", {"command": "rg --heading -n handle_request"})
    kept = _check_lines(lines, result)
    headers = [at for at, line in enumerate(kept) if line.startswith("src/app/module_")]
    assert len(headers) >= 8
    assert all(kept[at + 1] == "10:    handle_request(x0)" for at in headers)


def test_long_match_line_is_clipped_around_the_pattern() -> None:
    minified = "var a=1;" * 2000 + "handle_request(ctx);" + "var b=2;" * 2000
    lines = [f"dist/bundle_{i}.min.js:1:{minified}" for i in range(12)]
    result = _compress("\n".join(lines), "Grep", {"pattern": "handle_request"})
    assert result is not None
    assert "handle_request(ctx);" in result.text
    assert "characters omitted …]" in result.text
    assert all(len(line) < 500 for line in result.text.split("\n"))


def test_short_results_and_other_shapes_pass() -> None:
    few = "\n".join(_grep_rn({"src/a.py": 3, "src/b.py": 2})) + "\n"
    assert _compress(few * 1, "grep", {"pattern": "x"}) is None
    prose = "\n".join(f"Note {i}: see the handler for details." for i in range(300))
    assert _compress(prose, "webfetch") is None
    # Numbered lines without a search call are a file view, not grep -n output.
    view = "\n".join(f"{n}:    value_{n} = compute(arguments)" for n in range(1, 400))
    assert _compress(view, "bash", {"command": "open treon.py"}) is None
    # A path list (grep -l, Claude Code files_with_matches) is a listing.
    paths = "Found 300 files\n" + "\n".join(f"src/app/module_{i}.py" for i in range(300))
    assert _compress(paths, "Grep", {"pattern": "x"}) is None
    log = "\n".join(f"2024-05-01 10:00:{i % 60:02d} INFO request {i} served" for i in range(300))
    assert _compress(log, "bash", {"command": "tail -300 server.log"}) is None


def test_grep_shape_is_recognised_without_a_search_call() -> None:
    lines = _grep_rn({f"pkg/mod_{i}.go": 6 for i in range(40)})
    result = _compress("\n".join(lines), "some_mcp_tool")
    assert result is not None and "pkg/mod_39.go:10:" in result.text


def test_hostile_input_never_raises() -> None:
    weird = "\n".join(f"src/a_{i}.py:{i}:\ud800 \x00 handle_request" for i in range(400))
    for text in (weird, "x" * 2_000_000, "\n" * 5000, "a:1:" * 50_000, ":::\n" * 3000):
        result = _compress(text, "grep", {"pattern": "handle_request"})
        assert result is None or len(result.text) < len(text)


def test_100kb_result_is_compressed_quickly() -> None:
    lines = _grep_rn({f"src/pkg_{i % 9}/module_{i}.py": 12 for i in range(60)})
    lines = (lines * 3)[:1600]
    text = "\n".join(lines)
    assert len(text) > 100_000
    output = ToolOutput(text, "grep", '{"pattern": "handle_request"}')
    search.compress(output, Budget(len(text) // 4))
    started = time.perf_counter()
    for _ in range(5):
        search.compress(output, Budget(len(text) // 4))
    assert (time.perf_counter() - started) / 5 < 0.05


def test_deterministic() -> None:
    lines = _grep_rn({f"src/app/module_{i}.py": 1 + i % 7 for i in range(50)})
    first = _compress("\n".join(lines), "grep", {"pattern": "handle_request"})
    assert first is not None
    assert all(
        _compress("\n".join(lines), "grep", {"pattern": "handle_request"}) == first
        for _ in range(3)
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "",
                "--",
                "src/a.py:12:    x = handle(1)",
                "src/a.py-13-    y = 2",
                "b/c.ts:9:const z",
                "lib/x-1-y.py-4-ctx",
                "12:    match",
                "13-    context",
                "Found 9 matches",
                "/repo/src/a.py:",
                "  Line 4: text",
                "Line 7:text",
                "/repo/x.py (3 matches)",
                'Found 40 matches for "x" in /repo:',
                "\ud800:1:\x00",
                "C:\\w\\a.py:3:win",
                "y" * 900,
                "(Open file: /repo/a.py)",
                "bash-$",
                "src/a.py:7:" + "z" * 600,
            ]
        ),
        min_size=1,
        max_size=300,
    ),
    st.sampled_from(["grep", "Grep", "bash", "search_dir", "search_file", "other"]),
    st.integers(min_value=200, max_value=3000),
)
def test_any_mix_of_search_lines_is_handled(lines: list[str], tool: str, max_chars: int) -> None:
    text = "\n".join(lines)
    args = '{"command": "grep -rn x ."}' if tool == "bash" else '{"pattern": "handle"}'
    result = search.compress(ToolOutput(text, tool, args), Budget(max_chars))
    if result is not None:
        assert len(result.text) < len(text)
        assert re.match(r"\d+ of \d+ (matches|lines|files) omitted", result.omitted)
