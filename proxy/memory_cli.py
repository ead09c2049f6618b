"""``deepmem memory ...``: the project memory from the command line, the proxy need not run.

Every subcommand calls the operation of ``proxy.memory_api`` that the HTTP endpoints and the
MCP tools call, so the three behave the same; this module only parses, confirms and prints.
``memory consolidate`` folds recurring checkpoint lines and notes into MEMORY.md
(``memory.consolidate``), and ``deepmem checkpoint show`` prints a compaction checkpoint
(``memory.archive``); both choose the project as the memory subcommands do.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from memory.archive import (
    CHECKPOINT_FILE,
    RAW_FILE,
    SESSIONS_DIR,
    ArchivedCheckpoint,
    latest_checkpoint,
    session_checkpoints,
    session_dirname,
)
from memory.catalog import ProjectMemory
from memory.checkpoint import Checkpoint
from memory.consolidate import Candidate, ConsolidationResult, consolidate, default_sources
from memory.files import memory_path
from memory.store import MEMORY_FILE, SECTIONS
from proxy import cli_io, memory_api
from proxy.cli_io import emit_json, error, go_ahead, positive_int
from proxy.config import Settings, add_arguments
from proxy.memory_api import MemoryCallError
from proxy.projects import ProjectChoice

# The settings the memory and checkpoint commands read (proxy.memory_api.memory_service).
MEMORY_SETTINGS = ("data_dir", "memory_dir_name", "memory_similarity", "memory_tokenizer")

USAGE = 2
FAILED = 1

DESCRIPTION = """\
Search, store, forget, list, export, import, clean up and consolidate memory entries directly
in the memory files (a project's .deep-memory/MEMORY.md, or the global memory under the data
dir); the proxy need not run. The project is --project DIR (default: the current directory)
or --global. Unlike the proxy, the command line does not check --allowed-roots: you are the
local user.
"""

PROJECT_HELP = (
    "project whose memory to use (default: the current directory); any existing directory "
    "works, --allowed-roots does not apply on the command line"
)


class CliError(Exception):
    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- parser


def add_memory_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    memory = commands.add_parser(
        "memory",
        help="search and edit the memory files: search|store|forget|list|stats|export|import|"
        "cleanup|consolidate",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = memory.add_subparsers(dest="memory_command", metavar="SUBCOMMAND", required=True)

    search = _sub(subs, "search", "search memory (the project's and the global)")
    search.add_argument("query", help="words to look for; '|' separates OR phrases")
    search.add_argument("--limit", type=int, default=5, help="most sections to show (1..50)")

    store = _sub(subs, "store", "store one entry in MEMORY.md")
    store.add_argument("section", help=f"one of {', '.join(SECTIONS)} (any case)")
    store.add_argument("text", nargs="+", help="the entry text (the words are joined)")

    forget = _sub(
        subs,
        "forget",
        "remove entries by id or by text",
        "Show the entries matching --ids or QUERY (a substring of the entry text, or an id), "
        "then delete exactly those after a 'y' on a terminal, or at once with --force. Without "
        "a terminal and without --force it only shows them and exits with status 2.",
    )
    forget.add_argument("query", nargs="?", default=None, help="text (or id) to match")
    forget.add_argument("--ids", default=None, metavar="ID,...", help="entry ids to remove")
    forget.add_argument("--force", action="store_true", help="delete without asking")

    listing = _sub(subs, "list", "list the entries of MEMORY.md")
    listing.add_argument("--section", default=None, help="only this section")

    _sub(subs, "stats", "count entries per section")

    export = _sub(subs, "export", "write all entries as JSON or Markdown")
    export.add_argument("--format", choices=("json", "markdown"), default="json")
    export.add_argument("--output", default=None, metavar="FILE", help="default: stdout")

    importing = _sub(
        subs,
        "import",
        "add entries from a JSON or Markdown export",
        "Add the entries of a JSON or Markdown export. Exact and near duplicates of existing "
        "entries are skipped and reported; --force adds near duplicates too (never exact ones).",
    )
    importing.add_argument("file", metavar="FILE|-", help="the export ('-': standard input)")
    importing.add_argument("--force", action="store_true", help="add near duplicates too")

    cleanup = _sub(
        subs,
        "cleanup",
        "remove entries by age, section or id",
        "Show the entries matching every given criterion, then remove them after a 'y' on a "
        "terminal, or at once with --force. --dry-run only shows them. Without a terminal and "
        "without --force it only shows them and exits with status 2.",
    )
    cleanup.add_argument(
        "--older-than", type=_days, default=None, metavar="DAYS", help="dated more than DAYS ago"
    )
    cleanup.add_argument("--section", default=None, help="in this section")
    cleanup.add_argument("--ids", default=None, metavar="ID,...", help="with these ids")
    cleanup.add_argument("--dry-run", action="store_true", help="show, never remove")
    cleanup.add_argument("--force", action="store_true", help="remove without asking")

    consolidate_cmd = _sub(
        subs,
        "consolidate",
        "fold recurring checkpoint decisions, constraints and gotchas into MEMORY.md",
        "Group the near-duplicate Decisions, Constraints and Gotchas lines of the checkpoints "
        "(checkpoint.md and sessions/*/checkpoint*.md) and the notes of notes.md; every group "
        "seen in at least --min-count sessions becomes one MEMORY.md entry, unless MEMORY.md "
        "already holds it. Shows what would be added, then adds it after a 'y' on a terminal, "
        "or at once with --force. Without a terminal and without --force it only shows it and "
        "exits with status 2; --dry-run only shows it.",
    )
    consolidate_cmd.add_argument(
        "--min-count",
        type=positive_int,
        default=2,
        metavar="N",
        help="sessions (or files) a line must recur in (default: 2)",
    )
    consolidate_cmd.add_argument("--dry-run", action="store_true", help="show, never add")
    consolidate_cmd.add_argument("--force", action="store_true", help="add without asking")

    # Last, so that each subcommand's own options come first in its --help.
    for parser in subs.choices.values():
        add_arguments(parser, MEMORY_SETTINGS)


def _sub(
    subs: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    parser = subs.add_parser(name, help=summary, description=description or summary)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--project", metavar="DIR", default=None, help=PROJECT_HELP)
    where.add_argument(
        "--global", dest="global_scope", action="store_true", help="use the global memory only"
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def add_checkpoint_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoint = commands.add_parser(
        "checkpoint",
        help="print a compaction checkpoint of a project: show",
        description=CHECKPOINT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = checkpoint.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND", required=True)
    show = _sub(
        subs,
        "show",
        "print the newest checkpoint",
        "Print the newest checkpoint.md of the project's memory directory (with --session, "
        "that session's newest archived checkpoint). --raw prints the raw history JSON saved "
        "next to it instead; --json prints {path, session, captured, text} of the file shown.",
    )
    show.add_argument(
        "--session", metavar="SID", default=None, help="that session's newest archived checkpoint"
    )
    show.add_argument("--raw", action="store_true", help="print the raw history JSON instead")
    add_arguments(show, MEMORY_SETTINGS)


CHECKPOINT_DESCRIPTION = """\
Print the checkpoints deepmem writes when OpenCode compacts a session: .deep-memory/checkpoint.md
(the last compaction), checkpoint.raw.json (its raw history) and the per-session archive under
.deep-memory/sessions/<sid>/; the proxy need not run. The project is --project DIR (default: the
current directory) or --global.
"""


def _days(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of days: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"days must not be negative, got {value}")
    return value


# ---------------------------------------------------------------- running


def run_memory(args: argparse.Namespace, settings: Settings) -> int:
    return _run(HANDLERS[args.memory_command], args, settings)


def run_checkpoint(args: argparse.Namespace, settings: Settings) -> int:
    return _run(CHECKPOINT_HANDLERS[args.checkpoint_command], args, settings)


def _run(handler: Handler, args: argparse.Namespace, settings: Settings) -> int:
    try:
        memory, choice = _choose(args, settings)
        return handler(args, memory, choice)
    except CliError as exc:
        return error(str(exc), exc.code)
    except MemoryCallError as exc:
        return error(str(exc), USAGE)
    except OSError as exc:
        return error(str(exc), FAILED)


def _choose(args: argparse.Namespace, settings: Settings) -> tuple[ProjectMemory, ProjectChoice]:
    service = memory_api.memory_service(settings)
    if args.global_scope:
        return service.choose(scope="global")
    raw = args.project
    path = Path.cwd() if raw is None else Path(raw).expanduser()
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise CliError(f"project directory {str(path)!r} does not exist") from None
    if not resolved.is_dir():
        raise CliError(f"project directory {str(path)!r} is not a directory")
    return service.catalog.get(resolved), ProjectChoice(resolved, "command line")


def _ids(raw: str) -> list[str]:
    ids = [part for part in raw.replace(",", " ").split() if part]
    if not ids:
        raise CliError("--ids needs at least one entry id")
    return ids


def _header(memory: ProjectMemory) -> str:
    if memory.project_dir is None:
        return f"global memory ({memory.store.root})"
    return f"project {memory.project_dir} ({memory.store.root})"


def _entry_line(entry: dict[str, Any]) -> str:
    date = f" [{entry['date']}]" if entry.get("date") else ""
    return f"[{entry['id']}] {entry['section']}: {entry['text']}{date}"


def _show_entries(entries: list[dict[str, Any]]) -> None:
    for entry in entries:
        print(f"  {_entry_line(entry)}")


# ---------------------------------------------------------------- subcommands


def _search(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    result = memory_api.search(memory, choice, args.query, args.limit)
    if args.json:
        emit_json(result)
        return 0
    if not result["results"]:
        print(f"no matches for {args.query!r} in {_header(memory)}")
        return 0
    for rank, hit in enumerate(result["results"], 1):
        date = f" [{hit['date']}]" if hit["date"] else ""
        print(f"{rank}. ({hit['section']}) {hit['text']}{date}")
        print(f"   {hit['path']}:{hit['line']}  (score {hit['score']:.4f})")
    return 0


def _store(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    result = memory_api.store(memory, choice, args.section, " ".join(args.text))
    if args.json:
        emit_json(result)
    elif result["stored"]:
        entry = result["entry"]
        print(f"stored [{entry['id']}] in {entry['section']} of {_header(memory)}")
    else:
        print(f"deepmem: not stored: {result['reason']}", file=sys.stderr)
    return 0 if result["stored"] else FAILED


def _forget(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    if (args.ids is None) == (args.query is None):
        raise CliError("forget needs either --ids ID,... or a QUERY (not both)")
    ids = _ids(args.ids) if args.ids is not None else None
    preview = memory_api.forget(memory, choice, ids, args.query, False)
    matched = [entry["id"] for entry in preview["matched"]]
    return _remove(
        args,
        preview,
        lambda: memory_api.forget(memory, choice, matched, None, True),
        "forget",
    )


def _cleanup(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    if args.older_than is None and args.section is None and args.ids is None:
        raise CliError("cleanup needs at least one of --older-than, --section, --ids")
    ids = _ids(args.ids) if args.ids is not None else None
    preview = memory_api.cleanup(memory, choice, args.older_than, args.section, ids, True)
    if args.dry_run:
        if args.json:
            emit_json(preview)
        else:
            _preview_text(preview, "cleanup")
            print("dry run: nothing removed")
        return 0
    matched = [entry["id"] for entry in preview["matched"]]
    return _remove(
        args,
        preview,
        lambda: memory_api.cleanup(memory, choice, args.older_than, args.section, matched, False),
        "cleanup",
    )


def _remove(
    args: argparse.Namespace,
    preview: dict[str, Any],
    delete: Callable[[], dict[str, Any]],
    verb: str,
) -> int:
    """Show ``preview``; run ``delete`` (limited to the previewed ids) if forced or confirmed."""
    count = len(preview["matched"])
    if args.json and not args.force and count and cli_io.interactive():
        print(json.dumps(preview["matched"], ensure_ascii=False, indent=2), file=sys.stderr)
    elif not args.json:
        _preview_text(preview, verb)
    go = go_ahead(count, args.force, args.json, ("delete", "deleted"), f"delete {_entries(count)}?")
    if not go:
        if args.json:
            emit_json(preview)
        return cli_io.exit_code_when_not_done(count, args.force)
    result = delete()
    if args.json:
        emit_json(result)
    else:
        print(f"deleted {_entries(len(result['matched']) if result['removed'] else 0)}")
    return 0


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"


def _preview_text(preview: dict[str, Any], verb: str) -> None:
    matched = preview["matched"]
    if not matched:
        print(f"{verb}: no entries match in {preview['memory_dir']}")
        return
    print(f"{verb}: {_entries(len(matched))} matched:")
    _show_entries(matched)


def _list(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    result = memory_api.list_entries(memory, choice, args.section)
    if args.json:
        emit_json(result)
    elif not result["entries"]:
        print(f"no entries in {_header(memory)}")
    else:
        for entry in result["entries"]:
            print(_entry_line(entry))
    return 0


def _stats(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    result = memory_api.stats(memory, choice)
    if args.json:
        emit_json(result)
        return 0
    sections = ", ".join(f"{name} {count}" for name, count in result["sections"].items())
    print(_header(memory))
    print(f"entries: {result['entries']} ({sections})")
    if result["oldest"]:
        print(f"dates: {result['oldest']} .. {result['newest']}")
    print(f"notes: {result['notes']}")
    print(f"MEMORY.md: {result['bytes']} bytes")
    return 0


def _export(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    text, content_type = memory_api.export(memory, args.format)
    if args.output is not None:
        try:
            Path(args.output).expanduser().write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc}", FAILED) from exc
    if args.json:
        emit_json(
            {
                "project": str(memory.project_dir) if memory.project_dir else None,
                "chosen_by": choice.source,
                "memory_dir": str(memory.store.root),
                "format": args.format,
                "content_type": content_type,
                "output": args.output,
                "content": None if args.output is not None else text,
            }
        )
    elif args.output is not None:
        print(f"exported {_header(memory)} to {args.output} ({args.format})")
    else:
        sys.stdout.write(text)
    return 0


def _import(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    try:
        if args.file == "-":
            data = sys.stdin.read()
        else:
            data = Path(args.file).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"cannot import {args.file}: not UTF-8 text ({exc.reason})", FAILED) from exc
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror or exc}") from exc
    try:
        result = memory_api.import_(memory, choice, data, args.force)
    except MemoryCallError as exc:
        raise CliError(str(exc), FAILED) from exc
    if args.json:
        emit_json(result)
        return 0
    print(f"imported {_entries(result['added'])} into {_header(memory)}")
    if result["duplicates"]:
        print(f"skipped {result['duplicates']} duplicate(s):")
        for skipped in result["skipped"]:
            print(f"  {_entry_line(skipped['entry'])}")
            print(f"    {skipped['reason']}")
        if not args.force and any(s["reason"].startswith("near") for s in result["skipped"]):
            print("(--force adds the near duplicates too)")
    return 0


def _consolidate(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    store = memory.store
    sources = default_sources(store.root)
    preview = consolidate(store, sources, args.min_count, dry_run=True)
    count = len(preview.added)
    if not args.json:
        _consolidation_text(preview, memory, len(sources), args.min_count)
    if args.dry_run:
        if args.json:
            emit_json(_consolidation_json(preview, memory, choice, args.min_count, False))
        else:
            print("dry run: nothing added")
        return 0
    if args.json and count and not args.force and cli_io.interactive():
        print(preview.report(), file=sys.stderr)
    question = f"add {_entries(count)} to {store.root / MEMORY_FILE}?"
    go = go_ahead(count, args.force, args.json, ("add", "added"), question)
    if not go:
        if args.json:
            emit_json(_consolidation_json(preview, memory, choice, args.min_count, False))
        return cli_io.exit_code_when_not_done(count, args.force)
    result = consolidate(store, sources, args.min_count, dry_run=False)
    if args.json:
        emit_json(_consolidation_json(result, memory, choice, args.min_count, True))
        return 0
    print(f"added {_entries(len(result.added))} to {store.root / MEMORY_FILE}")
    if [c.text for c in result.added] != [c.text for c in preview.added]:
        # MEMORY.md changed since the preview: say what happened instead.
        _consolidation_text(result, memory, len(sources), args.min_count)
    return 0


def _below(result: ConsolidationResult, min_count: int) -> int:
    return sum(1 for s in result.skipped if len(s.candidate.sources) < min_count)


def _consolidation_text(
    result: ConsolidationResult, memory: ProjectMemory, files: int, min_count: int
) -> None:
    """The report, without the lines seen too rarely (there are many; --json lists them)."""
    print(f"consolidate {_header(memory)}: {files} file(s), {len(result.sources)} source(s)")
    shown = ConsolidationResult(
        result.dry_run,
        result.added,
        [s for s in result.skipped if len(s.candidate.sources) >= min_count],
        result.sources,
    )
    print(shown.report())
    rare = _below(result, min_count)
    if rare:
        print(f"({rare} line(s) seen in fewer than {min_count} sources not shown)")


def _consolidation_json(
    result: ConsolidationResult,
    memory: ProjectMemory,
    choice: ProjectChoice,
    min_count: int,
    written: bool,
) -> dict[str, Any]:
    return {
        "project": str(memory.project_dir) if memory.project_dir else None,
        "chosen_by": choice.source,
        "memory_dir": str(memory.store.root),
        "min_count": min_count,
        "written": written,
        "sources": result.sources,
        "added": [_candidate(c) for c in result.added],
        "skipped": [{**_candidate(s.candidate), "reason": s.reason} for s in result.skipped],
    }


def _candidate(candidate: Candidate) -> dict[str, Any]:
    return {
        "section": candidate.section,
        "text": candidate.text,
        "sources": list(candidate.sources),
        "variants": list(candidate.variants),
    }


def _checkpoint_show(args: argparse.Namespace, memory: ProjectMemory, choice: ProjectChoice) -> int:
    memory_dir = memory.memory_dir or memory.global_dir
    if args.session is not None:
        if not args.session.strip():
            raise CliError("--session needs a session id")
        archives = session_checkpoints(memory_dir, args.session)
        if not archives:
            looked = memory_dir / SESSIONS_DIR / session_dirname(args.session)
            raise CliError(
                f"no checkpoint for session {args.session!r} in {looked}"
                + _known_sessions(memory_dir),
                FAILED,
            )
        checkpoint, raw = archives[0].checkpoint, archives[0].raw
    else:
        checkpoint = memory_path(memory_dir, CHECKPOINT_FILE)  # not through a symlink out
        raw = memory_path(memory_dir, RAW_FILE)
        if not checkpoint.is_file():
            # No checkpoint.md (deleted?): the newest archived one of any session.
            latest: ArchivedCheckpoint | None = latest_checkpoint(memory_dir)
            if latest is None:
                raise CliError(
                    f"no checkpoint in {memory_dir} (no {CHECKPOINT_FILE}, none archived "
                    f"under {SESSIONS_DIR}/)",
                    FAILED,
                )
            checkpoint, raw = latest.checkpoint, latest.raw
    path = raw if args.raw else checkpoint
    if not path.is_file():
        raise CliError(f"no checkpoint raw history at {path} (next to {checkpoint})", FAILED)
    text = path.read_text(encoding="utf-8", errors="replace")
    session, captured = _raw_meta(text) if args.raw else _checkpoint_meta(text)
    if args.json:
        emit_json({"path": str(path), "session": session, "captured": captured, "text": text})
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _checkpoint_meta(text: str) -> tuple[str | None, str | None]:
    try:
        parsed = Checkpoint.parse(text)
    except ValueError:
        return None, None
    return parsed.session_id, parsed.captured_at.isoformat()


def _raw_meta(text: str) -> tuple[str | None, str | None]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    session, captured = data.get("sessionID"), data.get("capturedAt")
    return (
        session if isinstance(session, str) else None,
        captured if isinstance(captured, str) else None,
    )


def _known_sessions(memory_dir: Path, most: int = 10) -> str:
    """A hint naming the sessions that do have archived checkpoints; empty if none do."""
    try:
        names = sorted(
            p.name
            for p in (memory_dir / SESSIONS_DIR).iterdir()
            if p.is_dir() and session_checkpoints(memory_dir, p.name)
        )
    except OSError:
        return ""
    if not names:
        return ""
    more = f", … {len(names) - most} more" if len(names) > most else ""
    return f" (sessions with checkpoints: {', '.join(names[:most])}{more})"


Handler = Callable[[argparse.Namespace, ProjectMemory, ProjectChoice], int]

HANDLERS: dict[str, Handler] = {
    "search": _search,
    "store": _store,
    "forget": _forget,
    "list": _list,
    "stats": _stats,
    "export": _export,
    "import": _import,
    "cleanup": _cleanup,
    "consolidate": _consolidate,
}

CHECKPOINT_HANDLERS: dict[str, Handler] = {"show": _checkpoint_show}
