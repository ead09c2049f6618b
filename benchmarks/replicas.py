"""Several ``deepmem serve`` processes sharing one Redis server, behind a round-robin balancer
that does not pin sessions (README.md, "Running several replicas"), on one machine.

    python -m benchmarks.replicas --port 8080 --replicas 3 -- --upstream https://api.openai.com/v1
    python -m benchmarks.replicas --port 8080 --replicas 1 -- ...   # the single-process control

Starts a Redis server of its own (Debian's ``redis-server`` on a free loopback port; not with
``--state-url``), N replicas on free loopback ports with ``--state-url`` and the arguments after
``--`` (one data dir for all of them, as replicas on one host share it: the memory files'
lock directory and the global memory live there; a temporary one unless those arguments give
``--data-dir``), waits until each answers ``/health``, then serves the balancer on
127.0.0.1:PORT: each request, whatever its method and path, goes to the next replica, its body
streamed up and the answer streamed back chunk by chunk, headers passed through except the
hop-by-hop ones. Prints one line when ready; SIGTERM or SIGINT stops the balancer, the replicas
and Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from benchmarks.overhead import free_port
from benchmarks.redis_server import RedisServer
from proxy.logs import redact_text

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",  # the replica's own, set by the client session
    }
)
READY_TIMEOUT = 30.0


@dataclass
class Replica:
    """One ``deepmem serve`` child process."""

    port: int
    data_dir: Path
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, characters: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:]


def split_data_dir(extra: Sequence[str]) -> tuple[Path | None, list[str]]:
    """The ``--data-dir`` the extra arguments give (if any), and the arguments without it."""
    rest: list[str] = []
    data_dir: Path | None = None
    words = iter(extra)
    for word in words:
        if word == "--data-dir":
            data_dir = Path(next(words))
        elif word.startswith("--data-dir="):
            data_dir = Path(word.partition("=")[2])
        else:
            rest.append(word)
    return data_dir, rest


def start_replica(
    data_dir: Path,
    state_url: str | None,
    extra: Sequence[str],
    log_path: Path,
    port: int | None = None,
) -> Replica:
    """``python -m proxy serve`` on a loopback port (a free one unless given), not yet ready;
    its state on ``state_url``, or in SQLite in its data dir without one."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "proxy", "serve",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--data-dir", str(data_dir),
        *(["--state-url", state_url] if state_url else []),
        *extra,
    ]  # fmt: skip
    with log_path.open("ab") as log:
        # A session of its own: a terminal's Ctrl-C reaches only us, and we stop it.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Replica(port, data_dir, command, log_path, process)


def stop_replica(replica: Replica, timeout: float = 10.0) -> None:
    if replica.process.poll() is None:
        replica.process.terminate()
    try:
        replica.process.wait(timeout)
    except subprocess.TimeoutExpired:
        replica.process.kill()
        replica.process.wait()


async def wait_ready(
    session: aiohttp.ClientSession, replica: Replica, timeout: float = READY_TIMEOUT
) -> None:
    """Until the replica answers ``/health`` (200, or 503 while something is degraded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(replica.url + "/health") as response:
                if response.status in (200, 503):
                    return
        except aiohttp.ClientError:
            pass
        if replica.process.poll() is not None:
            raise RuntimeError(
                f"replica on port {replica.port} exited with {replica.process.returncode}:\n"
                + replica.log_tail()
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica on port {replica.port} not ready in {timeout:g} s")
        await asyncio.sleep(0.05)


class Balancer:
    """Round robin over the replicas' URLs; ``targets`` may be changed while it runs."""

    def __init__(self, targets: Sequence[str]) -> None:
        self.targets = list(targets)
        self._turn = itertools.count()
        self._session: aiohttp.ClientSession | None = None

    def next_target(self) -> str:
        return self.targets[next(self._turn) % len(self.targets)]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.relay)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        target = self.next_target()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            upstream = await self._session.request(
                request.method,
                target + request.path_qs,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            return web.json_response(
                {"error": {"message": f"{target}: {exc}", "type": "bad_gateway", "code": 502}},
                status=502,
            )
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        return response


def redis_program() -> str:
    program = shutil.which("redis-server")
    if program is None:
        raise SystemExit("benchmarks.replicas needs Debian's redis-server (or --state-url)")
    return program


async def run(port: int, count: int, state_url: str | None, extra: Sequence[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="deepmem-replicas-") as directory:
        work = Path(directory)
        redis: RedisServer | None = None
        replicas: list[Replica] = []
        runner: web.AppRunner | None = None
        try:
            if state_url is None:
                (work / "redis").mkdir()
                redis = RedisServer(redis_program(), work / "redis").start()
                state_url = redis.url
            data_dir, rest = split_data_dir(extra)
            replicas = [
                start_replica(data_dir or work / "data", state_url, rest, work / f"replica{k}.log")
                for k in range(count)
            ]
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(wait_ready(session, replica) for replica in replicas))
            balancer = Balancer([replica.url for replica in replicas])
            runner = web.AppRunner(balancer.app(), access_log=None, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            ports = ", ".join(str(replica.port) for replica in replicas)
            print(
                f"balancer on http://127.0.0.1:{port}: round robin over {count} replicas "
                f"(ports {ports}), state on {redact_text(state_url)}",
                flush=True,
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            await stop.wait()
        finally:
            if runner is not None:
                await runner.cleanup()
            for replica in replicas:
                stop_replica(replica)
            if redis is not None:
                redis.stop()


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    words = list(argv)
    extra: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, extra = words[:cut], words[cut + 1 :]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replicas", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="the balancer's port")
    parser.add_argument("--replicas", type=int, default=2, help="deepmem processes (default 2)")
    parser.add_argument("--state-url", help="a Redis server to share instead of one of our own")
    args = parser.parse_args(words)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    return args, extra


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(run(args.port, args.replicas, args.state_url, extra))
    except RuntimeError as exc:
        print(f"benchmarks.replicas: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
