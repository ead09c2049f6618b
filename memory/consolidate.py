"""Fold what keeps coming back into MEMORY.md: recurring checkpoint lines and notes.

Checkpoints (``checkpoint.md``, ``sessions/*/checkpoint*.md``) list each compaction's
Decisions, Constraints and Gotchas; ``notes.md`` holds the user's keyword captures. A line that
recurs in several sessions is worth keeping for good, so ``consolidate`` groups near-duplicate
lines (the store's own features and similarity threshold), and every group seen in at least
``min_count`` different sources becomes one MEMORY.md entry through ``MemoryStore.store``, which
refuses what MEMORY.md already holds. A source is a session: a session's checkpoint.md, its
archived copies and its notes count once; a file that names no session is a source of its own.
notes.md names only the first 8 characters of a session id, so a note whose session prefixes a
checkpoint's session in the same group is counted with it (this can only under-count).
No model: sections come from the checkpoint heading, or for a note from its wording.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from memory.archive import CHECKPOINT_FILE, SESSIONS_DIR
from memory.checkpoint import NONE, classify
from memory.files import OutsideMemoryRoot, confine, read_text
from memory.search import parse_documents
from memory.store import (
    MEMORY_FILE,
    NOTES_FILE,
    SECTIONS,
    Entry,
    MemoryStore,
    features,
    normalize,
    similarity,
)

CHECKPOINT_SECTIONS = ("Decisions", "Constraints", "Gotchas")
MAX_ENTRY_CHARS = 300  # a longer note is split into sentences

_KIND_SECTIONS = {"decision": "Decisions", "constraint": "Constraints", "fix": "Gotchas"}
_CHECKPOINT_SESSION = re.compile(r"^# Checkpoint — (\S.*)$", re.MULTILINE)
_NOTE_SESSION = re.compile(r"\(session (\S+?)\)")
_NOTE_LEAD = re.compile(
    r"^(?:remember(?:\s+that)?|don'?t\s+forget(?:\s+that)?|note\s+to\s+self|important"
    r"|keep\s+in\s+mind(?:\s+that)?)\s*[:,\-]?\s*|^(?:记住|记得|别忘了|重要)[:\uff1a,\uff0c]?\s*",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n\u3002\uff01\uff1f]+[.!?\u3002\uff01\uff1f]*")


@dataclass(frozen=True, slots=True)
class Line:
    """One Decisions / Constraints / Gotchas line or note, and where it was read."""

    section: str
    text: str
    source: str  # the session id (a prefix of it for notes) or the file
    path: str


@dataclass(frozen=True)
class Candidate:
    """A group of near-duplicate lines: the entry it would make and where it recurs."""

    section: str
    text: str
    sources: tuple[str, ...]
    variants: tuple[str, ...]  # the distinct wordings, first seen first


@dataclass(frozen=True)
class Skipped:
    candidate: Candidate
    reason: str


@dataclass
class ConsolidationResult:
    """What was (or, in a dry run, would be) added to MEMORY.md, and what was not and why."""

    dry_run: bool
    added: list[Candidate] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def report(self) -> str:
        verb = "would add" if self.dry_run else "added"
        lines = [f"{verb} {len(self.added)}, skipped {len(self.skipped)}"]
        lines += [f"+ [{c.section}] {c.text} ({len(c.sources)} sources)" for c in self.added]
        lines += [f"- [{s.candidate.section}] {s.candidate.text}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def default_sources(memory_dir: Path) -> list[Path]:
    """A memory directory's checkpoints (latest and archived) and its notes.md; a file whose
    real path leaves the directory holding the memory directory is left out."""
    root = Path(memory_dir)
    sessions = sorted((root / SESSIONS_DIR).glob("*/checkpoint*.md"))
    found = []
    for path in [root / CHECKPOINT_FILE, *sessions, root / NOTES_FILE]:
        try:
            real = confine(path, root.parent)
        except OutsideMemoryRoot:
            continue
        if real.is_file():
            found.append(real)
    return found


def consolidate(
    store: MemoryStore,
    sources: list[Path],
    min_count: int = 2,
    dry_run: bool = True,
    today: date | str | None = None,
) -> ConsolidationResult:
    """Fold every group of near-duplicate lines seen in ``min_count`` sources into MEMORY.md.

    ``sources`` are checkpoint and notes files, or memory directories (read as
    ``default_sources``). With ``dry_run`` nothing is written: the result says what a real run
    would add, judged against MEMORY.md as it is now.
    """
    paths = _expand(sources)
    lines = [line for path in paths for line in read_lines(path)]
    result = ConsolidationResult(dry_run, sources=sorted({line.source for line in lines}))
    existing = store.list()
    for candidate in group(lines, store.threshold):
        if len(candidate.sources) < min_count:
            reason = f"seen in {len(candidate.sources)} source(s), fewer than {min_count}"
            result.skipped.append(Skipped(candidate, reason))
            continue
        if dry_run:
            duplicate = _duplicate_reason(candidate, existing, store.threshold)
            if duplicate is None:
                result.added.append(candidate)
                existing.append(Entry(candidate.section, candidate.text))
            else:
                result.skipped.append(Skipped(candidate, duplicate))
            continue
        stored = store.store(candidate.section, candidate.text, today)
        if stored.stored:
            result.added.append(candidate)
        else:
            result.skipped.append(Skipped(candidate, stored.reason))
    return result


def _expand(sources: Iterable[Path]) -> list[Path]:
    paths: list[Path] = []
    for source in sources:
        found = default_sources(source) if Path(source).is_dir() else [Path(source)]
        paths += [path for path in found if path.name != MEMORY_FILE and path not in paths]
    return paths


def read_lines(path: Path) -> list[Line]:
    """The Decisions / Constraints / Gotchas lines of a checkpoint, or the notes of notes.md."""
    text = read_text(path)
    if path.name.lower().startswith("notes"):
        return _note_lines(path, text)
    session = _CHECKPOINT_SESSION.search(text)
    if session is not None:
        source = session[1].strip()
    elif path.parent.parent.name == "sessions":
        source = path.parent.name
    else:
        source = str(path)
    lines: list[Line] = []
    for document in parse_documents(path, text, kind_hint="checkpoint"):
        if document.title in CHECKPOINT_SECTIONS:
            for entry in document.entries:
                if entry.text and entry.text != NONE:
                    lines.append(Line(document.title, entry.text, source, str(path)))
    return lines


def _note_lines(path: Path, text: str) -> list[Line]:
    """Each note as one line (or its sentences, when long) in the section its wording suggests."""
    lines: list[Line] = []
    for document in parse_documents(path, text, kind_hint="notes"):
        session = _NOTE_SESSION.search(document.title)
        source = session[1] if session else f"{path}#{document.position}"
        body = " ".join(" ".join(entry.text for entry in document.entries).split())
        body = _NOTE_LEAD.sub("", body).strip()
        if not body:
            continue
        pieces = [body] if len(body) <= MAX_ENTRY_CHARS else _sentences(body)
        for piece in pieces:
            kind = classify(piece, from_user=True)
            section = _KIND_SECTIONS.get(kind or "", "Notes")
            lines.append(Line(section, piece, source, str(path)))
    return lines


def _sentences(text: str) -> list[str]:
    found = (_NOTE_LEAD.sub("", match.strip()).strip() for match in _SENTENCE.findall(text))
    return [sentence[:MAX_ENTRY_CHARS] for sentence in found if len(sentence) > 3]


def group(lines: list[Line], threshold: float) -> list[Candidate]:
    """Near-duplicate lines grouped (exact normalized match, or similarity >= threshold).

    Each line joins the group whose first line it resembles most; groups keep the order in
    which they were first seen. A group's section is the one most of its lines have (ties go
    to the earlier of SECTIONS, so Notes yields to a more specific section).
    """
    groups: list[list[Line]] = []
    heads: list[tuple[str, frozenset[str]]] = []
    for line in lines:
        key, mine = normalize(line.text), features(line.text)
        best, best_score = -1, 0.0
        for index, (head_key, head_features) in enumerate(heads):
            score = 1.0 if key == head_key else similarity(mine, head_features)
            if score > best_score:
                best, best_score = index, score
        if best >= 0 and best_score >= threshold:
            groups[best].append(line)
        else:
            groups.append([line])
            heads.append((key, mine))
    return [_candidate(members) for members in groups]


def _candidate(members: list[Line]) -> Candidate:
    counts = Counter(line.section for line in members)
    section = min(counts, key=lambda name: (-counts[name], SECTIONS.index(name)))
    variants: list[str] = []
    for line in members:
        if all(normalize(line.text) != normalize(seen) for seen in variants):
            variants.append(line.text)
    keys = list(dict.fromkeys(line.source for line in members))
    sources = tuple(k for k in keys if not any(o != k and o.startswith(k) for o in keys))
    return Candidate(section, members[0].text, sources, tuple(variants))


def _duplicate_reason(candidate: Candidate, existing: list[Entry], threshold: float) -> str | None:
    """Why ``MemoryStore.store`` would refuse the candidate, judged without writing."""
    key, mine = normalize(candidate.text), features(candidate.text)
    best, best_score = None, 0.0
    for entry in existing:
        if normalize(entry.text) == key:
            return f"exact duplicate of [{entry.id}] in {entry.section}: {entry.text!r}"
        score = similarity(mine, features(entry.text))
        if score > best_score:
            best, best_score = entry, score
    if best is not None and best_score >= threshold:
        return f"near-duplicate of [{best.id}] ({best_score:.2f} >= {threshold:.2f}): {best.text!r}"
    return None
