"""The retrieval benchmark's fixture holds what it claims, and the scoring counts right."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from benchmarks import retrieval
from benchmarks.retrieval import (
    FIXTURE,
    GROUPS,
    HALVES,
    BuiltMemory,
    Query,
    content_words,
    fixture_problems,
    in_half,
    load_queries,
    rank_of,
    score,
)
from memory.archive import CHECKPOINT_FILE, SESSIONS_DIR
from memory.project import project_memory_dir
from memory.store import MemoryFile, MemoryStore

HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltMemory]:
    yield retrieval.build_memory(tmp_path_factory.mktemp("retrieval"))


@pytest.fixture(scope="module")
def queries() -> list[Query]:
    return load_queries()


def test_query_groups_are_large_enough(queries: list[Query]) -> None:
    sizes = Counter(query.group for query in queries)
    assert len(queries) >= 200
    assert set(sizes) == set(GROUPS)
    assert all(sizes[group] >= 40 for group in GROUPS), sizes
    cross = [query for query in queries if query.group == "cross_language"]
    english_asks = sum(not HAN.search(query.text) for query in cross)
    assert english_asks >= 20 and len(cross) - english_asks >= 20  # both directions


def test_fixture_has_no_problem(queries: list[Query], memory: BuiltMemory) -> None:
    """Every target names exactly one entry of the built memory, paraphrases share no content
    word with it, cross-language queries cross, unrelated ones have no target."""
    assert fixture_problems(queries, memory) == []


def test_memory_md_is_what_the_store_reads() -> None:
    text = (FIXTURE / "MEMORY.md").read_text(encoding="utf-8")
    entries = MemoryFile.parse(text).entries()
    assert 250 <= len(entries) <= 350
    assert {entry.section for entry in entries} == {
        "Decisions",
        "Constraints",
        "Gotchas",
        "Facts",
        "Notes",
    }
    assert all(entry.date for entry in entries)
    chinese = sum(bool(HAN.search(entry.text)) for entry in entries)
    assert 0.25 <= chinese / len(entries) <= 0.45
    assert MemoryFile.parse(text).render() == text  # the store round-trips it unchanged


def test_notes_are_store_captures(tmp_path: Path) -> None:
    """Capturing the same texts again adds nothing: headings and hashes are the store's."""
    store = MemoryStore(tmp_path)
    store.notes_path.parent.mkdir(parents=True, exist_ok=True)
    text = (FIXTURE / "notes.md").read_text(encoding="utf-8")
    store.notes_path.write_text(text, encoding="utf-8")
    bodies = re.findall(r"^## \S+ \(session \w+\) \[\w+\]\n\n(.+)$", text, re.MULTILINE)
    assert len(bodies) == 40
    assert not any(store.capture_note("s", body, datetime(2026, 11, 1)) for body in bodies)


def test_checkpoints_are_written_like_compactions(memory: BuiltMemory) -> None:
    memory_dir = project_memory_dir(memory.project)
    newest = json.loads((FIXTURE / "checkpoints.json").read_text(encoding="utf-8"))
    newest.sort(key=lambda item: item["captured_at"])
    assert newest[-1]["session_id"] in (memory_dir / CHECKPOINT_FILE).read_text(encoding="utf-8")
    assert len(list((memory_dir / SESSIONS_DIR).iterdir())) == len(newest)


def test_shared_word_makes_a_paraphrase_fail(memory: BuiltMemory) -> None:
    """The check can fail: a word, a plural or a jieba word in common is caught."""
    target = "Use PostgreSQL 16 as the primary database"
    assert content_words("which databases do we rely on") & content_words(target) == {"databas"}
    bad = [
        Query("p-1", "paraphrase", "which databases do we rely on", (target,)),
        Query("p-2", "paraphrase", "新服务用什么写", ("新的微服务一律用 Python 编写",)),
        Query("p-3", "paraphrase", "anything", ("no such entry anywhere",)),
        Query("c-1", "cross_language", "主库是什么", ("灰度发布按租户比例放量",)),
    ]
    problems = fixture_problems(bad, memory)
    assert [problem.split(":")[0] for problem in problems] == ["p-1", "p-2", "p-3", "c-1"]


def test_scores_count_ranks() -> None:
    queries = [
        Query("s-1", "same_words", "a", ("alpha",)),
        Query("s-2", "same_words", "b", ("beta",)),
        Query("u-1", "unrelated", "c", ()),
        Query("u-2", "unrelated", "d", ()),
    ]
    answers: dict[str, Sequence[str]] = {
        "a": ["Alpha entry"],
        "b": ["x", "y", "the BETA one"],
        "c": [],
        "d": ["something"],
    }
    groups = score(queries, lambda text: answers[text])
    same = groups["same_words"].row()
    assert same["recall@1"] == 0.5 and same["recall@5"] == 1.0
    assert same["mrr"] == round((1 + 1 / 3) / 2, 3)
    assert groups["unrelated"].row()["answered"] == 0.5
    assert rank_of(queries[0], ["nothing here"]) is None


def test_the_halves_split_every_group() -> None:
    """The ranking constants are set on one half; the other is reported apart."""
    queries = load_queries()
    tuning = [q for q in queries if in_half(q, "tuning")]
    held_out = [q for q in queries if in_half(q, "held-out")]
    assert len(tuning) + len(held_out) == len(queries) and HALVES[0] == "all"
    assert not {q.id for q in tuning} & {q.id for q in held_out}
    for group in GROUPS:
        assert sum(q.group == group for q in tuning) >= 15
        assert sum(q.group == group for q in held_out) >= 15


def test_semantic_methods_only_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retrieval.semantic, "installed", lambda: False)
    assert set(retrieval.available_methods()) == {"bigram", "jieba"}
    monkeypatch.setattr(retrieval.semantic, "installed", lambda: True)
    assert {"hybrid", "dense"} <= set(retrieval.available_methods())


def test_benchmark_runs_on_a_subset(capsys: pytest.CaptureFixture[str]) -> None:
    report = retrieval.main(["--per-group", "3", "--methods", "bigram", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == report
    bigram = report["methods"]["bigram"]
    assert set(bigram["groups"]) == set(GROUPS)
    assert bigram["groups"]["same_words"]["recall@5"] > 0  # BM25 finds shared words
    assert 0 <= bigram["false_recall"] <= 1
    assert bigram["latency_ms"]["p95"] >= bigram["latency_ms"]["p50"] > 0


def test_padding_and_misses(memory: BuiltMemory, capsys: pytest.CaptureFixture[str]) -> None:
    report = retrieval.main(
        ["--per-group", "4", "--methods", "bigram", "--pad", "50", "--misses", "bigram"]
    )
    assert report["entries"] == len(memory.entries) + 50  # the filler is indexed too
    wrong = report["misses"]["bigram"]
    asked = {query.id for query in retrieval.select(load_queries(), 4)}
    assert wrong and all(line.split(" ")[0] in asked for line in wrong)
    assert f"{len(wrong)} queries bigram gets wrong" in capsys.readouterr().out
