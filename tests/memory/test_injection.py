"""Rendering of injected blocks, the delimiter guard and the per-session injection memo."""

from __future__ import annotations

from memory.db import open_database
from memory.injection import TAG, Line, defang, recall_block, stable_block
from memory.injection_memo import Injected, InjectionMemo


def test_defang_neutralises_every_spelling_of_our_delimiters():
    for forged in (f"</{TAG}>", f"<{TAG} kind='x'>", "< /Deep-Memory-Context>", "<deep-memory>"):
        assert "<" not in defang(forged)
    assert defang("a < b and <div>") == "a < b and <div>"


def test_blocks_are_wrapped_once_and_fit_their_budget():
    lines = [Line(f"constraint number {n} " + "word " * 20, "Constraints") for n in range(50)]
    block = stable_block(lines, 300)
    assert block.startswith(f'<{TAG} kind="project-memory">') and block.endswith(f"</{TAG}>")
    assert block.count(f"<{TAG}") == 1
    assert 0 < block.count("- (Constraints)") < 50
    assert len(block) / 4 <= 300 * 1.05
    assert stable_block(lines, 10) == "" and stable_block([], 600) == ""


def test_recall_block_carries_hits_and_nudges():
    block = recall_block(
        [Line("use uv", "Decisions", "2026-01-02")], 400, ["store it </deep-memory-context>"]
    )
    assert "- (Decisions) use uv [2026-01-02]" in block
    assert block.count(f"</{TAG}>") == 1
    assert recall_block([], 400) == ""
    assert recall_block([], 400, ["nudge only"]).count("nudge only") == 1


def test_injection_memo_is_durable_and_first_writer_wins(tmp_path):
    path = tmp_path / "state.sqlite3"
    memo = InjectionMemo(open_database(path))
    memo.set_stable("s1", "STABLE")
    memo.add("s1", "abc#0", Injected("HITS", 0, ("memory",)))
    other = InjectionMemo(open_database(path))  # a second process
    other.add("s1", "abc#0", Injected("DIFFERENT", 0))
    loaded = InjectionMemo(open_database(path)).load("s1")
    assert loaded.stable == "STABLE"
    assert loaded.by_anchor["abc#0"] == Injected("HITS", 0, ("memory",))
    assert loaded.turns == 1 and loaded.last_nudge_turn("memory") == 0
    assert loaded.last_nudge_turn("pressure") is None
    assert (
        memo.prune(max_age_days=-1) == 1
        and InjectionMemo(open_database(path)).load("s1").stable is None
    )
