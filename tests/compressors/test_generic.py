"""The generic fallback: head, tail, error and identifier lines, exact gaps, huge lines."""

from __future__ import annotations

import random
import re

import pytest

from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import compress_output
from compressors.tools import generic
from tests.compressors.faithful import LINES_GAP, assert_faithful


def _budget(text: str, level: int = 1) -> Budget:
    divisor = 4 if level == 1 else 8
    return Budget(max(1000, len(text) // divisor), level)


def _run(text: str, tool: str = "mcp__k8s__pods_log") -> Compressed:
    result = generic.compress(ToolOutput(text, tool), _budget(text))
    assert result is not None
    return result


def _deploy_log() -> str:
    """An unknown tool's log: a banner, routine progress, two real problems, a summary."""
    lines = ["deploy v2.14.0 to cluster prod-eu-1 (namespace shop)", "resolving manifests"]
    for step in range(1, 301):
        lines.append(f"step {step}: applied resource batch, waiting for rollout to settle")
        if step == 120:
            lines.append("E0612 controller.go:417 ERROR reconcile PaymentGateway: timeout")
        if step == 205:
            lines.append("  at charts/payments/templates/deployment.yaml:88 (image_pull_secret)")
    lines += ["rollout finished with 1 error", "exit status 3"]
    return "\n".join(lines)


def test_keeps_head_tail_errors_and_references_with_exact_gaps() -> None:
    text = _deploy_log()
    result = _run(text)
    out = result.text
    assert len(out) < len(text) // 3
    assert out.startswith("deploy v2.14.0 to cluster prod-eu-1")
    assert out.endswith("rollout finished with 1 error\nexit status 3")
    assert "E0612 controller.go:417 ERROR reconcile PaymentGateway: timeout" in out
    assert "charts/payments/templates/deployment.yaml:88 (image_pull_secret)" in out
    shown = len(assert_faithful(text, out))
    total = text.count("\n") + 1
    assert result.omitted == f"{total - shown} of {total} lines omitted"
    assert LINES_GAP.search(out)


def test_runs_of_identical_lines_fold_to_one_line_and_a_count() -> None:
    lines = ["connecting to broker amqp://queue:5672"]
    lines += ["waiting for lock on /var/lib/app/state.db"] * 250
    lines += ["lock acquired after 250 retries", "migrated 12 tables"]
    text = "\n".join(lines)
    out = _run(text).text
    assert "waiting for lock on /var/lib/app/state.db\n[… 249 identical lines omitted …]" in out
    assert "lock acquired after 250 retries" in out
    assert_faithful(text, out)


def test_a_huge_single_line_keeps_start_and_end_with_the_exact_count() -> None:
    rng = random.Random(7)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789+/"
    blob = "".join(rng.choice(alphabet) for _ in range(400_000))
    result = _run(blob)
    match = re.fullmatch(r"(.+)\[… (\d+) characters omitted …\](.+)", result.text, re.S)
    assert match is not None
    head, cut, tail = match.group(1), int(match.group(2)), match.group(3)
    assert blob.startswith(head) and blob.endswith(tail)
    assert len(head) + cut + len(tail) == len(blob)
    assert result.omitted == f"{cut} of {len(blob)} characters omitted"
    assert len(result.text) <= _budget(blob).max_chars


def test_a_long_line_among_others_is_clipped_and_counted() -> None:
    minified = "var a=" + "x" * 30_000 + ";console.error('boot failed')"
    lines = ["bundle report for dist/app.min.js", minified]
    lines += [f"chunk {i}: dist/chunks/c{i}.js 12 kB" for i in range(60)]
    text = "\n".join(lines)
    result = _run(text)
    shown = len(assert_faithful(text, result.text))
    clipped = re.search(r"\[… (\d+) characters omitted …\]", result.text)
    assert clipped is not None
    cut = int(clipped.group(1))
    if shown == len(lines):
        assert result.omitted == f"{cut} characters omitted from 1 long line"
    else:
        total = len(lines)
        lines_part = f"{total - shown} of {total} lines omitted"
        assert result.omitted == f"{lines_part}, and {cut} characters from 1 long line"
    assert "console.error('boot failed')" in result.text


def test_small_outputs_and_outputs_within_budget_are_left_alone() -> None:
    small = "total 3\n-rw-r--r-- 1 dev dev 120 README.md\n"
    assert generic.compress(ToolOutput(small, "x"), Budget(1000)) is None
    text = _deploy_log()
    assert generic.compress(ToolOutput(text, "x"), Budget(len(text))) is None


def test_none_when_the_saving_would_be_under_a_fifth() -> None:
    text = _deploy_log()
    assert generic.compress(ToolOutput(text, "x"), Budget(int(len(text) * 0.9))) is None
    assert generic.compress(ToolOutput(text, "x"), Budget(int(len(text) * 0.7))) is not None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00" * 5000,
        "\ud800 lone surrogate \udfff\n" * 400,
        "\n" * 5000,
        "line\r\n" * 2000,
        bytes(random.Random(3).randrange(256) for _ in range(50_000)).decode("latin-1"),
        "İ" * 3000 + "\nERROR İİ\n" * 300,  # lower() lengthens this character
    ],
)
def test_hostile_inputs_never_raise(text: str) -> None:
    result = generic.compress(ToolOutput(text, "x"), _budget(text))
    if result is not None:
        assert len(result.text) < len(text)
        assert_faithful(text, result.text)


def test_output_is_deterministic_and_deeper_levels_are_smaller() -> None:
    text = _deploy_log()
    first = generic.compress(ToolOutput(text, "x"), _budget(text))
    again = generic.compress(ToolOutput(text, "x"), _budget(text))
    deeper = generic.compress(ToolOutput(text, "x"), _budget(text, level=2))
    assert first == again
    assert first is not None and deeper is not None
    assert len(deeper.text) < len(first.text)
    assert "ERROR reconcile PaymentGateway" in deeper.text


def test_a_name_containing_an_error_word_is_not_an_error_line() -> None:
    lines = [f"module {i}: loaded from /srv/app/handlers/exceptions_{i}.py" for i in range(200)]
    lines[150] = "module 150: Error: cannot import name 'Router'"
    text = "\n".join(lines)
    out = _run(text).text
    assert "Error: cannot import name 'Router'" in out


def test_unknown_tools_fall_back_to_generic() -> None:
    text = _deploy_log()
    for tool in ("mcp__k8s__pods_log", "BashOutput", "custom_deploy"):
        routed = compress_output(ToolOutput(text, tool), _budget(text))
        assert routed is not None
        name, result = routed
        assert name == "generic", tool
        assert "controller.go:417" in result.text


def test_lines_naming_task_terms_are_preferred() -> None:
    lines = [f"worker {i}: synced shard {i} of the catalog in {i % 7} ms" for i in range(400)]
    lines[222] = "worker 222: synced shard 222 of the athena workgroup in 3 ms"
    text = "\n".join(lines)
    plain = generic.compress(ToolOutput(text, "x"), _budget(text))
    focused = generic.compress(ToolOutput(text, "x", "", frozenset({"athena"})), _budget(text))
    assert plain is not None and focused is not None
    assert "athena workgroup" not in plain.text
    assert "athena workgroup" in focused.text


def test_gaps_name_identifiers_that_only_their_lines_hold() -> None:
    lines = ["registering routes"]
    lines += [f"route {i}: handlers/res_{i}.py -> api.v1.res_{i}.get" for i in range(300)]
    text = "\n".join(lines)
    out = _run(text).text
    kept_text = "\n".join(line for line in out.split("\n") if not line.startswith("[…"))
    position = 0
    named = 0
    for line in out.split("\n"):
        gap = re.fullmatch(r"\[… (\d+) lines? omitted(?:; they mention: (.*))? …\]", line)
        if gap is None:
            position = lines.index(line, position) + 1
            continue
        hidden = "\n".join(lines[position : position + int(gap.group(1))])
        for name in (gap.group(2) or "").split(", ") if gap.group(2) else []:
            assert name in hidden and name not in kept_text, name
            named += 1
        position += int(gap.group(1))
    assert named >= 10


def test_gaps_name_relative_modules() -> None:
    """A relative module (./loader7, ../../config) is a name: regression, only names with a
    letter first were found, so `./loader7` was never listed."""
    lines = ["bundling entry points"]
    lines += [f"chunk {i}: resolved ./loader{i} (2 kB)" for i in range(300)]
    lines += ["resolved ../../config", "done"]
    out = _run("\n".join(lines)).text
    mentioned = ", ".join(re.findall(r"they mention: (.*) …\]", out)).split(", ")
    assert len([name for name in mentioned if re.fullmatch(r"\./loader\d+", name)]) >= 10
    assert "../../config" in out
