"""The file_read compressor: file views of every agent, kept with their line numbers."""

from __future__ import annotations

import re

import orjson

from compressors.outputs import Budget, ToolOutput
from compressors.registry import compress_output
from compressors.tools import file_read

GAP = re.compile(
    r"^\[… (\d+) lines? omitted(?: \(file lines? [\d-]+\))?(?:; they mention: .*)? …\]$"
)


def _python_source(classes: int = 6, methods: int = 5) -> list[str]:
    """A realistic module: docstring, imports, a constant, classes with decorated methods."""
    lines = ['"""Billing models for the payments service."""', "", "import json", "import time"]
    lines += ["from decimal import Decimal", "", "DEFAULT_CURRENCY = 'EUR'", ""]
    for c in range(classes):
        lines += ["", f"class Invoice{c}Model:", f'    """Invoice kind {c}."""', ""]
        for m in range(methods):
            lines += [
                "    @property" if m == 0 else "    # plain method",
                f"    def compute_total_{c}_{m}(self, amount_due: Decimal) -> Decimal:",
                f"        ledger_entry_{c}_{m} = self.ledger.lookup(amount_due)",
                "        if ledger_entry is None:",
                "            return Decimal(0)",
                "        total = amount_due * 2",
                "        total = total + 1",
                "        return total",
                "",
            ]
    lines += ["", "registry = {}", "", "def main() -> None:", "    print('done')"]
    return lines


def _cat_n(lines: list[str], start: int = 1) -> list[str]:
    return [f"{n:6d}\t{line}" for n, line in enumerate(lines, start)]


def _run(text: str, tool: str, arguments: dict[str, object] | None = None, level: int = 1):
    args = orjson.dumps(arguments).decode() if arguments is not None else ""
    output = ToolOutput(text, tool, args)
    divisor = 4 if level == 1 else 8
    return compress_output(output, Budget(max(1000, len(text) // divisor), level))


def _numbered_count(text: str, pattern: str) -> int:
    return sum(1 for line in text.split("\n") if re.match(pattern, line))


def _assert_names_visible(compressed: str, source: list[str]) -> None:
    """Every class and method the source declares is named in the compressed view: on a kept
    line, or in the names of the gap that stands for its line."""
    declared = re.findall(r"(?:class|def) (\w+)", "\n".join(source))
    assert declared
    assert [name for name in declared if name not in compressed] == []


def _check_gaps(original: list[str], compressed: str, numbered: str) -> None:
    """Kept file lines plus the gap counts account for every file line, in order."""
    kept = _numbered_count(compressed, numbered)
    gaps = sum(int(m.group(1)) for m in map(GAP.match, compressed.split("\n")) if m)
    assert kept + gaps == _numbered_count("\n".join(original), numbered)
    kept_lines = [line for line in compressed.split("\n") if re.match(numbered, line)]
    assert all(line in original for line in kept_lines)  # verbatim, number prefix included
    positions = [original.index(line) for line in kept_lines]
    assert positions == sorted(positions)


def test_opencode_read_keeps_wrapper_structure_and_line_numbers() -> None:
    source = _python_source()
    lines = ["<path>/repo/billing/models.py</path>", "<type>file</type>", "<content>"]
    lines += [f"{n}: {line}" for n, line in enumerate(source, 1)]
    lines += ["", f"(End of file - total {len(source)} lines)", "</content>"]
    text = "\n".join(lines)
    name, result = _run(text, "read", {"filePath": "/repo/billing/models.py"})
    assert name == "file_read"
    out = result.text
    assert len(out) < len(text)
    for wrapper in lines[:3] + lines[-2:]:
        assert wrapper in out.split("\n")
    _assert_names_visible(out, source)
    assert "DEFAULT_CURRENCY" in out
    assert f"{len(source)}:     print('done')" in out  # the tail
    _check_gaps(lines, out, r"\d+: ")
    total = len(source)
    shown = _numbered_count(out, r"\d+: ")
    assert result.omitted == (
        f"{total - shown} of {total} file lines omitted "
        "(start_line/end_line: the line numbers shown)"
    )


def test_swe_agent_open_keeps_header_counts_and_trailer() -> None:
    source = _python_source()
    window = source[40:140]
    lines = ["[File: /testbed/billing/models.py (400 lines total)]", "(40 more lines above)"]
    lines += [f"{n}:{line}" for n, line in enumerate(window, 41)]
    lines += ["(260 more lines below)", "", "(Open file: /testbed/billing/models.py)"]
    lines += ["(Current directory: /testbed)", "bash-$"]
    text = "\n".join(lines)
    name, result = _run(text, "open", {"path": "billing/models.py", "line_number": 90})
    assert name == "file_read"
    out = result.text.split("\n")
    assert out[:2] == lines[:2]
    assert out[-5:] == lines[-5:]
    _assert_names_visible(result.text, window)
    _check_gaps(lines, result.text, r"\d+:")


def test_swe_agent_goto_through_bash_is_routed_by_program() -> None:
    window = _python_source()[:120]
    lines = ["[File: /testbed/m.py (300 lines total)]"]
    lines += [f"{n}:{line}" for n, line in enumerate(window, 1)]
    lines += ["(180 more lines below)", "(Open file: /testbed/m.py)", "bash-$"]
    name, result = _run("\n".join(lines), "bash", {"command": "goto 60"})
    assert name == "file_read"
    assert "(180 more lines below)" in result.text


def test_str_replace_editor_view_of_a_file() -> None:
    source = _python_source()
    lines = ["OBSERVATION:", "Here's the result of running `cat -n` on /testbed/models.py:"]
    lines += _cat_n(source)
    text = "\n".join(lines)
    arguments = {"command": "view", "path": "/testbed/models.py"}
    name, result = _run(text, "str_replace_editor", arguments)
    assert name == "file_read"
    assert result.text.startswith("\n".join(lines[:2]))
    _assert_names_visible(result.text, source)
    _check_gaps(lines, result.text, r"\s*\d+\t")


def test_editor_directory_view_is_left_to_the_listing_compressor() -> None:
    paths = [f"/testbed/pkg{d}/module_{f}.py" for d in range(8) for f in range(12)]
    header = "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:"
    text = "\n".join([header, "/testbed", *paths])
    output = ToolOutput(text, "str_replace_editor", '{"command": "view", "path": "/testbed"}')
    assert file_read.compress(output, Budget(1000)) is None
    name, _ = compress_output(output, Budget(1000))
    assert name == "listing"


def test_claude_code_read_arrow_format() -> None:
    source = _python_source()
    lines = [f"{n:6d}→{line}" for n, line in enumerate(source, 1)]
    text = "\n".join(lines)
    name, result = _run(text, "Read", {"file_path": "/repo/models.py"})
    assert name == "file_read"
    _assert_names_visible(result.text, source)
    _check_gaps(lines, result.text, r"\s*\d+→")


def test_cat_n_through_a_shell_and_an_unknown_tool_by_shape() -> None:
    lines = _cat_n(_python_source())
    text = "\n".join(lines)
    name, _ = _run(text, "execute_bash", {"command": "cat -n billing/models.py"})
    assert name == "file_read"
    name, result = _run(text, "mystery_tool")
    assert name == "file_read"
    _check_gaps(lines, result.text, r"\s*\d+\t")


def test_plain_cat_of_a_source_file_keeps_structure_without_inventing_numbers() -> None:
    source = _python_source()
    text = "\n".join(source)
    name, result = _run(text, "bash", {"command": "cat billing/models.py"})
    assert name == "file_read"
    out = result.text.split("\n")
    _assert_names_visible(result.text, source)
    kept = [line for line in out if not GAP.match(line)]
    gaps = sum(int(m.group(1)) for m in map(GAP.match, out) if m)
    assert len(kept) + gaps == len(source)
    assert result.omitted == f"{gaps} of {len(source)} file lines omitted"
    # `cat` starts at line 1: each gap says which file lines it stands for
    position = 1
    for line in out:
        match = GAP.match(line)
        if match:
            count = int(match.group(1))
            where = f"file lines {position}-{position + count - 1}" if count > 1 else "file line"
            assert f"({where}" in line
            position += count
        else:
            position += 1


def test_level_two_is_smaller_and_keeps_declarations() -> None:
    text = "\n".join(_cat_n(_python_source(classes=12)))
    _, first = _run(text, "read")
    _, second = _run(text, "read", level=2)
    assert len(second.text) < len(first.text)
    assert "Invoice0Model" in second.text
    assert "Invoice11Model" in second.text


def test_budget_is_roughly_respected() -> None:
    text = "\n".join(_cat_n(_python_source(classes=20)))
    budget = Budget(len(text) // 4)
    result = file_read.compress(ToolOutput(text, "read"), budget)
    assert result is not None
    assert len(result.text) <= budget.max_chars * 1.1


def test_long_lines_are_cut_with_the_cut_shown() -> None:
    source = _python_source()
    where = source.index("class Invoice0Model:")
    source[where] = "class Invoice0Model:  # " + "x" * 50_000
    text = "\n".join(_cat_n(source))
    result = file_read.compress(ToolOutput(text, "read"), Budget(4000))
    assert result is not None
    assert len(result.text) < 6000
    assert "Invoice0Model" in result.text
    result = file_read.compress(ToolOutput(text, "read"), Budget(40_000))  # room for the line
    assert result is not None
    assert re.search(r"\tclass Invoice0Model:  # x+ \[… \d+ characters omitted …\]", result.text)


def test_not_a_file_view_returns_none() -> None:
    grep_n = "\n".join(f"{n * 7}:    value_{n} = compute({n})" for n in range(1, 200))
    prose = "\n".join("The quick brown fox jumps over the lazy dog." for _ in range(300))
    json_text = orjson.dumps({"items": list(range(2000))}, option=orjson.OPT_INDENT_2).decode()
    for text, tool, args in (
        (grep_n, "bash", ""),  # numbers with holes: grep -n, not a file
        (prose, "bash", '{"command": "python run.py"}'),  # no numbers, not a read
        (json_text, "bash", '{"command": "cat data.json"}'),  # json_crush's kind
    ):
        assert file_read.compress(ToolOutput(text, tool, args), Budget(1000)) is None


def test_short_views_are_untouched() -> None:
    text = "\n".join(_cat_n(_python_source()[:30]))
    assert file_read.compress(ToolOutput(text, "read"), Budget(max(1000, len(text) // 4))) is None


def test_deterministic() -> None:
    text = "\n".join(_cat_n(_python_source()))
    output = ToolOutput(text, "read")
    results = {file_read.compress(output, Budget(1500)) for _ in range(3)}
    assert len(results) == 1


def test_hostile_input_never_raises() -> None:
    cases = [
        "",
        "\x00" * 10_000,
        "\ud800 lone surrogate\n" * 2_000,
        "1: " + "y" * 2_000_000,
        "\n".join(f"{n}:\ud83d\x00 {'z' * 40}" for n in range(1, 3000)),
        "x" * 5_000_000,
    ]
    for text in cases:
        for tool in ("read", "bash", ""):
            output = ToolOutput(text, tool, '{"command": "cat f"}')
            result = file_read.compress(output, Budget(1000))
            assert result is None or len(result.text) < len(text)


def test_relative_modules_an_import_names_stay_visible() -> None:
    """`./checkpointBranch` is the path an agent opens next; it has no slash inside, and was
    not an identifier of its line (regression: only its bare name could be listed)."""
    source = [f"import {{ load{k}, Store{k} }} from './feature{k}';" for k in range(30)]
    source += ["import * as vscode from 'vscode';", "import { base } from '../../shared';", ""]
    for k in range(40):
        source += [
            f"export function activate{k}(context: vscode.ExtensionContext): void {{",
            f"  const store = new Store{k}(context.globalState, load{k}(context));",
            "  store.refresh();",
            "  context.subscriptions.push(store);",
            "}",
            "",
        ]
    lines = ["<path>/repo/src/extension.ts</path>", "<type>file</type>", "<content>"]
    lines += [f"{n}: {line}" for n, line in enumerate(source, 1)]
    lines += ["", f"(End of file - total {len(source)} lines)", "</content>"]
    text = "\n".join(lines)
    name, result = _run(text, "read", {"filePath": "/repo/src/extension.ts"})
    assert name == "file_read" and len(result.text) < len(text) // 2
    assert "'../../shared'" in result.text or "../../shared," in result.text
    hidden = [k for k in range(30) if f"./feature{k}" not in result.text]
    assert hidden == []
