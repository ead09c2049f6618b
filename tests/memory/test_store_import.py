"""Import stays near-linear: duplicates are found through an index, with the same answers as
comparing each entry with every other one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memory.store as store_module
from memory.store import SECTIONS, Entry, MemoryStore, _Duplicates, features, normalize, similarity

WORDS = [f"word{i}" for i in range(40)]


def _brute_force(entry: Entry, known: list[Entry]) -> tuple[Entry | None, float]:
    best: Entry | None = None
    best_score = 0.0
    for other in known:
        score = similarity(features(entry.text), features(other.text))
        if score > best_score:
            best, best_score = other, score
    return best, best_score


texts = st.lists(st.sampled_from([*WORDS, "!", "\u4f7f\u7528"]), min_size=0, max_size=8).map(
    " ".join
)


@settings(max_examples=300, deadline=None)
@given(
    known=st.lists(texts.filter(str.strip), max_size=12),
    new=texts.filter(str.strip),
    threshold=st.sampled_from([0.0, 0.3, 0.5, 0.7, 0.85, 1.0]),
)
def test_index_finds_what_a_full_scan_finds(known: list[str], new: str, threshold: float) -> None:
    entries = [Entry("Facts", text) for text in known]
    index = _Duplicates(entries, threshold)
    entry = Entry("Notes", new)
    best, score = _brute_force(entry, entries)
    found, found_score = index.most_similar(entry)
    if best is not None and score >= threshold:
        assert (found, found_score) == (best, score)
    else:
        assert found is None or found_score < threshold
    exact = next((e for e in entries if normalize(e.text) == normalize(new)), None)
    assert index.exact(entry) == exact


def test_import_of_thousands_compares_each_entry_with_a_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,500 entries: a full scan per entry made ~1.1 million comparisons (40 s on a large
    memory, the event loop frozen meanwhile); the index makes a few per entry."""
    comparisons = 0
    real = store_module.similarity

    def counted(a: frozenset[str], b: frozenset[str]) -> float:
        nonlocal comparisons
        comparisons += 1
        return real(a, b)

    monkeypatch.setattr(store_module, "similarity", counted)
    rng = random.Random(7)
    vocabulary = [f"term{i}" for i in range(3000)]
    entries = [
        {"section": rng.choice(SECTIONS), "text": " ".join(rng.sample(vocabulary, 12))}
        for _ in range(1500)
    ]
    store = MemoryStore(tmp_path / ".deep-memory")
    result = store.import_(json.dumps(entries))
    assert (result.added, result.duplicates) == (1500, 0)
    assert comparisons < 10 * len(entries)
    again = store.import_(json.dumps(entries[:10]))
    assert (again.added, again.duplicates) == (0, 10)
