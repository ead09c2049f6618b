"""The ``deepmem`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from memory.opencode_history import default_opencode_db
from proxy import __version__
from proxy.app import create_app
from proxy.cli_io import positive_int
from proxy.config import (
    ENV_PREFIX,
    OPTIONS_BY_NAME,
    ConfigError,
    Settings,
    add_arguments,
    load_settings,
    startup_warnings,
    unknown_environment,
)
from proxy.doctor import add_doctor_parser, run_doctor
from proxy.garbage import tune_garbage_collector
from proxy.history_cli import add_history_parser, run_history
from proxy.init_cli import add_init_parser, run_init
from proxy.logs import configure_logging, redact_text
from proxy.memory_cli import add_checkpoint_parser, add_memory_parser, run_checkpoint, run_memory

if TYPE_CHECKING:
    from proxy.replay import TranscriptReport

DESCRIPTION = """\
deepmem: a context-compression proxy between a coding agent (OpenCode) and its LLM provider.

Point a provider's baseURL at the proxy (`deepmem init` does it): /v1/... goes to the default
upstream, /NAME/... to the upstream named NAME. Every setting can be given as a flag, as a
DEEP_MEMORY_* environment variable or in a TOML file (--config); flags win over the
environment, the environment over the file, the file over the defaults.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepmem",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"deepmem {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Settings: flags > " + ENV_PREFIX + "* environment > "
        "config file > defaults. The dashboard and admin endpoints answer same-origin requests "
        "whose Host is loopback or in --allowed-hosts, from loopback or with --admin-token; "
        "request bodies to them must be JSON.",
    )
    add_arguments(serve)
    replay = commands.add_parser(
        "replay",
        help="replay transcripts through the pipeline and report what it saves",
        description="Replay transcripts (corpus format), or your own OpenCode sessions "
        "(--opencode), through the compression pipeline, one request per assistant message, "
        "and print context reduction, prompt-cache cost (in dollars at the model's list price "
        "when it has one, else in token units), prefix breaks, probe retention and pairing "
        "errors. Takes the same settings as serve.",
    )
    replay.add_argument(
        "target",
        metavar="FILE|DIR",
        nargs="?",
        default=None,
        help="a transcript or a directory of them (not with --opencode)",
    )
    replay.add_argument(
        "--opencode",
        metavar="DB",
        nargs="?",
        const="",
        default=None,
        help="replay sessions from OpenCode's own database (read-only), each in the wire "
        "format of its provider (anthropic: Anthropic Messages, openai: Responses, others: "
        f"chat); DB defaults to {default_opencode_db()}",
    )
    replay.add_argument(
        "--session",
        metavar="ID",
        action="append",
        default=None,
        help="with --opencode: replay this session (repeatable)",
    )
    replay.add_argument(
        "--last",
        metavar="N",
        type=positive_int,
        default=None,
        help="with --opencode: replay the N most recently updated sessions (default 5)",
    )
    replay.add_argument("--json", action="store_true", help="print machine-readable results")
    replay.add_argument(
        "--html",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write a self-contained HTML report (charts per transcript, probe tables, "
        "totals) to FILE",
    )
    replay.add_argument(
        "--dialect",
        choices=("chat", "anthropic", "responses"),
        default=None,
        help="send each request as OpenAI chat completions (the default for transcripts), "
        "Anthropic Messages or OpenAI Responses, as OpenCode does, through the same hook; "
        "with --opencode each session's provider chooses unless this is given",
    )
    add_arguments(replay)
    expand_cmd = commands.add_parser(
        "expand",
        help="print the original a marker's key stands for",
        description="Print the exact original bytes a [deep-memory: …] marker's key stands for, "
        "read from the data dir's state database, or from the Redis server --state-url names "
        "(the proxy need not run).",
    )
    expand_cmd.add_argument("key", help="ccr:<24 hex> or the 24 hex digits")
    expand_cmd.add_argument(
        "--start-line",
        type=int,
        default=None,
        help="first line: the line number shown in the file view (the file's own number), "
        "else a line of the original output (1-based)",
    )
    expand_cmd.add_argument(
        "--end-line", type=int, default=None, help="last line (inclusive), numbered the same way"
    )
    add_arguments(expand_cmd, ("data_dir", "state_url", "retention_days"))
    add_memory_parser(commands)
    add_checkpoint_parser(commands)
    add_history_parser(commands)
    add_init_parser(commands)
    add_doctor_parser(commands)
    _remember_parsers(parser)
    return parser


# Where argparse puts the (innermost) subcommand's parser, so that an unknown option is
# reported with that subcommand's usage, not the top-level one.
PARSER_KEY = "_deepmem_parser"
SETTING_KEYS = frozenset({"config", *OPTIONS_BY_NAME})


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(**{PARSER_KEY: sub})
                _remember_parsers(sub)


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``parser.parse_args``, except that unrecognized arguments are reported by the
    subcommand that was given them (``deepmem serve --bogus`` prints serve's usage)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        owner: argparse.ArgumentParser = getattr(args, PARSER_KEY, parser)
        owner.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


async def _serve(settings: Settings) -> None:
    log = logging.getLogger("deepmem")
    runner = web.AppRunner(create_app(settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    tune_garbage_collector()  # what start-up built stays out of every collection
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        routes = ", ".join(f"/{u.prefix}/ -> {u.public_url}" for u in settings.upstreams)
        log.info(
            "deepmem %s listening on http://%s:%d (%s)",
            __version__,
            settings.host,
            settings.port,
            routes,
        )
        log.info(
            "data dir %s; project memory: project_dir %s, allowed roots %s",
            settings.data_dir,
            settings.project_dir or "unset (taken from each request)",
            ", ".join(str(root) for root in settings.allowed_roots),
        )
        if settings.state_url:
            log.info("state shared on %s", redact_text(settings.state_url))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("deepmem stopping")
    finally:
        await runner.cleanup()  # counts the last requests: their access lines come here
    log.info("deepmem stopped")


def serve(settings: Settings) -> int:
    writer = configure_logging(settings.log_level, settings.log_format)
    try:
        for warning in startup_warnings(settings):
            logging.getLogger("deepmem").warning("%s", warning)
        asyncio.run(_serve(settings))
    finally:
        logging.getLogger().removeHandler(writer)
        writer.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "init":  # it may create the config file deepmem's settings name
        return run_init(args)
    flags = {key: value for key, value in vars(args).items() if key in SETTING_KEYS}
    if args.command == "doctor":  # it reports a configuration error as one of its findings
        return run_doctor(args, flags)
    try:
        settings = load_settings(flags)
    except ConfigError as exc:
        print(f"deepmem: {exc}", file=sys.stderr)
        return 2
    if args.command != "serve":  # serve logs these with the other start-up warnings
        for warning in unknown_environment(os.environ):
            print(f"deepmem: warning: {warning}", file=sys.stderr)
    if args.command == "serve":
        try:
            return serve(settings)
        except OSError as exc:
            print(
                f"deepmem: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr
            )
            return 1
    if args.command == "expand":
        return expand_key(args.key, settings, args.start_line, args.end_line)
    if args.command == "replay":
        return replay_command(args, settings)
    if args.command == "memory":
        return run_memory(args, settings)
    if args.command == "checkpoint":
        return run_checkpoint(args, settings)
    if args.command == "history":
        return run_history(args)
    parser.error(f"unknown command {args.command}")
    return 2


def expand_key(key: str, settings: Settings, start: int | None, end: int | None) -> int:
    from memory.state import StateUnavailable
    from proxy.expand import expand, range_error
    from proxy.stores import open_originals, state_db_path

    problem = range_error(start, end)
    if problem is not None:
        print(f"deepmem: {problem}", file=sys.stderr)
        return 2
    path = state_db_path(settings)
    where = redact_text(settings.state_url) if settings.state_url else str(path)
    if not settings.state_url and not path.exists():
        print(f"deepmem: no state database at {path} (is --data-dir right?)", file=sys.stderr)
        return 1
    try:
        result = expand(open_originals(settings), key, start, end)
    except StateUnavailable as exc:
        print(f"deepmem: cannot expand {key} from {where}: {exc}", file=sys.stderr)
        return 1
    if result.content is None:
        print(f"deepmem: {result.error}", file=sys.stderr)
        return 2 if result.problem == "bad_key" else 1
    sys.stdout.buffer.write(result.content)
    sys.stdout.buffer.flush()
    return 0


def replay_command(args: argparse.Namespace, settings: Settings) -> int:
    """``deepmem replay``: transcript files, or OpenCode's sessions with ``--opencode``."""
    if args.opencode is None:
        if args.target is None:
            return _usage("replay: give a transcript FILE|DIR, or --opencode [DB]")
        if args.session or args.last:
            return _usage("replay: --session and --last go with --opencode")
        return replay(
            Path(args.target),
            settings,
            as_json=args.json,
            html=args.html,
            dialect=args.dialect or "chat",
        )
    if args.target is not None:
        return _usage(
            f"replay: either a transcript FILE|DIR ({args.target}) or --opencode, not both "
            "(--opencode DB names the database)"
        )
    if args.session and args.last:
        return _usage("replay: --session or --last, not both")
    database = Path(args.opencode).expanduser() if args.opencode else default_opencode_db()
    return replay_opencode(
        database,
        settings,
        sessions=args.session or [],
        last=args.last,
        as_json=args.json,
        html=args.html,
        dialect=args.dialect,
    )


def _usage(message: str) -> int:
    print(f"deepmem: {message}", file=sys.stderr)
    return 2


def replay_opencode(
    database: Path,
    settings: Settings,
    *,
    sessions: list[str],
    last: int | None,
    as_json: bool,
    html: Path | None,
    dialect: str | None,
) -> int:
    from memory.opencode_history import OpenCodeHistoryError
    from proxy.replay_opencode import DEFAULT_LAST, load_sessions, replay_sessions

    if html is not None and not html.parent.is_dir():
        print(f"deepmem: cannot write {html}: no directory {html.parent}", file=sys.stderr)
        return 2
    try:
        transcripts = load_sessions(database, sessions, last or DEFAULT_LAST)
    except OpenCodeHistoryError as exc:
        print(f"deepmem: replay: {exc}", file=sys.stderr)
        return 1
    if not transcripts:
        print(f"deepmem: replay: no OpenCode sessions in {database}", file=sys.stderr)
        return 1
    reports = replay_sessions(transcripts, settings, dialect)
    return _report(reports, str(database), settings, as_json=as_json, html=html)


def _report(
    reports: list[TranscriptReport],
    target: str,
    settings: Settings,
    *,
    as_json: bool,
    html: Path | None,
) -> int:
    """Print a replay's results (text or ``--json``) and write its HTML report."""
    from proxy.replay import format_json, format_text

    if as_json:
        sys.stdout.buffer.write(format_json(reports) + b"\n")
    else:
        print(format_text(reports))
    if html is not None:
        from proxy.replay_report import write_html

        try:
            size = write_html(reports, html, target=target, settings=settings)
        except OSError as exc:
            print(f"deepmem: cannot write {html}: {exc}", file=sys.stderr)
            return 1
        # stdout stays pure JSON with --json; the note goes to stderr then
        print(
            f"HTML report written to {html} ({size:,} bytes)",
            file=sys.stderr if as_json else sys.stdout,
        )
    return 0


def replay(
    target: Path,
    settings: Settings,
    *,
    as_json: bool,
    html: Path | None = None,
    dialect: str = "chat",
) -> int:
    from proxy.replay import NotATranscript, run_replay

    if not target.exists():
        print(f"deepmem: {target} does not exist", file=sys.stderr)
        return 2
    if html is not None and not html.parent.is_dir():
        print(f"deepmem: cannot write {html}: no directory {html.parent}", file=sys.stderr)
        return 2
    try:
        reports = run_replay(target, settings, dialect)
    except NotATranscript as exc:
        print(f"deepmem: replay: {exc}", file=sys.stderr)
        return 2
    return _report(reports, str(target), settings, as_json=as_json, html=html)
