"""Fixtures: a fake upstream and the proxy, both on real loopback sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.app import STATE, ProxyState, create_app
from proxy.config import load_settings
from proxy.flow import Addon
from tests.fake_upstream import FakeUpstream
from tests.redis_server import RedisServer, redis_server_program

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CAPTURES = ROOT / "fixtures" / "opencode"
CORPUS = SHARED / "corpus" / "data"


@dataclass
class RunningProxy:
    url: str
    app: web.Application
    runner: web.AppRunner

    @property
    def state(self) -> ProxyState:
        return self.app[STATE]


@pytest.fixture
def opencode_home(tmp_path: Path) -> dict[str, Any]:
    """A project directory (a git root) and an environment whose OpenCode config dir (the
    global one) exists and is empty."""
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    xdg = tmp_path / "xdg"
    (xdg / "opencode").mkdir(parents=True)
    return {
        "project": project,
        "environ": {"XDG_CONFIG_HOME": str(xdg), "HOME": str(tmp_path)},
        "global": xdg / "opencode",
    }


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    server = await FakeUpstream().start()
    yield server
    await server.stop()


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def start_proxy(tmp_path: Path) -> AsyncIterator[ProxyFactory]:
    """Start the proxy with flags as keyword arguments (upstream=[...], read_timeout=...)."""
    runners: list[web.AppRunner] = []

    async def start(transforms: list[Addon] | None = None, **flags: object) -> RunningProxy:
        flags.setdefault("data_dir", str(tmp_path / "data"))
        settings = load_settings(flags, environ={})
        app = create_app(settings, transforms)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return RunningProxy(f"http://127.0.0.1:{port}", app, runner)

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def proxy(start_proxy: ProxyFactory, upstream: FakeUpstream) -> RunningProxy:
    """The proxy with the fake upstream as default (/v1) and as 'anthropic' and 'openai'."""
    return await start_proxy(
        upstream=[
            f"{upstream.url}/v1",
            f"anthropic={upstream.url}/v1",
            f"openai={upstream.url}/v1",
        ]
    )


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


REDIS_PASSWORD = "replica-secret-7f3a"  # never in a message, a page or a log


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A real, password-protected Redis server of the test's own (tests/redis_server.py)."""
    running = RedisServer(redis_server_program(), tmp_path / "redis", REDIS_PASSWORD)
    running.directory.mkdir()
    yield running.start()
    running.stop()
