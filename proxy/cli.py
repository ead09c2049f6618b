"""The ``deepmem`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
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


async def _serve(settings: Settings) -> None:
    log = logging.getLogger("deepmem")
    runner = web.AppRunner(create_app(settings), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        routes = ", ".join(f"/{u.prefix}/ -> {u.url}" for u in settings.upstreams)
        log.info(
            "deepmem %s listening on http://%s:%d (%s)",
            __version__,
            settings.host,
            settings.port,
            routes,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("deepmem stopping")
    finally:
        await runner.cleanup()


def serve(settings: Settings) -> int:
    configure_logging(settings.log_level, settings.log_format)
    asyncio.run(_serve(settings))
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
