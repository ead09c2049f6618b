"""Project memory on disk: `MEMORY.md` entries and `notes.md` keyword captures.

`MEMORY.md` holds `## Decisions / Constraints / Gotchas / Facts / Notes` with bullets
`- text [YYYY-MM-DD]`, read with the grammar of `memory.markdown` (the one search uses too).
`MemoryFile` keeps every line it does not understand (prose, comments, unknown sections, CRLF
endings), so a hand-edited file survives our edits. Every write goes through
`memory.files.locked_update`, which re-reads the file under a lock; every read and write
goes to the file's real path, refused when it leaves the project (`memory.files.memory_path`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from memory import markdown
from memory.files import locked_update, make_memory_dirs, memory_path, read_text
from memory.tokenize import tokenize

SECTIONS: tuple[str, ...] = ("Decisions", "Constraints", "Gotchas", "Facts", "Notes")
MEMORY_FILE = "MEMORY.md"
NOTES_FILE = "notes.md"
DEFAULT_SIMILARITY = 0.85

_NOTE_HASH = re.compile(r"\[(?P<hash>[0-9a-f]{8})\]$")  # at the end of a notes.md heading
_EDGE_PUNCT = " \t.,;:!?\u3002\u3001"  # after NFKC, fullwidth marks are ASCII


class Meaning(Protocol):
    """Compares texts by meaning (``memory.semantic.SemanticScorer``)."""

    duplicate_floor: float

    def most_similar(self, text: str, others: Sequence[str]) -> tuple[int, float]:
        """The position of the closest of ``others`` and its cosine (-1, 0.0 when none)."""


class MemoryStoreError(ValueError):
    """A request to the memory store that cannot be honoured (bad section, empty text)."""


# ---------------------------------------------------------------- text helpers


def normalize(text: str) -> str:
    """Whitespace collapsed, case folded, edge punctuation stripped: the exact-duplicate key."""
    collapsed = " ".join(unicodedata.normalize("NFKC", text).split()).casefold()
    return collapsed.strip(_EDGE_PUNCT)


@lru_cache(maxsize=8192)
def features(text: str) -> frozenset[str]:
    """The search tokenizer's tokens: words and identifiers, CJK characters and bigrams."""
    return frozenset(tokenize(normalize(text)))


def similarity(a: Iterable[str], b: Iterable[str]) -> float:
    """Jaccard similarity of two feature sets."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def entry_id(section: str, text: str) -> str:
    """A short stable id: 8 hex of a hash of section and normalized text."""
    return hashlib.sha256(f"{section}\n{normalize(text)}".encode()).hexdigest()[:8]


def clean_text(text: str) -> str:
    """One line of entry text; empty text is an error."""
    one_line = " ".join(text.split())
    if not one_line:
        raise MemoryStoreError("memory entry text is empty")
    return one_line


def check_section(section: str) -> str:
    if section not in SECTIONS:
        raise MemoryStoreError(f"unknown section {section!r}; use one of: {', '.join(SECTIONS)}")
    return section


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Entry:
    section: str
    text: str
    date: str | None = None
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", entry_id(self.section, self.text))

    def render(self) -> str:
        return f"- {self.text} [{self.date}]" if self.date else f"- {self.text}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Line:
    """One line of MEMORY.md: the raw text, and the entry it holds if it is one."""

    raw: str
    entry: Entry | None = None
    continuation: bool = False  # continues the entry above; removed with it


@dataclass
class Section:
    heading: str | None  # None for the preamble before the first `## `
    name: str | None
    lines: list[Line] = field(default_factory=list)


@dataclass
class MemoryFile:
    """A parsed MEMORY.md that renders back every line it did not change."""

    sections: list[Section]
    newline: str = "\n"

    @classmethod
    def parse(cls, text: str) -> MemoryFile:
        """Read `text` with the `memory.markdown` grammar; entries are bullets of SECTIONS."""
        return cls([_section(part) for part in markdown.parse(text)], markdown.newline_of(text))

    def render(self) -> str:
        out: list[str] = []
        for section in self.sections:
            if section.heading is not None:
                out.append(section.heading)
            out.extend(line.raw for line in section.lines)
        return self.newline.join(out) + self.newline if out else ""

    def entries(self) -> list[Entry]:
        return [line.entry for s in self.sections for line in s.lines if line.entry]

    def add(self, entry: Entry) -> None:
        """Add `entry` after the last non-blank line of its section (created if missing)."""
        section = self._section(entry.section)
        new = Line(entry.render(), entry)
        lines = section.lines
        last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].raw.strip()), -1)
        if last >= 0:
            lines.insert(last + 1, new)
            return
        trailing = [Line("")] if section is not self.sections[-1] else []
        section.lines = [Line(""), new, *trailing]

    def remove(self, ids: set[str]) -> list[Entry]:
        """Remove the entries with these ids, each with its continuation lines."""
        removed: list[Entry] = []
        for section in self.sections:
            kept = []
            dropping = False
            for line in section.lines:
                if line.entry and line.entry.id in ids:
                    removed.append(line.entry)
                    dropping = True
                elif not (dropping and line.continuation):
                    dropping = False
                    kept.append(line)
            section.lines = kept
        return removed

    def _section(self, name: str) -> Section:
        for section in self.sections:
            if section.name == name:
                return section
        return self._create_section(name)

    def _create_section(self, name: str) -> Section:
        if len(self.sections) == 1 and not any(line.raw.strip() for line in self.sections[0].lines):
            self.sections[0].lines = [Line("# Project Memory"), Line("")]
        new = Section(f"## {name}", name)
        order = SECTIONS.index(name)
        later = [
            i
            for i, s in enumerate(self.sections)
            if s.name in SECTIONS and SECTIONS.index(s.name) > order
        ]
        at = later[0] if later else len(self.sections)
        previous = self.sections[at - 1]
        ends_in_text = bool(previous.lines) and bool(previous.lines[-1].raw.strip())
        bare_heading = not previous.lines and previous.heading is not None
        if ends_in_text or bare_heading:
            previous.lines.append(Line(""))
        self.sections.insert(at, new)
        return new


def _section(part: markdown.Section) -> Section:
    """The editable form of a parsed section: every line kept, bullets of SECTIONS as entries.

    An entry's text is its bullet line only; its continuation lines stay as written (marked,
    so that removing the entry removes them too).
    """
    lines = [Line(raw) for raw in part.lines]
    name = part.title
    if name in SECTIONS:
        for item in part.items():
            if not item.bullet or not item.parts[0]:
                continue
            text, when = markdown.split_date(item.parts[0])
            first = item.line - part.start
            lines[first].entry = Entry(name, text, when.isoformat() if when else None)
            for line in lines[first + 1 : first + item.span]:
                line.continuation = True
    return Section(part.heading, name, lines)


def _note_hashes(text: str) -> list[str]:
    """The `[hash8]` tags of the notes.md headings in `text`."""
    titles = (section.title for section in markdown.iter_sections(text) if section.title)
    return [match["hash"] for title in titles if (match := _NOTE_HASH.search(title))]


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class StoreResult:
    stored: bool
    reason: str
    entry: Entry
    similar_to: Entry | None = None
    score: float = 0.0


@dataclass(frozen=True)
class ChangeResult:
    """What forget/cleanup matched, and whether it was removed (False for a preview)."""

    matched: list[Entry]
    removed: bool

    @property
    def count(self) -> int:
        return len(self.matched)


@dataclass(frozen=True)
class ImportResult:
    added: int
    duplicates: int
    skipped: list[StoreResult] = field(default_factory=list)


# ---------------------------------------------------------------- duplicates


class _Duplicates:
    """Exact and near duplicates among entries, found without comparing a new entry with
    every known one (an import of thousands of entries stays near-linear).

    Exact: by normalized text. Near: prefix filtering. Two feature sets with Jaccard
    similarity >= t share a token among the first ``|A| - ceil(t * |A|) + 1`` tokens of each
    (in one fixed order), so only the entries indexed under those tokens are scored; the
    most similar entry at or above the threshold is the same one a full scan finds.
    """

    def __init__(self, entries: Iterable[Entry], threshold: float) -> None:
        self.threshold = threshold
        self._entries: list[Entry] = []
        self._exact: dict[str, Entry] = {}
        self._postings: dict[str, list[int]] = {}
        self._featureless: list[int] = []  # similarity 1.0 with each other
        for entry in entries:
            self.add(entry)

    def _prefix(self, tokens: frozenset[str]) -> list[str]:
        ordered = sorted(tokens)
        if self.threshold <= 0:
            return ordered
        # The epsilon keeps float error (0.7 * 10 = 7.000000000000001) from shortening it.
        overlap = math.ceil(self.threshold * len(ordered) - 1e-9)
        return ordered[: len(ordered) - overlap + 1]

    def add(self, entry: Entry) -> None:
        index = len(self._entries)
        self._entries.append(entry)
        self._exact.setdefault(normalize(entry.text), entry)
        tokens = features(entry.text)
        if not tokens:
            self._featureless.append(index)
        for token in self._prefix(tokens):
            self._postings.setdefault(token, []).append(index)

    def exact(self, entry: Entry) -> Entry | None:
        return self._exact.get(normalize(entry.text))

    def most_similar(self, entry: Entry) -> tuple[Entry | None, float]:
        """The earliest most similar entry that may reach the threshold, and its score."""
        mine = features(entry.text)
        if mine:
            candidates = {i for t in self._prefix(mine) for i in self._postings.get(t, ())}
        else:
            candidates = set(self._featureless)
        best: Entry | None = None
        best_score = 0.0
        for index in sorted(candidates):
            other = self._entries[index]
            score = similarity(mine, features(other.text))
            if score > best_score:
                best, best_score = other, score
        return best, best_score


# ---------------------------------------------------------------- the store


class MemoryStore:
    """MEMORY.md and notes.md in one memory directory (a project's `.deep-memory/`)."""

    def __init__(
        self,
        root_dir: Path,
        similarity_threshold: float = DEFAULT_SIMILARITY,
        lock_dir: Path | None = None,
        meaning: Meaning | None = None,
    ) -> None:
        self.root = Path(root_dir)
        self.threshold = similarity_threshold
        self.lock_dir = lock_dir
        self.meaning = meaning  # with the embedding model: near-duplicates by meaning too

    @property
    def memory_path(self) -> Path:
        return self.root / MEMORY_FILE

    @property
    def notes_path(self) -> Path:
        return self.root / NOTES_FILE

    def load(self) -> MemoryFile:
        return MemoryFile.parse(self._read(MEMORY_FILE))

    def _read(self, name: str) -> str:
        return read_text(memory_path(self.root, name))

    # -- store

    def store(self, section: str, text: str, today: date | str | None = None) -> StoreResult:
        entry = Entry(check_section(section), clean_text(text), _day(today))
        results: list[StoreResult] = []

        def edit(old: str) -> str:
            doc = MemoryFile.parse(old)
            known = doc.entries()
            result = self._check(entry, _Duplicates(known, self.threshold))
            if result.stored and self.meaning is not None:
                result = self._check_meaning(entry, known, self.meaning)
            results.append(result)
            if result.stored:
                doc.add(entry)
                return doc.render()
            return old

        self._update(self.memory_path, edit)
        return results[-1]

    def _check(self, entry: Entry, known: _Duplicates, near: bool = True) -> StoreResult:
        other = known.exact(entry)
        if other is not None:
            where = f"in {other.section}" if other.section != entry.section else "already"
            reason = f"exact duplicate of [{other.id}] {where}: {other.text!r}"
            return StoreResult(False, reason, entry, other, 1.0)
        if near:
            best, score = known.most_similar(entry)
            if best is not None and score >= self.threshold:
                reason = (
                    f"near-duplicate of [{best.id}] ({score:.2f} >= {self.threshold:.2f}): "
                    f"{best.text!r}"
                )
                return StoreResult(False, reason, entry, best, score)
        return StoreResult(True, "stored", entry)

    def _check_meaning(self, entry: Entry, known: list[Entry], meaning: Meaning) -> StoreResult:
        best, score = meaning.most_similar(entry.text, [other.text for other in known])
        if best >= 0 and score >= meaning.duplicate_floor:
            other = known[best]
            reason = (
                f"same meaning as [{other.id}] ({score:.2f} >= {meaning.duplicate_floor:.2f}): "
                f"{other.text!r}"
            )
            return StoreResult(False, reason, entry, other, score)
        return StoreResult(True, "stored", entry)

    # -- read

    def list(self, section: str | None = None) -> list[Entry]:
        if section is not None:
            check_section(section)
        return [e for e in self.load().entries() if section is None or e.section == section]

    def get(self, entry_id_: str) -> Entry | None:
        return next((e for e in self.load().entries() if e.id == entry_id_), None)

    def stats(self) -> dict[str, Any]:
        entries = self.load().entries()
        dates = sorted(e.date for e in entries if e.date)
        return {
            "path": str(self.memory_path),
            "entries": len(entries),
            "sections": {name: sum(e.section == name for e in entries) for name in SECTIONS},
            "oldest": dates[0] if dates else None,
            "newest": dates[-1] if dates else None,
            "notes": len(_note_hashes(self._read(NOTES_FILE))),
            "bytes": len(self._read(MEMORY_FILE).encode()),
        }

    # -- forget / cleanup

    def forget(self, ids_or_query: str | Iterable[str], confirm: bool = False) -> ChangeResult:
        """Entries matching ids (or a text query); removed only when `confirm` is true."""
        matcher = _forget_matcher(ids_or_query)
        return self._remove_where(matcher, dry_run=not confirm)

    def cleanup(
        self,
        older_than_days: int | None = None,
        section: str | None = None,
        ids: Iterable[str] | None = None,
        dry_run: bool = True,
        today: date | str | None = None,
    ) -> ChangeResult:
        """Entries matching every given criterion; removed only when `dry_run` is false."""
        if older_than_days is None and section is None and ids is None:
            raise MemoryStoreError("cleanup needs older_than_days, section or ids")
        if section is not None:
            check_section(section)
        cutoff = None
        if older_than_days is not None:
            cutoff = (date.fromisoformat(_day(today)) - timedelta(days=older_than_days)).isoformat()
        wanted = set(ids) if ids is not None else None

        def matches(entry: Entry) -> bool:
            if section is not None and entry.section != section:
                return False
            if wanted is not None and entry.id not in wanted:
                return False
            return cutoff is None or (entry.date is not None and entry.date < cutoff)

        return self._remove_where(matches, dry_run)

    def _remove_where(self, matches: Callable[[Entry], bool], dry_run: bool) -> ChangeResult:
        if dry_run:
            return ChangeResult([e for e in self.load().entries() if matches(e)], False)
        removed: list[list[Entry]] = []

        def edit(old: str) -> str:
            doc = MemoryFile.parse(old)
            ids = {e.id for e in doc.entries() if matches(e)}
            removed.append(doc.remove(ids))
            return doc.render() if ids else old

        self._update(self.memory_path, edit)
        return ChangeResult(removed[-1], bool(removed[-1]))

    # -- export / import

    def export_json(self) -> str:
        data = {"version": 1, "entries": [e.to_dict() for e in self.list()]}
        return json.dumps(data, ensure_ascii=False, indent=2) + "\n"

    def export_markdown(self) -> str:
        doc = MemoryFile.parse("")
        for entry in self.list():
            doc.add(entry)
        return doc.render()

    def import_(self, data: str, force: bool = False) -> ImportResult:
        """Add entries from a JSON or Markdown export.

        Exact and near duplicates are skipped and counted; `force` adds near duplicates too
        (exact duplicates would share an id, so they are always skipped).
        """
        incoming = _parse_import(data)
        results: list[ImportResult] = []

        def edit(old: str) -> str:
            doc = MemoryFile.parse(old)
            skipped: list[StoreResult] = []
            added = 0
            known = _Duplicates(doc.entries(), self.threshold)
            for entry in incoming:
                result = self._check(entry, known, near=not force)
                if result.stored:
                    doc.add(entry)
                    known.add(entry)
                    added += 1
                else:
                    skipped.append(result)
            results.append(ImportResult(added, len(skipped), skipped))
            return doc.render() if added else old

        self._update(self.memory_path, edit)
        return results[-1]

    # -- notes

    def capture_note(self, session_id: str, text: str, when: datetime) -> bool:
        """Append a keyword capture to notes.md; False when the same text is already there."""
        body = text.strip()
        if not body:
            raise MemoryStoreError("note text is empty")
        digest = hashlib.sha256(normalize(body).encode()).hexdigest()[:8]
        heading = f"## {when.isoformat()} (session {session_id[:8]}) [{digest}]"
        added: list[bool] = []

        def edit(old: str) -> str:
            if digest in _note_hashes(old):
                added.append(False)
                return old
            added.append(True)
            newline = markdown.newline_of(old)
            prefix = old if not old or old.endswith(newline) else old + newline
            sep = newline if prefix else ""
            block = newline.join([heading, "", *body.splitlines()]) + newline
            return prefix + sep + block

        self._update(self.notes_path, edit)
        return added[-1]

    def notes(self) -> str:
        return self._read(NOTES_FILE)

    def _update(self, path: Path, edit: Callable[[str], str]) -> None:
        make_memory_dirs(self.root)
        locked_update(memory_path(self.root, path.name), edit, lock_dir=self.lock_dir)


# ---------------------------------------------------------------- helpers


def _day(value: date | str | None) -> str:
    if value is None:
        return date.today().isoformat()
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return date.fromisoformat(value).isoformat()


def _forget_matcher(ids_or_query: str | Iterable[str]) -> Callable[[Entry], bool]:
    if isinstance(ids_or_query, str):
        query = ids_or_query.strip()
        if not query:
            raise MemoryStoreError("forget needs ids or a query")
        needle = normalize(query)
        return lambda e: e.id == query or needle in normalize(e.text)
    ids = set(ids_or_query)
    if not ids:
        raise MemoryStoreError("forget needs ids or a query")
    return lambda e: e.id in ids


def _parse_import(data: str) -> list[Entry]:
    stripped = data.lstrip("\ufeff \t\r\n")
    if stripped.startswith(("{", "[")):
        try:
            payload = json.loads(stripped)
        except RecursionError as exc:  # the stdlib parser recurses once per nesting level
            raise MemoryStoreError("the JSON nests too deeply to be a memory export") from exc
        return _entries_from_json(payload)
    return MemoryFile.parse(data).entries()


def _entries_from_json(payload: Any) -> list[Entry]:
    items = payload.get("entries", []) if isinstance(payload, dict) else payload
    if not isinstance(items, list):
        raise MemoryStoreError("JSON import needs a list of entries or {'entries': [...]}")
    out: list[Entry] = []
    for item in items:
        if not isinstance(item, dict):
            raise MemoryStoreError(f"not an entry: {item!r}")
        section = check_section(str(item.get("section", "")))
        raw_date = item.get("date")
        out.append(Entry(section, clean_text(str(item.get("text", ""))), _opt_day(raw_date)))
    return out


def _opt_day(value: Any) -> str | None:
    return None if value in (None, "") else _day(str(value))
