"""benchmarks/paired.py: corpus requests direct, through the control and through each tree."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks.paired import Target, parse_tree, report
from tests.test_concurrency_bench import needs_control, transcript

ROOT = Path(__file__).resolve().parents[1]


def test_each_target_is_measured_against_the_same_request_direct() -> None:
    direct = Target("direct", "", [1.0, 2.0, 3.0, 4.0])
    control = Target("control", "", [2.0, 3.0, 4.0, 5.0])  # 1 ms over, every request
    a = Target("a", "", [3.0, 4.0, 5.0, 6.0], [(1.5, 1.0, "loop")] * 3 + [None])
    b = Target("b", "", [3.5, 4.5, 5.0, 6.0], [(1.2, 0.9, "worker")] * 4)
    figures = report([direct, control, a, b])
    assert figures["requests"] == 4
    assert figures["targets"]["control"]["overhead_p50"] == 1.0
    assert figures["targets"]["a"]["overhead_p50"] == 2.0
    assert figures["targets"]["a"]["ratio_p50"] == 2.0
    assert figures["targets"]["a"]["rewritten_on"] == {
        "loop": {"requests": 3, "before_forwarding_p50": 1.5, "rewrite_p50": 1.0}
    }
    assert figures["targets"]["b"]["rewritten_on"]["worker"]["requests"] == 4
    # per request, b against the first tree: +0.5, +0.5, 0, 0
    assert figures["against_first"] == {"b": {"median": 0.25, "mean": 0.25}}


def test_a_tree_is_a_deepmem_checkout(tmp_path: Path) -> None:
    assert parse_tree(f"new={ROOT}") == ("new", ROOT)
    assert parse_tree(str(ROOT)) == (ROOT.name, ROOT)
    with pytest.raises(argparse.ArgumentTypeError, match="not a deepmem tree"):
        parse_tree(f"old={tmp_path}")


@needs_control
def test_two_trees_over_two_transcripts_give_every_figure(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_bytes(orjson.dumps(transcript("log line\n" * 2_000)))
    (tmp_path / "b.json").write_bytes(orjson.dumps(transcript("two lines\n")))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.paired", "--tree", f"one={ROOT}", "--tree",
         f"two={ROOT}", "--limit", "2", "--flush-mb", "0", "--dialect", "anthropic", "--json"],
        cwd=ROOT,
        env={**os.environ, "DEEPMEM_CORPUS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["meta"] == {"dialect": "anthropic", "limit": 2, "flush_mb": 0}
    assert figures["requests"] == 4
    assert set(figures["targets"]) == {"control", "one", "two"}
    for name in ("one", "two"):
        tree = figures["targets"][name]
        assert tree["ratio_p50"] is not None
        assert sum(split["requests"] for split in tree["rewritten_on"].values()) == 4
    assert set(figures["against_first"]) == {"two"}


def test_trees_need_names_of_their_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.paired", "--tree", f"control={ROOT}",
         "--control", sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "a name of its own" in done.stderr
