"""What the command-line subcommands share: errors, JSON output, numbers, confirmations."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def error(message: str, code: int) -> int:
    """Print ``deepmem: message`` to stderr; return the exit code."""
    print(f"deepmem: {message}", file=sys.stderr)
    return code


def emit_json(payload: Any) -> None:
    print(json.dumps(payload, ensure_ascii=False, indent=2))


def positive_int(raw: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def interactive() -> bool:
    return sys.stdin.isatty()


def confirm(question: str) -> bool:
    # The question goes to stderr so that stdout stays clean for --json.
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in ("y", "yes")


def go_ahead(count: int, force: bool, quiet: bool, verb: tuple[str, str], question: str) -> bool:
    """Whether to change ``count`` entries: with --force, or after a "y" on a terminal.

    Without a terminal and without --force nothing changes and stderr says that confirmation is
    needed (callers then exit with ``exit_code_when_not_done``). ``verb`` is the action and its past
    form: ("add", "added").
    """
    action, done = verb
    if count == 0:
        return False
    if force:
        return True
    if interactive():
        go = confirm(question)
        if not go and not quiet:
            print(f"nothing {done}")
        return go
    error(
        f"not {done}: confirmation needed and there is no terminal to ask on; "
        f"rerun with --force to {action} {count}",
        CONFIRMATION_NEEDED,
    )
    return False


CONFIRMATION_NEEDED = 2


def exit_code_when_not_done(count: int, force: bool) -> int:
    """0 when nothing was done because nothing matched or the user said no; 2 when it was left
    undone only because nobody could confirm (no terminal, no --force), so scripts notice."""
    return CONFIRMATION_NEEDED if count and not force and not interactive() else 0
