"""BM25 search over project memory: every ``## `` section of every memory file is a document.

Files: ``MEMORY.md`` (``## Decisions / Constraints / Gotchas / Facts / Notes``, bullets
``- text [YYYY-MM-DD]``), ``notes.md`` (``## <ISO> (session <sid8>) [<hash8>]`` captures) and
checkpoints (``## User Intent / Decisions / Constraints / Gotchas / File Changes``).

Ranking
- BM25 with k1 = 1.5, b = 0.75 and the non-negative Lucene idf
  ``log(1 + (N - n + 0.5) / (n + 0.5))`` (rank-bm25's ``BM25Okapi`` floors negative idf with an
  epsilon instead; the scores here equal ``BM25Okapi``'s with this idf, which the tests check).
- Query terms are de-duplicated. ``|`` separates OR phrases; a document's score is the **max**
  over phrases, not the sum: an OR lists alternatives (synonyms, two languages), so a section
  that matches one alternative well must not lose to one that matches several weakly, and
  writing the same idea twice must not double a section's score.
- Age decay: ``score * 0.5 ** (age_days / half_life)`` with the half-life of the section's kind
  (``DECAY_HALF_LIFE_DAYS``: Constraints never decay, Decisions 180 days, Gotchas 90, Facts 60,
  Notes / checkpoint / other sections 30). A section's date is its newest entry date, else the
  date in its heading (notes.md), else the file's modification date.
- Ties are ordered by file path, then position in the file, so results are deterministic.

Each hit also carries the section's matching entries (bullets / lines), best first, so callers
can show the lines that matched rather than a whole section.

Speed: an inverted index (term -> postings with precomputed BM25 term weights) means a query
touches only its own terms' postings. Files are re-parsed only when their (mtime, size)
changes; the global statistics (N, average length, idf) are then recomputed from cached counts.
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

from memory import markdown
from memory.files import OutsideMemoryRoot, confine
from memory.tokenize import TokenizerMode, tokenize

log = logging.getLogger("deepmem.memory")

K1 = 1.5
B = 0.75

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
    document: Document
    score: float
    entries: tuple[Entry, ...]  # the section's matching entries, best first

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


def document_terms(document: Document, mode: TokenizerMode = "bigram") -> list[str]:
    """The tokens a document is indexed under: its title and its entries' text."""
    return tokenize(document.title, mode) + [
        token for entry in document.entries for token in tokenize(entry.text, mode)
    ]


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


@dataclass(slots=True)
class _FileState:
    kind_hint: str | None
    within: Path | None = None  # the file's real path must stay inside this directory
    stamp: tuple[int, int] | None = None
    documents: list[Document] = field(default_factory=list)
    counts: list[Counter[str]] = field(default_factory=list)
    # per document: term -> indexes of the entries containing it
    entry_postings: list[dict[str, list[int]]] = field(default_factory=list)


class MemoryIndex:
    """BM25 over the ``## `` sections of a set of memory files, kept fresh by (mtime, size).

    ``search`` re-stats the registered files first (``refresh``), so a changed file is
    re-parsed before the next answer. A file that does not exist (yet) simply has no sections.
    """

    def __init__(
        self,
        paths: Iterable[str | Path] = (),
        *,
        tokenizer: TokenizerMode = "bigram",
        k1: float = K1,
        b: float = B,
    ) -> None:
        self.mode: TokenizerMode = tokenizer
        self.k1 = k1
        self.b = b
        self.parses = 0  # files parsed so far (tests watch this)
        self.rebuilds = 0  # global rebuilds so far
        self._files: dict[Path, _FileState] = {}
        self._documents: list[Document] = []
        self._entry_postings: list[dict[str, list[int]]] = []
        self._postings: dict[str, tuple[list[int], list[float]]] = {}
        self._idf: dict[str, float] = {}
        self._decay: tuple[date, list[float]] | None = None
        self._dirty = False
        for path in paths:
            self.add(path)

    # ---- files

    def add(
        self, path: str | Path, kind_hint: str | None = None, within: Path | None = None
    ) -> None:
        """Watch a memory file (it may not exist yet); with ``within``, a file whose real path
        leaves that directory (a symlink out) is not read: it has no sections."""
        key = Path(path)
        if key not in self._files:
            self._files[key] = _FileState(kind_hint=kind_hint, within=within)
            self._dirty = True

    def remove(self, path: str | Path) -> None:
        if self._files.pop(Path(path), None) is not None:
            self._dirty = True

    @property
    def paths(self) -> list[Path]:
        return sorted(self._files, key=str)

    @property
    def documents(self) -> Sequence[Document]:
        """All indexed sections, ordered by path then position (the tie-break order)."""
        self.refresh()
        return self._documents

    def refresh(self) -> bool:
        """Re-parse files whose (mtime, size) changed; rebuild if anything did. True if rebuilt."""
        changed = self._dirty
        for path, state in self._files.items():
            stamp = _stamp(path)
            if stamp != state.stamp:
                self._load(path, state, stamp)
                changed = True
        if changed:
            self._rebuild()
        return changed

    def _load(self, path: Path, state: _FileState, stamp: tuple[int, int] | None) -> None:
        state.stamp = stamp
        state.documents, state.counts, state.entry_postings = [], [], []
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
        state.counts = [Counter(document_terms(doc, self.mode)) for doc in state.documents]
        state.entry_postings = [self._entry_index(doc) for doc in state.documents]

    def _entry_index(self, document: Document) -> dict[str, list[int]]:
        postings: dict[str, list[int]] = {}
        for index, entry in enumerate(document.entries):
            for term in dict.fromkeys(tokenize(entry.text, self.mode)):
                postings.setdefault(term, []).append(index)
        return postings

    def _rebuild(self) -> None:
        documents: list[Document] = []
        counts: list[Counter[str]] = []
        entry_postings: list[dict[str, list[int]]] = []
        for path in self.paths:
            state = self._files[path]
            documents.extend(state.documents)
            counts.extend(state.counts)
            entry_postings.extend(state.entry_postings)
        self._documents, self._entry_postings = documents, entry_postings
        self._postings, self._idf = build_postings(counts, self.k1, self.b)
        self._decay = None
        self._dirty = False
        self.rebuilds += 1

    # ---- search

    def search(
        self,
        query: str,
        limit: int = 5,
        now: date | datetime | None = None,
        *,
        entries_per_hit: int = 3,
        min_coverage: float = 0.0,
    ) -> list[Hit]:
        """The best ``limit`` sections for ``query`` (``|`` separates OR phrases).

        ``min_coverage`` is a relevance floor: a section must hold query terms carrying at
        least that fraction of the phrase's idf mass (a term the index has never seen counts
        like the rarest one it has), so one word of a long message matches nothing.
        """
        self.refresh()
        phrases = parse_query(query, self.mode)
        if not phrases or not self._documents or limit <= 0:
            return []
        today = _as_date(now)
        scores = self._phrase_max(phrases, min_coverage)
        decay = self._decay_factors(today)
        ranked = heapq.nlargest(
            limit,
            ((score * decay[doc], -doc) for doc, score in scores.items() if score > 0),
        )
        return [
            Hit(
                document=self._documents[-neg_doc],
                score=score,
                entries=self._best_entries(-neg_doc, phrases, today, entries_per_hit),
            )
            for score, neg_doc in ranked
        ]

    def raw_scores(self, query: str) -> list[float]:
        """Undecayed BM25 score of every document, in ``documents`` order (for checks)."""
        self.refresh()
        scores = self._phrase_max(parse_query(query, self.mode))
        return [scores.get(doc, 0.0) for doc in range(len(self._documents))]

    def _phrase_max(self, phrases: list[list[str]], min_coverage: float = 0.0) -> dict[int, float]:
        best: dict[int, float] = {}
        for terms in phrases:
            scores = self._score_terms(terms)
            if min_coverage > 0:
                floor = min_coverage * self._idf_mass(terms)
                covered = self._covered_mass(terms)
                scores = {doc: score for doc, score in scores.items() if covered[doc] >= floor}
            for doc, score in scores.items():
                if score > best.get(doc, 0.0):
                    best[doc] = score
        return best

    def _score_terms(self, terms: list[str]) -> dict[int, float]:
        scores: dict[int, float] = {}
        get = scores.get
        for term in terms:
            posting = self._postings.get(term)
            if posting is None:
                continue
            idf = self._idf[term]
            for doc, weight in zip(*posting, strict=True):
                scores[doc] = get(doc, 0.0) + idf * weight
        return scores

    def _idf_mass(self, terms: list[str]) -> float:
        """The query's idf mass; a term the memory never mentions counts like its rarest."""
        unseen = max(self._idf.values(), default=0.0)
        return sum(self._idf.get(term, unseen) for term in terms)

    def _covered_mass(self, terms: list[str]) -> dict[int, float]:
        """Per document, the idf mass of the query terms it contains."""
        covered: dict[int, float] = {}
        for term in terms:
            posting = self._postings.get(term)
            if posting is not None:
                idf = self._idf[term]
                for doc in posting[0]:
                    covered[doc] = covered.get(doc, 0.0) + idf
        return covered

    def _decay_factors(self, today: date) -> list[float]:
        """Per-document decay for ``today``, computed once per day and index version."""
        if self._decay is None or self._decay[0] != today:
            factors = [decay_factor(doc.kind, doc.date, today) for doc in self._documents]
            self._decay = (today, factors)
        return self._decay[1]

    def _best_entries(
        self, doc: int, phrases: list[list[str]], today: date, limit: int
    ) -> tuple[Entry, ...]:
        """Entries scored by the idf of the query terms they contain (max over phrases)."""
        if limit <= 0:
            return ()
        document, postings = self._documents[doc], self._entry_postings[doc]
        best: dict[int, float] = {}
        for terms in phrases:
            scores: dict[int, float] = {}
            for term in terms:
                for index in postings.get(term, ()):
                    scores[index] = scores.get(index, 0.0) + self._idf.get(term, 0.0)
            for index, score in scores.items():
                best[index] = max(best.get(index, 0.0), score)
        entries = document.entries

        def rank(index: int) -> float:
            when = entries[index].date or document.date
            return best[index] * decay_factor(document.kind, when, today)

        top = heapq.nlargest(limit, sorted(best), key=rank)
        return tuple(entries[index] for index in top)


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
