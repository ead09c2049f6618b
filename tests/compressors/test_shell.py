"""The shell compressor: test-runner, compiler, install and other command output."""

from __future__ import annotations

import re
import time

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import compress_output
from compressors.tools import search, shell

GAP = re.compile(r"^\[… (\d+) (?:identical )?lines? omitted …\]$")


def _run(text: str, tool: str = "bash", command: str = "make test", level: int = 1) -> Compressed:
    """Through the registry, as the pipeline calls it; the shell compressor must answer."""
    args = orjson.dumps({"command": command}).decode() if command else ""
    budget = Budget(max(1000, len(text) // (4 if level == 1 else 8)), level)
    routed = compress_output(ToolOutput(text, tool, args), budget)
    assert routed is not None and routed[0] == "shell"
    return routed[1]


def _compress(text: str, tool: str = "bash", command: str = "make test") -> Compressed | None:
    args = orjson.dumps({"command": command}).decode()
    return shell.compress(ToolOutput(text, tool, args), Budget(max(1000, len(text) // 4)))


def _check_accounting(original: str, result: Compressed) -> None:
    """Kept lines are verbatim and in order; they plus the gap counts make up every line;
    the omitted phrase states the same count."""
    lines = original.rstrip("\n").split("\n")
    kept, gaps = [], 0
    for line in result.text.split("\n"):
        gap = GAP.match(line)
        if gap:
            gaps += int(gap.group(1))
        else:
            kept.append(line)
    at = 0
    for line in kept:  # verbatim and in order: each found after the one before
        at = lines.index(line, at) + 1
    assert len(kept) + gaps == len(lines)
    assert result.omitted.startswith(f"{gaps} of {len(lines)} lines omitted")
    assert len(result.text) < len(original)


def _pytest_log(passed: int = 120) -> str:
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.9, pytest-8.3.4, pluggy-1.5.0 -- /opt/venv/bin/python",
        "rootdir: /testbed",
        f"collecting ... collected {passed + 1} items",
        "",
    ]
    lines += [f"tests/test_api.py::test_endpoint_{i} PASSED{' ' * 10}[{i * 100 // passed:3d}%]"
              for i in range(passed // 2)]  # fmt: skip
    lines.append("tests/test_api.py::test_list_named_queries FAILED                [ 50%]")
    lines += [f"tests/test_models.py::test_model_{i} PASSED{' ' * 10}[{50 + i * 50 // passed:3d}%]"
              for i in range(passed // 2)]  # fmt: skip
    lines += [
        "",
        "=================================== FAILURES ===================================",
        "___________________________ test_list_named_queries ____________________________",
        "",
        "    def test_list_named_queries():",
        '        client = boto3.client("athena", region_name="us-east-1")',
        '>       result = client.list_named_queries(WorkGroup="athena_workgroup")',
        "",
        "tests/test_api.py:518: ",
        "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ ",
        "/opt/venv/lib/python3.12/site-packages/botocore/client.py:569: in _api_call",
        "    return self._make_api_call(operation_name, kwargs)",
        "/opt/venv/lib/python3.12/site-packages/botocore/client.py:1005: in _make_api_call",
        "    http, parsed_response = self._make_request(",
        "moto/core/responses.py:596: in call_action",
        "    response = method()",
        "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ ",
        "",
        "self = <moto.athena.models.AthenaBackend object at 0x716794a21520>",
        "",
        "    def list_named_queries(self, workgroup):",
        ">       return [q.id for q in self.queries if q.workgroup.name == workgroup]",
        "E       AttributeError: 'str' object has no attribute 'name'",
        "",
        "moto/athena/models.py:399: AttributeError",
        "=========================== short test summary info ============================",
        "FAILED tests/test_api.py::test_list_named_queries - AttributeError: 'str' object has "
        "no attribute 'name'",
        f"========================= 1 failed, {passed} passed in 0.49s =========================",
    ]
    return "\n".join(lines) + "\n"


# --- test runners --------------------------------------------------------------------------


def test_pytest_keeps_failures_and_summary_and_drops_passed_lines() -> None:
    text = _pytest_log()
    for tool in ("bash", "Bash", "execute_bash"):  # OpenCode, Claude Code, OpenHands
        result = _run(text, tool, "python -m pytest -v tests")
        _check_accounting(text, result)
    kept = result.text
    for needed in (
        "=================================== FAILURES ===================================",
        "___________________________ test_list_named_queries ____________________________",
        "E       AttributeError: 'str' object has no attribute 'name'",
        "moto/athena/models.py:399: AttributeError",
        "tests/test_api.py:518: ",
        ">       return [q.id for q in self.queries if q.workgroup.name == workgroup]",
        "short test summary info",
        "FAILED tests/test_api.py::test_list_named_queries - AttributeError",
        "1 failed, 120 passed in 0.49s",
        "tests/test_api.py::test_list_named_queries FAILED",
    ):
        assert needed in kept, needed
    assert kept.count(" PASSED") <= 2
    assert len(kept) <= len(text) // 4 + 100


def test_pytest_prefers_project_frames_to_library_frames() -> None:
    result = shell.compress(ToolOutput(_pytest_log(), "bash", ""), Budget(1000))
    assert result is not None
    assert "moto/core/responses.py:596: in call_action" in result.text
    # Library frames between the test's frame and the raising frame go first.
    assert "site-packages/botocore/client.py" not in result.text


def test_unittest_keeps_fail_header_traceback_and_result() -> None:
    lines = [f"test_case_{i} (tests.test_math.TestMath.test_case_{i}) ... ok" for i in range(80)]
    lines.insert(40, "test_divide (tests.test_math.TestMath.test_divide) ... FAIL")
    lines += [
        "",
        "======================================================================",
        "FAIL: test_divide (tests.test_math.TestMath.test_divide)",
        "----------------------------------------------------------------------",
        "Traceback (most recent call last):",
        '  File "/home/dev/proj/tests/test_math.py", line 42, in test_divide',
        "    self.assertEqual(divide(7, 2), 3)",
        "AssertionError: 3.5 != 3",
        "",
        "----------------------------------------------------------------------",
        "Ran 81 tests in 0.031s",
        "",
        "FAILED (failures=1)",
    ]
    text = "\n".join(lines)
    result = _run(text, "bash", "python -m unittest")
    _check_accounting(text, result)
    for needed in (
        "FAIL: test_divide (tests.test_math.TestMath.test_divide)",
        'File "/home/dev/proj/tests/test_math.py", line 42, in test_divide',
        "AssertionError: 3.5 != 3",
        "Ran 81 tests in 0.031s",
        "FAILED (failures=1)",
    ):
        assert needed in result.text
    assert "test_case_10 " not in result.text


def test_go_test_keeps_failures_and_package_results() -> None:
    lines = [f"ok  \tgithub.com/acme/widget/pkg/mod{p:02d}\t0.{p:02d}3s" for p in range(60)]
    lines[30:30] = [
        "=== RUN   TestParseConfig",
        "=== RUN   TestParseConfig/invalid_yaml",
        '    config_test.go:48: ParseConfig("invalid_yaml") error = <nil>, wantErr true',
        "--- FAIL: TestParseConfig (0.00s)",
        "    --- FAIL: TestParseConfig/invalid_yaml (0.00s)",
        "FAIL",
        "FAIL\tgithub.com/acme/widget/internal/config\t0.012s",
    ]
    lines.append("FAIL")
    text = "\n".join(lines)
    assert shell.detect_kind(text) == shell.GO
    result = _run(text, "bash", "go test ./...")
    _check_accounting(text, result)
    for needed in (
        "config_test.go:48: ParseConfig",
        "--- FAIL: TestParseConfig (0.00s)",
        "FAIL\tgithub.com/acme/widget/internal/config\t0.012s",
        "ok  \tgithub.com/acme/widget/pkg/mod00",
    ):
        assert needed in result.text
    assert "=== RUN" not in result.text


def test_cargo_keeps_error_block_with_location() -> None:
    lines = [f"   Compiling crate{i} v0.{i}.1" for i in range(80)]
    lines += [
        "error[E0308]: mismatched types",
        "  --> src/lexer.rs:142:24",
        "    |",
        "142 |         let count: u32 = token.len();",
        "    |                    ---   ^^^^^^^^^^^ expected `u32`, found `usize`",
        "",
        "For more information about this error, try `rustc --explain E0308`.",
        "error: could not compile `widget` (lib) due to 1 previous error",
    ]
    text = "\n".join(lines)
    assert shell.detect_kind(text) == shell.CARGO
    result = _run(text, "bash", "cargo build")
    _check_accounting(text, result)
    for needed in (
        "error[E0308]: mismatched types",
        "  --> src/lexer.rs:142:24",
        "expected `u32`, found `usize`",
        "error: could not compile `widget`",
    ):
        assert needed in result.text
    assert result.text.count("Compiling") <= 3


def test_jest_keeps_failing_suite_block_and_totals() -> None:
    lines = [f"PASS src/components/Widget{i}.test.tsx" for i in range(60)]
    lines[20:20] = [
        "FAIL src/utils/format.test.ts",
        "  ● formatPrice \u203a rounds half up",
        "",
        '    Expected: "1.35"',
        '    Received: "1.34"',
        "",
        "      at Object.<anonymous> (src/utils/format.test.ts:14:19)",
    ]
    lines += [
        "",
        "Test Suites: 1 failed, 60 passed, 61 total",
        "Tests:       1 failed, 212 passed, 213 total",
        "Time:        8.412 s",
    ]
    text = "\n".join(lines)
    result = _run(text, "bash", "npx jest")
    _check_accounting(text, result)
    for needed in (
        "FAIL src/utils/format.test.ts",
        "● formatPrice \u203a rounds half up",
        "(src/utils/format.test.ts:14:19)",
        "Test Suites: 1 failed, 60 passed, 61 total",
        "Tests:       1 failed, 212 passed, 213 total",
    ):
        assert needed in result.text


def test_tsc_keeps_error_lines_and_count() -> None:
    lines = [
        f"src/feature{i % 7}/module{i}.ts({10 + i},{3 + i % 5}): error TS2322: Type 'string' "
        "is not assignable to type 'number'."
        for i in range(60)
    ]
    lines.append("Found 60 errors in 7 files.")
    text = "\n".join(lines)
    assert shell.detect_kind(text) == shell.TSC
    result = _run(text, "bash", "npx tsc --noEmit")
    _check_accounting(text, result)
    assert "src/feature0/module0.ts(10,3): error TS2322" in result.text
    assert "Found 60 errors in 7 files." in result.text


def test_eslint_keeps_file_headers_with_their_problems_and_total() -> None:
    lines = []
    for f in range(20):
        lines.append(f"/home/dev/app/src/views/View{f}.vue")
        for j in range(4):
            level = "error" if j % 2 else "warning"
            lines.append(f"  {10 + j * 7}:{5 + j}  {level}  'item{j}' is assigned a value but "
                         "never used  no-unused-vars")  # fmt: skip
        lines.append("")
    lines.append("✖ 80 problems (40 errors, 40 warnings)")
    text = "\n".join(lines)
    assert shell.detect_kind(text) == shell.ESLINT
    result = _run(text, "bash", "npx eslint src")
    _check_accounting(text, result)
    assert "✖ 80 problems (40 errors, 40 warnings)" in result.text
    kept = result.text.split("\n")
    headers = [i for i, line in enumerate(kept) if line.startswith("/home/dev/app/src/views/")]
    assert len(headers) >= 5
    # A problem line shown is always under its file's header.
    first_problem = next(i for i, line in enumerate(kept) if "  error  " in line)
    assert headers[0] < first_problem


# --- tracebacks, installs, generic logs ----------------------------------------------------


def _traceback_run() -> str:
    lines = [f"processing record {i}: ok" for i in range(60)]
    lines += [
        "Traceback (most recent call last):",
        '  File "/workspace/proj/reproduce_error.py", line 37, in <module>',
        "    evaluator.run()",
        '  File "/workspace/proj/monai/engines/evaluator.py", line 137, in run',
        "    super().run()",
        '  File "/opt/conda/lib/python3.8/site-packages/ignite/engine/engine.py", line 704, in run',
        "    return self._internal_run()",
        '  File "/opt/conda/lib/python3.8/site-packages/ignite/engine/engine.py", line 783, in x',
        "    self._handle_exception(e)",
        '  File "/workspace/proj/monai/engines/workflow.py", line 297, in _iteration',
        '    raise NotImplementedError(f"Subclass {name} must implement this method.")',
        "NotImplementedError: Subclass Evaluator must implement this method.[Python Interpreter: "
        "/opt/miniconda3/envs/testbed/bin/python]",
        "root@openhands-workspace:/workspace/proj # ",
        "[Command finished with exit code 1]",
    ]
    return "\n".join(lines)


def test_python_traceback_keeps_frames_exception_and_openhands_trailers() -> None:
    text = _traceback_run()
    result = _run(text, "execute_bash", "python reproduce_error.py")
    _check_accounting(text, result)
    for needed in (
        "Traceback (most recent call last):",
        'File "/workspace/proj/monai/engines/workflow.py", line 297, in _iteration',
        "raise NotImplementedError(",
        "NotImplementedError: Subclass Evaluator must implement this method.",
        "[Python Interpreter: /opt/miniconda3/envs/testbed/bin/python]",
        "root@openhands-workspace:/workspace/proj # ",
        "[Command finished with exit code 1]",
        'File "/workspace/proj/reproduce_error.py", line 37, in <module>',
    ):
        assert needed in result.text, needed


def test_swe_agent_trailers_are_always_kept() -> None:
    lines = [f"step {i}: value={i * 3}" for i in range(200)]
    lines += ["(Open file: /pydicom/reproduce_bug.py)", "(Current directory: /pydicom)", "bash-$"]
    text = "\n".join(lines)
    result = _run(text, "bash", "python reproduce_bug.py", level=2)
    assert result.text.endswith(
        "(Open file: /pydicom/reproduce_bug.py)\n(Current directory: /pydicom)\nbash-$"
    )


def test_pip_install_drops_progress_keeps_errors_and_result() -> None:
    lines = ["Obtaining file:///testbed", "  Installing build dependencies ... done"]
    lines += [
        f"Requirement already satisfied: dep{i} in /opt/venv/lib/python3.9/site-packages "
        f"(from marshmallow==3.13.0) ({i}.0.1)"
        for i in range(60)
    ]
    lines += [
        "ERROR: Could not find a version that satisfies the requirement nosuchpkg==9.9",
        "Installing collected packages: marshmallow",
        "Successfully installed marshmallow-3.13.0",
    ]
    text = "\n".join(lines)
    assert shell.detect_kind(text) == shell.INSTALL
    result = _run(text, "bash", "pip install -e .[dev]")
    _check_accounting(text, result)
    assert "ERROR: Could not find a version that satisfies the requirement" in result.text
    assert "Successfully installed marshmallow-3.13.0" in result.text
    assert result.text.count("Requirement already satisfied") <= 1


def test_npm_errors_are_kept() -> None:
    lines = [f"npm WARN deprecated pkg{i}@1.{i}.0: no longer supported" for i in range(80)]
    lines += [
        "npm ERR! code ERESOLVE",
        "npm ERR! ERESOLVE unable to resolve dependency tree",
        'npm ERR! peer react@"^17.0.0" from react-legacy-widget@2.3.1',
    ]
    text = "\n".join(lines)
    result = _run(text, "bash", "npm install")
    _check_accounting(text, result)
    assert "npm ERR! code ERESOLVE" in result.text
    assert 'npm ERR! peer react@"^17.0.0" from react-legacy-widget@2.3.1' in result.text


def test_generic_log_keeps_head_tail_and_error_with_context() -> None:
    lines = ["Starting build server on :8080"]
    lines += [f"[10:00:{i % 60:02d}] INFO worker-{i % 4} processed batch {i}" for i in range(300)]
    lines[150] = "[10:02:00] ERROR worker-2 failed to write /var/data/shard_17.bin: quota exceeded"
    lines.append("Server stopped: exit status 1")
    text = "\n".join(lines)
    result = _run(text, "bash", "./run-server.sh")
    _check_accounting(text, result)
    kept = result.text.split("\n")
    assert kept[0] == "Starting build server on :8080"
    assert kept[-1] == "Server stopped: exit status 1"
    at = kept.index(lines[150])
    assert kept[at - 1] == lines[149] and kept[at + 1] == lines[151]


def test_repeated_lines_collapse_to_one_with_a_count() -> None:
    lines = [f"line {i} of setup /etc/conf_{i}" for i in range(40)]
    lines += ["waiting for connection..."] * 200
    lines += ["connected after 200 tries"]
    text = "\n".join(lines)
    result = _run(text, "bash", "./wait.sh")
    _check_accounting(text, result)
    assert "waiting for connection...\n[… 199 identical lines omitted …]" in result.text
    assert result.text.count("waiting for connection...") == 1


def test_long_line_is_cut_with_its_length_shown() -> None:
    text = "result: " + "abcdefghij" * 3000 + "\nsecond line\n"
    result = _compress(text, command="python dump.py")
    assert result is not None
    assert "characters omitted …]" in result.text
    assert "characters cut from 1 long line" in result.omitted
    assert result.text.startswith("result: abcdefghij")
    assert result.text.endswith("second line")
    assert len(result.text) < len(text) // 3


def test_level_two_is_smaller_than_level_one() -> None:
    lines = [f"[10:00:{i % 60:02d}] INFO worker-{i % 4} processed batch_{i}" for i in range(900)]
    lines[450] = "[10:07:30] ERROR worker-2 failed to write /var/data/shard_17.bin"
    text = "\n".join(lines)
    first = _run(text, "bash", "./serve.sh")
    second = _run(text, "bash", "./serve.sh", level=2)
    assert len(second.text) < len(first.text) <= len(text) // 4 + 100
    assert lines[450] in second.text


# --- routing and shape ---------------------------------------------------------------------


def test_short_output_passes_unchanged() -> None:
    assert _compress("README.md\nhello.py\n", command="ls") is None
    assert _compress("", command="true") is None


def test_not_a_shell_tool_needs_a_clear_log_shape() -> None:
    prose = "\n".join(f"Paragraph {i}: the service handles requests." for i in range(200))
    assert shell.compress(ToolOutput(prose, "webfetch", ""), Budget(1000)) is None
    quoted = "Notes on the bug.\nTraceback (most recent call last):\n" + prose
    assert shell.compress(ToolOutput(quoted, "task", ""), Budget(1000)) is None
    log = _pytest_log()
    result = shell.compress(ToolOutput(log, "run_tests_tool", ""), Budget(len(log) // 4))
    assert result is not None and "1 failed, 120 passed" in result.text


def test_grep_output_in_a_shell_tool_goes_to_the_search_compressor() -> None:
    text = "\n".join(
        f"src/app/module_{i % 30}.py:{i * 3 + 1}:    result = handle_request(ctx, {i})"
        for i in range(300)
    )
    command = "git log --oneline | head -1 && git grep -n handle_request"
    output = ToolOutput(text, "bash", orjson.dumps({"command": command}).decode())
    budget = Budget(len(text) // 4)
    assert shell.compress(output, budget) == search.compress(output, budget)
    assert shell.compress(output, budget) is not None


def test_swe_agent_file_view_is_left_to_the_file_view_compressor() -> None:
    lines = ["[File: /treon/treon/treon.py (144 lines total)]", "(44 more lines above)"]
    lines += [f"{n}:    value_{n} = compute(arguments['--threads'])" for n in range(45, 145)]
    lines += ["(Open file: /treon/treon/treon.py)", "(Current directory: /treon)", "bash-$"]
    assert _compress("\n".join(lines), command="goto 122") is None


def test_hostile_input_never_raises() -> None:
    surrogates = "\n".join(f"line {i} \ud800 error \x00 value" for i in range(500))
    crlf = "\r\n".join(f"Downloading pkg{i} ... 100%\rDownloading pkg{i} done" for i in range(300))
    ansi = "\n".join(f"\x1b[31mERROR\x1b[0m step {i} failed" for i in range(300))
    for text in (surrogates, crlf, ansi, "\n" * 5000, "\x00" * 20000, "é" * 30000):
        result = _compress(text, command="./build.sh")
        assert result is None or len(result.text) < len(text)


def test_huge_single_line_is_fast_and_bounded() -> None:
    text = "x" * 10_000_000
    started = time.perf_counter()
    result = shell.compress(ToolOutput(text, "bash", ""), Budget(100_000))
    assert time.perf_counter() - started < 2.0
    assert result is not None and len(result.text) <= 100_000


def test_100kb_log_is_compressed_quickly() -> None:
    text = _pytest_log(passed=1700)
    assert len(text) > 100_000
    output = ToolOutput(text, "bash", "")
    shell.compress(output, Budget(len(text) // 4))
    started = time.perf_counter()
    for _ in range(5):
        shell.compress(output, Budget(len(text) // 4))
    assert (time.perf_counter() - started) / 5 < 0.05


def test_deterministic() -> None:
    text = _traceback_run() + "\n" + _pytest_log()
    first = _compress(text)
    assert first is not None
    assert all(_compress(text) == first for _ in range(3))


def test_git_output_keeps_commits_files_and_hunks() -> None:
    lines = []
    for c in range(12):
        lines += [
            f"commit {c:02x}9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1",
            "Author: Dev <d@x.io>",
            "",
        ]
        lines += [f"    change {c}", "", f"diff --git a/src/mod_{c}.py b/src/mod_{c}.py"]
        lines += [
            f"--- a/src/mod_{c}.py",
            f"+++ b/src/mod_{c}.py",
            f"@@ -{c * 10},7 +{c * 10},8 @@",
        ]
        lines += [f"     context line {j}" for j in range(40)] + [f"+    added_{c} = True"]
    text = "\n".join(lines)
    # A patch is a diff before it is a log: the diff compressor answers (tests/compressors/
    # test_diff.py), and keeps every commit, file, hunk and changed line here.
    args = orjson.dumps({"command": "git log -p -12"}).decode()
    routed = compress_output(ToolOutput(text, "bash", args), Budget(len(text) // 4))
    assert routed is not None and routed[0] == "diff"
    result = routed[1]
    assert result.text.count("diff --git a/src/mod_") == 12
    assert result.text.count("commit ") == 12
    assert result.text.count("+    added_") == 12


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "",
                "ok",
                "tests/test_a.py::test_x PASSED  [ 10%]",
                "E       assert 1 == 2",
                "Traceback (most recent call last):",
                '  File "/a/b.py", line 3, in f',
                "    x()",
                "ValueError: bad",
                "error[E0308]: mismatched types",
                "  --> src/a.rs:1:2",
                "--",
                "=== 1 failed in 0.1s ===",
                "\r\x1b[31mred\x1b[0m",
                "\ud800",
                "x" * 700,
                "bash-$",
                "src/a.py:12: in f",
                "FAILED a.py::t - E",
                "Requirement already satisfied: x",
            ]
        ),
        min_size=1,
        max_size=300,
    ),
    st.sampled_from(["bash", "execute_bash", "Bash", "unknown_tool"]),
    st.integers(min_value=200, max_value=3000),
)
def test_any_mix_of_log_lines_is_handled(lines: list[str], tool: str, max_chars: int) -> None:
    text = "\n".join(lines)
    result = shell.compress(ToolOutput(text, tool, ""), Budget(max_chars))
    if result is not None:
        assert len(result.text) < len(text)
        assert result.omitted
