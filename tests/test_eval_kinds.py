"""benchmarks/eval_kinds.py: evaluator results by agent kind and tuning split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.eval_kinds import main


def _transcript(name: str, outcomes: list[str], broken: bool) -> dict[str, Any]:
    requests: list[dict[str, Any]] = [
        {"k": 2, "T_O": 100, "T_R": 100, "cached_O": 0, "cached_R": 0},
        {"k": 4, "T_O": 200, "T_R": 100, "cached_O": 100, "cached_R": 50},
        {"k": 6, "status": 500},  # unmeasured: no T_R
    ]
    if broken:
        requests[1]["break"] = {"msgs_from_end": 1}
    return {"id": name, "requests": requests, "probes": [{"outcome": o} for o in outcomes]}


def test_kinds_and_held_out_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = {
        "label": "deepmem-chat",
        "dialect": "chat",
        "transcripts": [
            _transcript("oc-a", ["visible", "recoverable"], True),
            _transcript("oc-darkfactory-39c0a3da", ["lost", "error"], False),  # held out
            _transcript("cc-b", ["visible"], False),
            _transcript("sweagent-c", [], False),
        ],
    }
    path = tmp_path / "deepmem-chat.json"
    path.write_bytes(orjson.dumps(run))
    assert main([str(path)]) == 0
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    # two transcripts, six requests, 1 + 1 probes and 2 lost (an error counts as lost)
    assert rows["OpenCode (oc-*)"][:2] == ["2 / 6", "1 / 1 / 2"]
    # 1 - (100+100)/(100+200) summed; final 1 - 100/200
    assert rows["OpenCode (oc-*)"][2:4] == ["33.3 %", "50.0 %"]
    # Anthropic-like: O = 125 + (10 + 125) = 260, R = 125 + (5 + 62.5) = 192.5
    assert rows["OpenCode (oc-*)"][4] == "26.0 %"
    assert rows["OpenCode (oc-*)"][6] == "1 / 2 |"
    assert rows["Codex (cx-*)"][:2] == ["0 / 0", "0 / 0 / 0"]
    assert rows["SWE-style (the rest)"][0] == "1 / 3"
    assert rows["held out from tuning (5)"][:2] == ["1 / 3", "0 / 0 / 2"]
    assert rows["tuning (20)"][:2] == ["3 / 9", "2 / 1 / 0"]
    assert rows["all"][6] == "1 / 4 |"
