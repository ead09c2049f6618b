"""The memory each project sees: its own ``.deep-memory/`` plus the global memory directory.

``MemoryCatalog.get(project_dir)`` returns a ``ProjectMemory`` (cached per project) that can
search every memory file the project can read, list the stable constraints and decisions, and
store into the project's files (or the global ones when there is no project). Whether a
project directory may be used at all is decided before, by ``memory.project``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from cachetools import LRUCache

from memory.archive import CHECKPOINT_FILE, SESSIONS_DIR, newest_checkpoints
from memory.files import LOCKS_DIRNAME
from memory.injection import Line
from memory.project import DEFAULT_MEMORY_DIRNAME, global_memory_dir, project_memory_dir
from memory.search import Hit, MemoryIndex
from memory.semantic import CACHE_FILE as EMBEDDINGS_FILE
from memory.semantic import Embeddings
from memory.signals import keyword_pattern
from memory.store import DEFAULT_SIMILARITY, MEMORY_FILE, NOTES_FILE, MemoryStore, normalize
from memory.threads import Background
from memory.tokenize import TokenizerMode

log = logging.getLogger("deepmem.memory")

# Archived sessions searched: the newest checkpoint of each of the most recently compacted.
INDEXED_SESSIONS = 20
STABLE_SECTIONS = ("Constraints", "Decisions")
MAX_QUERY_CHARS = 4000

# Words that carry no topic: left out of recall queries so "how do I fix the tests" does not
# match every note that says "the". The words that ask for a capture ("remember", 记住) are
# addressed to deepmem, not a topic: every captured note holds one.
_STOPWORD_TEXT = (
    "a an and are as at be but by can could do does don't dont for forget from have how i if "
    "important in into is it its me my no not of on or our please remember so that the then "
    "there this to us was we what when where which why will with would you your"
)
_STOPWORD_LIST = tuple(_STOPWORD_TEXT.split())
_TASK_WORDS = ("记住", "记得", "别忘了?", "不要忘记?")
_STOPWORDS = keyword_pattern(_STOPWORD_LIST, _TASK_WORDS)
# The relevance floor of recall (``memory.search.lexical_similarity``), so a message about
# something else, or one word of a longer message, recalls nothing. Set on the tuning half of
# fixtures/retrieval (benchmarks/retrieval.py).
RECALL_FLOOR = 0.2
# How long stopping waits for the checkpoints still being written (``MemoryCatalog.writes``).
CLOSE_WAIT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class MemorySettings:
    dirname: str = DEFAULT_MEMORY_DIRNAME
    similarity: float = DEFAULT_SIMILARITY
    tokenizer: TokenizerMode = "bigram"
    semantic: bool = False  # match by meaning too (the optional embedding model)


class ProjectMemory:
    """Search and store for one project (``project_dir`` None: the global memory alone)."""

    def __init__(
        self,
        project_dir: Path | None,
        global_dir: Path,
        settings: MemorySettings,
        lock_dir: Path | None = None,
        embeddings: Embeddings | None = None,
    ) -> None:
        self.project_dir = project_dir
        self.global_dir = global_dir
        self.lock_dir = lock_dir
        self.memory_dir = (
            project_memory_dir(project_dir, settings.dirname) if project_dir is not None else None
        )
        dense = embeddings.scorer() if embeddings is not None else None
        self.global_store = MemoryStore(global_dir, settings.similarity, lock_dir, dense)
        self.project_store = (
            MemoryStore(self.memory_dir, settings.similarity, lock_dir, dense)
            if self.memory_dir
            else None
        )
        self.index = MemoryIndex(tokenizer=settings.tokenizer, dense=dense)
        # The index is rebuilt in place when a file changes: one search (or refresh) at a time.
        self.index_lock = threading.Lock()
        for directory in self.directories:
            self.index.add(directory / MEMORY_FILE, within=directory.parent)
            self.index.add(directory / NOTES_FILE, kind_hint="notes", within=directory.parent)
        if self.memory_dir is not None:
            self.index.add(
                self.memory_dir / CHECKPOINT_FILE,
                kind_hint="checkpoint",
                within=self.memory_dir.parent,
            )
        self._archives_seen: tuple[int | None, ...] | None = None
        self._archived: set[Path] = set()

    @property
    def directories(self) -> list[Path]:
        """Global first, then the project's (the order results tie-break in)."""
        return [self.global_dir] + ([self.memory_dir] if self.memory_dir else [])

    @property
    def store(self) -> MemoryStore:
        """Where writes go: the project's memory, else the global one."""
        return self.project_store or self.global_store

    def stores(self) -> list[MemoryStore]:
        return [self.global_store] + ([self.project_store] if self.project_store else [])

    def search(
        self,
        query: str,
        limit: int = 5,
        now: date | None = None,
        floor: float = 0.0,
        meaning: str | None = None,
    ) -> list[Hit]:
        text, dense = meaning or query, self.index.dense
        # The model needs no index: a message is embedded before the lock, so one session's
        # embedding never holds up another's search of the same project. Not for an index
        # that had no entry (empty memory: nothing to compare it with); if entries have
        # appeared since, the search embeds it itself.
        embed = dense is not None and text.strip() and self.index.had_entries
        vector = dense.embed(text) if dense is not None and embed else None
        with self.index_lock:
            self._watch_session_checkpoints()
            return self.index.search(query, limit, now, floor=floor, meaning=text, vector=vector)

    def refresh_index(self) -> None:
        """Bring the search index up to what the memory files and the archived checkpoints
        hold now, as the next search would (and then need not): at start-up, and once a
        request's answer is out after it wrote memory (a checkpoint, a captured note)."""
        with self.index_lock:
            self._watch_session_checkpoints()
            self.index.refresh()

    def recall(self, user_text: str, limit: int, now: date | None = None) -> list[Line]:
        """Lines worth showing beside a user message: its best entries above the relevance
        floor, searched by its topic words (and, with the embedding model, by its meaning)."""
        text = user_text[:MAX_QUERY_CHARS]
        hits = self.search(_STOPWORDS.sub(" ", text), limit, now, RECALL_FLOOR, meaning=text)
        return [
            Line(
                hit.entry.text, _source(hit), hit.entry.date.isoformat() if hit.entry.date else None
            )
            for hit in hits
        ]

    def stable_lines(self) -> list[Line]:
        """Constraints, then decisions newest first, from the global and project MEMORY.md."""
        lines: list[Line] = []
        seen: set[str] = set()
        for section in STABLE_SECTIONS:
            entries = [e for store in self.stores() for e in store.list(section)]
            if section != "Constraints":
                entries.sort(key=lambda e: e.date or "", reverse=True)
            for entry in entries:
                key = normalize(entry.text)
                if key not in seen:
                    seen.add(key)
                    lines.append(Line(entry.text, section, entry.date))
        return lines

    def _watch_session_checkpoints(self) -> None:
        """Index the newest archived checkpoint of the ``INDEXED_SESSIONS`` most recently
        compacted sessions. The archive is listed again only when ``sessions/`` or
        ``checkpoint.md`` changed (each compaction rewrites it): two stats per search."""
        if self.memory_dir is None:
            return
        sessions = self.memory_dir / SESSIONS_DIR
        seen = (_mtime(sessions), _mtime(self.memory_dir / CHECKPOINT_FILE))
        if seen == self._archives_seen:
            return
        self._archives_seen = seen
        wanted = {
            sessions / archived.session / archived.checkpoint.name
            for archived in newest_checkpoints(self.memory_dir, INDEXED_SESSIONS)
        }
        for path in self._archived - wanted:
            self.index.remove(path)
        for path in sorted(wanted - self._archived):
            # Archived under a name of its own, never written again: read once.
            self.index.add(
                path, kind_hint="checkpoint", within=self.memory_dir.parent, write_once=True
            )
        self._archived = wanted


def _source(hit: Hit) -> str:
    if hit.kind == "notes" and hit.path.endswith(NOTES_FILE):
        return "note"
    if hit.kind == "checkpoint" or "checkpoint" in Path(hit.path).name:
        return f"checkpoint: {hit.title}"
    return hit.title


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


class MemoryCatalog:
    """``ProjectMemory`` per project directory, the least recently used dropped first.

    Lock files go to ``<data_dir>/locks/``: every process sharing the data dir shares them.
    ``writes`` writes what no request waits for (compaction checkpoints), one at a time, off
    the request path; ``close`` waits for it."""

    def __init__(
        self, data_dir: Path, settings: MemorySettings | None = None, max_projects: int = 64
    ) -> None:
        self.global_dir = global_memory_dir(data_dir)
        self.lock_dir = Path(data_dir) / LOCKS_DIRNAME
        self.settings = settings or MemorySettings()
        self.embeddings = (
            Embeddings(Path(data_dir) / EMBEDDINGS_FILE) if self.settings.semantic else None
        )
        self._projects: LRUCache[Path | None, ProjectMemory] = LRUCache(maxsize=max_projects)
        self._lock = threading.Lock()
        self.writes = Background("deepmem-archive")

    def get(self, project_dir: Path | None) -> ProjectMemory:
        with self._lock:
            memory = self._projects.get(project_dir)
            if memory is None:
                memory = ProjectMemory(
                    project_dir, self.global_dir, self.settings, self.lock_dir, self.embeddings
                )
                self._projects[project_dir] = memory
            return memory

    @property
    def search_method(self) -> str:
        """What memory search ranks by: ``bm25``, or ``bm25+<model>`` with the embedding model
        (``bm25`` and why, when the model failed to load)."""
        if self.embeddings is None:
            return "bm25"
        if self.embeddings.failure is not None:
            return f"bm25 ({self.embeddings.name} unavailable: {self.embeddings.failure})"
        return f"bm25+{self.embeddings.name}"

    def warm(self) -> None:
        """Load the embedding model now, so no user message waits for it."""
        if self.embeddings is not None:
            self.embeddings.warm()

    def close(self) -> None:
        if not self.writes.close(CLOSE_WAIT_SECONDS):
            log.warning(
                "stopped before every checkpoint was written (waited %gs)", CLOSE_WAIT_SECONDS
            )
        if self.embeddings is not None:
            self.embeddings.close()
