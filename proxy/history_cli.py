"""``deepmem history ...``: what earlier OpenCode sessions did, read from OpenCode's database.

The database is opened strictly read-only (see ``memory.opencode_history``): this command
never changes OpenCode's files, and OpenCode may keep running while it reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from memory.opencode_history import (
    MessageView,
    OpenCodeHistory,
    OpenCodeHistoryError,
    SessionInfo,
    default_opencode_db,
)
from proxy.cli_io import emit_json, error, positive_int

USAGE = 2
FAILED = 1

DESCRIPTION = """\
List the sessions, show the messages and search the text of earlier OpenCode sessions, read
from OpenCode's own database ($XDG_DATA_HOME/opencode/opencode.db, else
~/.local/share/opencode/opencode.db). The database is only read, never changed.
"""


def add_history_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = commands.add_parser(
        "history",
        help="read OpenCode's own session history: sessions|messages|search",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = history.add_subparsers(dest="history_command", metavar="SUBCOMMAND", required=True)

    sessions = _sub(subs, "sessions", "list sessions, most recently updated first")
    sessions.add_argument(
        "--directory",
        metavar="DIR",
        default=None,
        help="only sessions that ran in DIR or below it",
    )
    sessions.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="most sessions to show"
    )

    messages = _sub(subs, "messages", "show a session's messages in order")
    messages.add_argument("session_id", metavar="SESSION_ID", help="a session id (ses_…)")
    messages.add_argument(
        "--full", action="store_true", help="do not shorten tool calls and reasoning"
    )

    search = _sub(subs, "search", "search the text of messages, reasoning and tool calls")
    search.add_argument("query", help="words that must all occur (case-insensitive)")
    search.add_argument("--session", metavar="SESSION_ID", default=None, help="only this session")
    search.add_argument(
        "--limit", type=positive_int, default=20, metavar="N", help="most results to show"
    )


def _sub(
    subs: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str
) -> argparse.ArgumentParser:
    parser = subs.add_parser(name, help=summary, description=summary)
    parser.add_argument(
        "--opencode-db",
        metavar="PATH",
        type=Path,
        default=None,
        help=f"OpenCode's database (default: {default_opencode_db()})",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


# ---------------------------------------------------------------- running


def run_history(args: argparse.Namespace) -> int:
    path = (args.opencode_db or default_opencode_db()).expanduser()
    handler = HANDLERS[args.history_command]
    try:
        with OpenCodeHistory(path) as history:
            return handler(args, history)
    except OpenCodeHistoryError as exc:
        return error(str(exc), FAILED)


def _local(ms: int, seconds: bool = False) -> str:
    when = datetime.fromtimestamp(ms / 1000).astimezone()
    return when.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _directories(raw: str) -> list[str]:
    """DIR as typed (made absolute) and with symlinks resolved: OpenCode may store either."""
    given = Path(raw).expanduser().absolute()
    candidates = [str(given), str(given.resolve())]
    return list(dict.fromkeys(candidates))


def _sessions(args: argparse.Namespace, history: OpenCodeHistory) -> int:
    directories = _directories(args.directory) if args.directory else []
    sessions = history.sessions(directories, limit=args.limit)
    if args.json:
        emit_json(
            {
                "database": str(history.path),
                "directory": directories[0] if directories else None,
                "sessions": [session.to_json() for session in sessions],
            }
        )
        return 0
    if not sessions:
        where = f" for {directories[0]}" if directories else ""
        print(f"no OpenCode sessions{where} in {history.path}")
        return 0
    for session in sessions:
        print(_session_line(session))
    return 0


def _session_line(session: SessionInfo) -> str:
    parent = f"  (subagent of {session.parent_id})" if session.parent_id else ""
    return (
        f"{session.id}  {_local(session.time_updated)}  {session.message_count:>4} msgs  "
        f"{session.title}\n    {session.directory}{parent}"
    )


def _messages(args: argparse.Namespace, history: OpenCodeHistory) -> int:
    session = history.session(args.session_id)
    messages = history.messages(args.session_id, full=args.full)
    if args.json:
        emit_json(
            {
                "database": str(history.path),
                "session": session.to_json(),
                "messages": [message.to_json() for message in messages],
            }
        )
        return 0
    print(f"{session.id}  {session.title}")
    parent = f" · subagent of {session.parent_id}" if session.parent_id else ""
    print(
        f"{session.directory} · {session.message_count} messages · "
        f"{_local(session.time_created)} to {_local(session.time_updated)}{parent}"
    )
    for message in messages:
        print()
        print(_message_header(message))
        print(message.text or "(no text)")
    return 0


def _message_header(message: MessageView) -> str:
    label = message.role
    if message.summary:
        label += " (compaction summary)"
    details = [label]
    if message.role == "assistant":
        details += [item for item in (message.agent, message.model) if item]
    details.append(_local(message.time_created, seconds=True))
    return "── " + " · ".join(details) + f" ── {message.id}"


def _search(args: argparse.Namespace, history: OpenCodeHistory) -> int:
    if not args.query.split():
        return error("the search query is empty", USAGE)
    hits = history.search(args.query, session_id=args.session, limit=args.limit)
    if args.json:
        emit_json(
            {
                "database": str(history.path),
                "query": args.query,
                "session": args.session,
                "results": [hit.to_json() for hit in hits],
            }
        )
        return 0
    if not hits:
        print(f"no matches for {args.query!r} in {history.path}")
        return 0
    for hit in hits:
        print(
            f"{hit.session_id}  {_local(hit.time_created)}  {hit.role} {hit.part_type}  "
            f"{hit.message_id}  {hit.session_title}"
        )
        print(f"    {hit.snippet}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace, OpenCodeHistory], int]] = {
    "sessions": _sessions,
    "messages": _messages,
    "search": _search,
}
