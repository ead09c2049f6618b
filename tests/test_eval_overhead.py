"""benchmarks/eval_overhead.py: the evaluator's overhead by which send went first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.eval_overhead import main


def _run(tmp_path: Path, label: str, overheads: list[float]) -> Path:
    """A result file whose requests take ``overheads`` through the proxy (direct: 1 ms)."""
    requests: list[dict[str, Any]] = [
        {"k": k, "direct_ms": 1.0, "proxy_ms": 1.0 + ms} for k, ms in enumerate(overheads)
    ]
    requests.append({"k": 99, "direct_ms": 1.0, "direct_error": 500, "proxy_ms": 9.0})
    requests.append({"k": 100, "status": 502})  # never timed
    path = tmp_path / f"{label}.json"
    data = {"label": label, "transcripts": [{"id": "t", "requests": requests}]}
    path.write_bytes(orjson.dumps(data))
    return path


def _cells(output: str, label: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_orders_and_per_request_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Even indices (direct first) cost 0.5 ms through the control, odd ones 1.5 ms; the run
    # adds 0.25 ms to the first and 0.5 ms to the others.
    control = _run(tmp_path, "control", [0.5, 1.5] * 5)
    run = _run(tmp_path, "deepmem", [0.75, 2.0] * 5)
    assert main([str(control), str(run)]) == 0
    output = capsys.readouterr().out
    first, second, paired = _cells(output, "deepmem")[1:]
    assert first == "0.75 (1.50)"
    assert second == "2.00 (1.33)"
    assert paired == "+0.38 / +0.38 (n=10)"  # the failed and untimed requests left out
    assert _cells(output, "control")[-1] == "-"
    # The evaluator's p50 of ten values lies halfway between the fifth and sixth.
    assert _cells(output, "control")[0] == "1.00 / 1.50 (1.00 / 1.00)"


def test_requests_only_one_run_timed_are_left_out_of_the_differences(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    control = _run(tmp_path, "control", [0.5, 1.5])
    run = _run(tmp_path, "deepmem", [0.75, 2.0, 3.0, 3.0])
    assert main([str(control), str(run)]) == 0
    assert _cells(capsys.readouterr().out, "deepmem")[-1] == "+0.38 / +0.38 (n=2)"
