"""The ``deepmem`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from proxy import __version__
from proxy.app import create_app
from proxy.config import ENV_PREFIX, ConfigError, Settings, add_arguments, load_settings
from proxy.logs import configure_logging

DESCRIPTION = """\
deepmem: a context-compression proxy between a coding agent (OpenCode) and its LLM provider.

Point a provider's baseURL at the proxy: /v1/... goes to the default upstream, /NAME/... to
the upstream named NAME. Every setting can be given as a flag, as a DEEP_MEMORY_* environment
variable or in a TOML file (--config); flags win over the environment, the environment over
the file, the file over the defaults.
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
        "config file > defaults.",
    )
    add_arguments(serve)
    return parser


def serve(settings: Settings) -> int:
    configure_logging(settings.log_level, settings.log_format)
    log = logging.getLogger("deepmem")
    app = create_app(settings)
    routes = ", ".join(f"/{u.prefix}/ -> {u.url}" for u in settings.upstreams)
    log.info(
        "deepmem %s listening on http://%s:%d (%s)",
        __version__,
        settings.host,
        settings.port,
        routes,
    )
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        access_log=None,
        handler_cancellation=True,
        print=None,
        shutdown_timeout=5.0,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    flags = {key: value for key, value in vars(args).items() if key != "command"}
    try:
        settings = load_settings(flags)
    except ConfigError as exc:
        print(f"deepmem: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        try:
            return serve(settings)
        except OSError as exc:
            print(
                f"deepmem: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr
            )
            return 1
    parser.error(f"unknown command {args.command}")
    return 2
