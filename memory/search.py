"""Search over project memory: every entry (a ``MEMORY.md`` bullet, a captured note, a line of a
checkpoint) is ranked on its own; its ``## `` section says what kind of entry it is.

Files: ``MEMORY.md`` (``## Decisions / Constraints / Gotchas / Facts / Notes``, bullets
``- text [YYYY-MM-DD]``), ``notes.md`` (``## <ISO> (session <sid8>) [<hash8>]`` captures) and
checkpoints (``## User Intent / Decisions / Constraints / Gotchas / File Changes``; the preamble
naming the session and capture time is not indexed).

Relevance
- Lexical: the cosine of the query's and the entry's term sets, each term weighted by its
  Lucene idf ``log(1 + (N - n + 0.5) / (n + 0.5))`` (``lexical_similarity``). A term the memory
  never mentions counts in the query like its rarest one. Unlike a raw BM25 score it is
  bounded (0..1), so one ``floor`` can tell a match from an entry sharing a common word; and it
  is not dominated by a long entry that repeats a word.
- Query terms are de-duplicated. ``|`` separates OR phrases; an entry's relevance is the
  **max** over phrases, not the sum (alternatives: synonyms, two languages).
- With a ``DenseScorer`` (``memory.semantic``, the optional embedding model), an entry whose
  meaning is close to the query's (cosine at or above the scorer's floor) also matches, and
  relevance is ``DENSE_WEIGHT * dense + (1 - DENSE_WEIGHT) * lexical``.
- Order: relevance times the source's weight (curated ``MEMORY.md`` entries 1.0, raw
  captures and checkpoint lines ``RAW_WEIGHT``) times freshness, ``1 - AGE_WEIGHT * (1 -
  0.5 ** (age / half-life))`` with the half-life of the entry's kind (``DECAY_HALF_LIFE_DAYS``:
  Constraints never decay, Decisions 180 days, Gotchas 90, Facts 60, Notes / checkpoint / other
  sections 30). Age and source order near-equal matches; they never beat a clearly better one.
- One copy of each text (``memory.store.normalize``): checkpoint.md repeats the newest archived
  checkpoint, and a note may be stored twice; the best placed copy is kept.
- Ties are ordered by file path, then position in the file, so results are deterministic.

``raw_scores`` gives each entry's BM25 score (k1 = 1.5, b = 0.75, the same idf; equal to
rank-bm25's ``BM25Okapi`` with this idf, which the tests check).

Speed: an inverted index (term -> postings) means a query touches only its own terms'
postings. Files are re-parsed only when their (mtime, size) changes; the global statistics
(N, average length, idf) are then recomputed from cached counts.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Protocol

from memory import markdown
from memory.files import OutsideMemoryRoot, confine
from memory.store import normalize
from memory.tokenize import TokenizerMode, tokenize

log = logging.getLogger("deepmem.memory")

K1 = 1.5
B = 0.75
# Ranking constants, set on the tuning half of fixtures/retrieval (benchmarks/retrieval.py).
AGE_WEIGHT = 0.2  # the most an old entry can lose to age
RAW_WEIGHT = 0.85  # captures and checkpoint lines against curated entries
DENSE_WEIGHT = 0.75  # meaning against words, with a dense scorer
QUERY_SPAN = 2.0  # a long message counts as at most this many times the entry's size
CURATED_KINDS = frozenset({"constraints", "decisions", "gotchas", "facts", "notes", "other"})

DECAY_HALF_LIFE_DAYS: dict[str, float | None] = {
    "constraints": None,
    "decisions": 180.0,
    "gotchas": 90.0,
    "facts": 60.0,
    "notes": 30.0,
    "checkpoint": 30.0,
    "other": 30.0,
}
_TITLE_KINDS = {
    "decision": "decisions",
    "constraint": "constraints",
    "gotcha": "gotchas",
    "fact": "facts",
    "note": "notes",
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One bullet (or line) of a section; ``text`` has the bullet and date tag removed."""

    text: str
    line: int  # 1-based line number in the file
    date: date | None = None


@dataclass(frozen=True, slots=True)
class Document:
    """One ``## `` section of a memory file."""

    path: str
    title: str
    kind: str
    position: int  # index of the section within its file
    line: int  # 1-based line number of the heading
    text: str  # the section body as written
    entries: tuple[Entry, ...]
    date: date | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    """One matching entry and the section it stands in."""

    document: Document
    entry: Entry
    score: float

    @property
    def path(self) -> str:
        return self.document.path

    @property
    def title(self) -> str:
        return self.document.title

    @property
    def kind(self) -> str:
        return self.document.kind


# --------------------------------------------------------------------------- parsing


def parse_documents(
    path: str | Path,
    text: str,
    kind_hint: str | None = None,
    default_date: date | None = None,
) -> list[Document]:
    """Split a Markdown memory file into one document per ``## `` section.

    ``kind_hint`` names the kind of sections whose title is not a known kind (``"notes"`` for
    notes.md, ``"checkpoint"`` for checkpoints); by default it is guessed from the file name.
    Text before the first ``## `` heading is ignored unless it has content beyond headings.
    The grammar (lines, headings, bullets, dates) is ``memory.markdown``'s.
    """
    hint = kind_hint or _kind_from_path(Path(path))
    documents: list[Document] = []
    for section in markdown.iter_sections(text):
        entries = tuple([_make_entry(item) for item in section.items()])
        if section.title is None and not entries:
            continue
        title = section.title or ""
        dates = [entry.date for entry in entries if entry.date is not None]
        section_date = max(dates) if dates else markdown.leading_date(title) or default_date
        documents.append(
            Document(
                path=str(path),
                title=title,
                kind=_kind_from_title(title, hint),
                position=len(documents),
                line=section.line,
                text="\n".join(section.lines).strip("\n"),
                entries=entries,
                date=section_date,
            )
        )
    return documents


def _make_entry(item: markdown.Item) -> Entry:
    text, when = markdown.split_date(item.text)
    return Entry(text=text, line=item.line, date=when)


def _kind_from_path(path: Path) -> str:
    name = path.name.lower()
    if name.startswith("notes"):
        return "notes"
    if name.startswith("checkpoint"):
        return "checkpoint"
    return "other"


def _kind_from_title(title: str, hint: str) -> str:
    lowered = title.lower()
    for prefix, kind in _TITLE_KINDS.items():
        if lowered.startswith(prefix):
            return kind
    return hint if hint in DECAY_HALF_LIFE_DAYS else "other"


def parse_query(query: str, mode: TokenizerMode = "bigram") -> list[list[str]]:
    """OR phrases (split on ``|``) as de-duplicated term lists; empty phrases dropped."""
    phrases: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for phrase in query.split("|"):
        terms = list(dict.fromkeys(tokenize(phrase, mode)))
        key = frozenset(terms)
        if terms and key not in seen:
            seen.add(key)
            phrases.append(terms)
    return phrases


def decay_factor(kind: str, when: date | None, now: date) -> float:
    """``0.5 ** (age / half-life)``; 1.0 for undated sections, kinds that never decay, or future."""
    half_life = DECAY_HALF_LIFE_DAYS.get(kind, DECAY_HALF_LIFE_DAYS["other"])
    if half_life is None or when is None:
        return 1.0
    age = (now - when).days
    return 0.5 ** (age / half_life) if age > 0 else 1.0


# --------------------------------------------------------------------------- index


class DenseScorer(Protocol):
    """Similarity by meaning (``memory.semantic``): vectors for the indexed entries, one query
    vector per search."""

    name: str

    def index(self, texts: Sequence[str]) -> None:
        """Take the entries' texts, in unit order (vectors computed once per text)."""

    def embed(self, text: str) -> object | None:
        """The vector of a query (None when the model cannot be used). It reads nothing of
        the index, so callers may embed before taking a lock on it."""

    def similar(self, vector: object, also: Iterable[int]) -> dict[int, float] | None:
        """Cosine similarity of a query's ``vector`` with the entries at or above the scorer's
        floor, and with the entries ``also`` names (positions in the texts given to
        ``index``); None when the model cannot be used (search then goes by words alone)."""


@dataclass(slots=True)
class _FileState:
    kind_hint: str | None
    within: Path | None = None  # the file's real path must stay inside this directory
    write_once: bool = False  # never changed once written: not looked at again once read
    stamp: tuple[int, int] | None = None
    documents: list[Document] = field(default_factory=list)
    # per document: the indexed entries' positions and their term counts
    units: list[list[tuple[int, Counter[str]]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Unit:
    document: int
    entry: int


class MemoryIndex:
    """BM25 over the entries of a set of memory files, kept fresh by (mtime, size).

    ``search`` re-stats the registered files first (``refresh``), so a changed file is
    re-parsed before the next answer; a file added ``write_once`` (an archived checkpoint) is
    read once. A file that does not exist (yet) simply has no entries.
    With a ``dense`` scorer, entries also match by meaning (see ``search``).
    """

    def __init__(
        self,
        paths: Iterable[str | Path] = (),
        *,
        tokenizer: TokenizerMode = "bigram",
        k1: float = K1,
        b: float = B,
        dense: DenseScorer | None = None,
    ) -> None:
        self.mode: TokenizerMode = tokenizer
        self.k1 = k1
        self.b = b
        self.dense = dense
        self.parses = 0  # files parsed so far (tests watch this)
        self.rebuilds = 0  # global rebuilds so far
        self._files: dict[Path, _FileState] = {}
        self._documents: list[Document] = []
        self._units: list[_Unit] = []
        self._keys: list[str] = []  # per unit: its normalized text (one copy of each text)
        self._weights: list[float] = []  # per unit: its source's weight
        self._mass: list[float] = []  # per unit: the idf mass of its distinct terms
        self._root_mass: list[float] = []
        self._unseen_idf = 0.0
        self._postings: dict[str, tuple[list[int], list[float]]] = {}
        self._idf: dict[str, float] = {}
        self._decay: tuple[date, list[float]] | None = None
        self._dirty = False
        for path in paths:
            self.add(path)

    # ---- files

    def add(
        self,
        path: str | Path,
        kind_hint: str | None = None,
        within: Path | None = None,
        write_once: bool = False,
    ) -> None:
        """Watch a memory file (it may not exist yet); with ``within``, a file whose real path
        leaves that directory (a symlink out) is not read: it has no entries. A ``write_once``
        file is not looked at again once read."""
        key = Path(path)
        if key not in self._files:
            self._files[key] = _FileState(kind_hint=kind_hint, within=within, write_once=write_once)
            self._dirty = True

    def remove(self, path: str | Path) -> None:
        if self._files.pop(Path(path), None) is not None:
            self._dirty = True

    @property
    def paths(self) -> list[Path]:
        return sorted(self._files, key=str)

    @property
    def had_entries(self) -> bool:
        """Whether the index held any entry when it was last refreshed (no file is read)."""
        return bool(self._units)

    @property
    def documents(self) -> Sequence[Document]:
        """All indexed sections, ordered by path then position (the tie-break order)."""
        self.refresh()
        return self._documents

    @property
    def entries(self) -> list[tuple[Document, Entry]]:
        """Every indexed entry with its section, in index order."""
        self.refresh()
        return [(self._documents[u.document], self._entry(u)) for u in self._units]

    def refresh(self) -> bool:
        """Re-parse files whose (mtime, size) changed; rebuild if anything did. True if rebuilt."""
        changed = self._dirty
        for path, state in self._files.items():
            if state.write_once and state.stamp is not None:
                continue
            stamp = _stamp(path)
            if stamp != state.stamp:
                self._load(path, state, stamp)
                changed = True
        if changed:
            self._rebuild()
        return changed

    def _load(self, path: Path, state: _FileState, stamp: tuple[int, int] | None) -> None:
        state.stamp = stamp
        state.documents, state.units = [], []
        if stamp is None:
            return
        try:
            if state.within is None:
                text = path.read_text(encoding="utf-8", errors="replace")
            else:  # resolved: a symlink swapped in after the check is not followed
                fd = os.open(confine(path, state.within), os.O_RDONLY | os.O_NOFOLLOW)
                with open(fd, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
        except OutsideMemoryRoot as exc:
            log.warning("not searched: %s", exc)
            return
        except OSError:
            state.stamp = None
            return
        self.parses += 1
        modified = datetime.fromtimestamp(stamp[0] / 1e9).date()
        state.documents = parse_documents(path, text, state.kind_hint, default_date=modified)
        state.units = [self._entry_terms(document) for document in state.documents]

    def _entry_terms(self, document: Document) -> list[tuple[int, Counter[str]]]:
        if document.kind == "checkpoint" and not document.title:
            return []  # a checkpoint's preamble: its session id and capture time
        units = []
        for index, entry in enumerate(document.entries):
            terms = Counter(tokenize(entry.text, self.mode))
            if terms:
                units.append((index, terms))
        return units

    def _rebuild(self) -> None:
        documents: list[Document] = []
        units: list[_Unit] = []
        counts: list[Counter[str]] = []
        for path in self.paths:
            state = self._files[path]
            for document, entries in zip(state.documents, state.units, strict=True):
                for entry, terms in entries:
                    units.append(_Unit(len(documents), entry))
                    counts.append(terms)
                documents.append(document)
        self._documents, self._units = documents, units
        self._postings, self._idf = build_postings(counts, self.k1, self.b)
        self._mass = [sum(self._idf[term] for term in terms) for terms in counts]
        self._root_mass = [math.sqrt(mass) for mass in self._mass]
        self._unseen_idf = max(self._idf.values(), default=0.0)  # a term the memory lacks
        self._keys = [normalize(self._entry(unit).text) for unit in units]
        self._weights = [source_weight(documents[unit.document]) for unit in units]
        self._decay = None
        self._dirty = False
        self.rebuilds += 1
        if self.dense is not None:
            self.dense.index([self._entry(unit).text for unit in units])

    def _entry(self, unit: _Unit) -> Entry:
        return self._documents[unit.document].entries[unit.entry]

    # ---- search

    def search(
        self,
        query: str,
        limit: int = 5,
        now: date | datetime | None = None,
        *,
        floor: float = 0.0,
        meaning: str | None = None,
        vector: object | None = None,
    ) -> list[Hit]:
        """The best ``limit`` entries for ``query`` (``|`` separates OR phrases), one copy of
        each text (the best placed one).

        ``floor`` is the relevance floor: an entry is a match only when its similarity to the
        query reaches it (lexical: ``lexical_similarity``; with a dense scorer, also an entry
        whose meaning is at least the scorer's own floor; ``meaning`` is the text it embeds,
        ``query`` by default, or ``vector`` that text already embedded). Relevance then orders
        entries; the source's weight and the age decay only reorder near-equal ones.
        """
        self.refresh()
        phrases = parse_query(query, self.mode)
        if not self._units or limit <= 0 or not (phrases or self.dense):
            return []
        today = _as_date(now)
        text = meaning or query
        if self.dense is not None and vector is None and text.strip():
            vector = self.dense.embed(text)
        relevance = self._relevance(vector, phrases, floor)
        decay = self._decay_factors(today)
        weights = self._weights
        scored = [(-score * weights[unit] * decay[unit], unit) for unit, score in relevance.items()]
        # Copies are dropped after ranking: look at a few more than asked, all only if needed.
        ranked = heapq.nsmallest(limit * 4, scored)
        hits = self._distinct(ranked, limit)
        if len(hits) < limit < len(scored) and len(ranked) < len(scored):
            hits = self._distinct(sorted(scored), limit)
        return hits

    def _distinct(self, ranked: list[tuple[float, int]], limit: int) -> list[Hit]:
        hits: list[Hit] = []
        seen: set[str] = set()
        for negative, unit in ranked:
            key = self._keys[unit]
            if key in seen:
                continue
            seen.add(key)
            placed = self._units[unit]
            hits.append(Hit(self._documents[placed.document], self._entry(placed), -negative))
            if len(hits) == limit:
                break
        return hits

    def _relevance(
        self, vector: object | None, phrases: list[list[str]], floor: float
    ) -> dict[int, float]:
        """Per matching unit, its relevance (the best over OR phrases)."""
        best: dict[int, float] = {}
        for terms in phrases:
            for unit, similarity in self._lexical(terms).items():
                if similarity >= floor and similarity > best.get(unit, 0.0):
                    best[unit] = similarity
        if self.dense is not None and vector is not None:
            dense = self.dense.similar(vector, best)
            if dense is None:
                return best
            fused = {
                unit: DENSE_WEIGHT * max(value, 0.0) + (1 - DENSE_WEIGHT) * best.get(unit, 0.0)
                for unit, value in dense.items()
            }
            for unit, similarity in best.items():
                fused.setdefault(unit, similarity)  # an entry the scorer has no vector for yet
            return fused
        return best

    def raw_scores(self, query: str) -> list[float]:
        """Undecayed BM25 score of every entry, in ``entries`` order (for checks)."""
        self.refresh()
        best = [0.0] * len(self._units)
        for terms in parse_query(query, self.mode):
            for unit, score in self._bm25(terms).items():
                best[unit] = max(best[unit], score)
        return best

    def _bm25(self, terms: list[str]) -> dict[int, float]:
        scores: dict[int, float] = {}
        get = scores.get
        for term in terms:
            posting = self._postings.get(term)
            if posting is None:
                continue
            idf = self._idf[term]
            for unit, weight in zip(*posting, strict=True):
                scores[unit] = get(unit, 0.0) + idf * weight
        return scores

    def _lexical(self, terms: list[str]) -> dict[int, float]:
        """``lexical_similarity`` of each entry that holds one of ``terms``."""
        query_mass = sum(self._idf.get(term, self._unseen_idf) for term in terms)
        matched: dict[int, float] = {}
        get = matched.get
        for term in terms:
            posting = self._postings.get(term)
            if posting is not None:
                idf = self._idf[term]
                for unit in posting[0]:
                    matched[unit] = get(unit, 0.0) + idf
        # lexical_similarity inlined: this runs for every entry sharing a term
        mass, root_mass = self._mass, self._root_mass
        root_query = math.sqrt(query_mass)
        similarities: dict[int, float] = {}
        for unit, shared in matched.items():
            span = QUERY_SPAN * mass[unit]
            root = root_query if query_mass <= span else math.sqrt(span)
            similarities[unit] = min(1.0, shared / (root * root_mass[unit]))
        return similarities

    def _decay_factors(self, today: date) -> list[float]:
        """Per-unit freshness for ``today``, computed once per day and index version."""
        if self._decay is None or self._decay[0] != today:
            factors = []
            for unit in self._units:
                document = self._documents[unit.document]
                when = self._entry(unit).date or document.date
                factors.append(freshness(document.kind, when, today))
            self._decay = (today, factors)
        return self._decay[1]


def lexical_similarity(shared: float, query_mass: float, entry_mass: float) -> float:
    """The cosine of the query's and the entry's term sets, each term weighted by its idf:
    ``shared / sqrt(query_mass * entry_mass)``. 1.0 when they hold the same terms; low when
    the entry shares only a common word, or a small part of a long message."""
    if shared <= 0.0 or query_mass <= 0.0 or entry_mass <= 0.0:
        return 0.0
    return min(1.0, shared / math.sqrt(min(query_mass, QUERY_SPAN * entry_mass) * entry_mass))


def freshness(kind: str, when: date | None, now: date) -> float:
    """``1 - AGE_WEIGHT * (1 - decay_factor)``: an old entry loses at most ``AGE_WEIGHT`` of
    its score, so age orders near-equal matches but never beats a clearly better one."""
    return 1.0 - AGE_WEIGHT * (1.0 - decay_factor(kind, when, now))


def source_weight(document: Document) -> float:
    """Curated entries (MEMORY.md) count fully; raw captures and checkpoints' extractions,
    which hold the user's prompts as typed, a little less."""
    return 1.0 if document.kind in CURATED_KINDS and not _is_raw(document) else RAW_WEIGHT


def _is_raw(document: Document) -> bool:
    name = Path(document.path).name.lower()
    return name.startswith(("notes", "checkpoint"))


def build_postings(
    counts: Sequence[Counter[str]], k1: float = K1, b: float = B
) -> tuple[dict[str, tuple[list[int], list[float]]], dict[str, float]]:
    """Inverted index with BM25 term weights ``tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl))``
    per posting, and the Lucene idf per term."""
    lengths = [sum(count.values()) for count in counts]
    total = len(counts)
    average = (sum(lengths) / total) if total else 0.0
    postings: dict[str, tuple[list[int], list[float]]] = {}
    for doc, (count, length) in enumerate(zip(counts, lengths, strict=True)):
        norm = k1 * (1 - b + b * length / average) if average else k1
        for term, tf in count.items():
            posting = postings.get(term)
            if posting is None:
                posting = postings[term] = ([], [])
            posting[0].append(doc)
            posting[1].append(tf * (k1 + 1) / (tf + norm))
    idf = {term: lucene_idf(total, len(ids)) for term, (ids, _) in postings.items()}
    return postings, idf


def lucene_idf(total: int, containing: int) -> float:
    return math.log(1 + (total - containing + 0.5) / (containing + 0.5))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


def _as_date(now: date | datetime | None) -> date:
    if now is None:
        return date.today()
    return now.date() if isinstance(now, datetime) else now
