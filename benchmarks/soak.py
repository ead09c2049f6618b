"""Soak: replay the corpus through a proxy for a while and watch its memory level off.

Starts ``benchmarks/fake_provider.py`` and ``python -m proxy serve`` as child processes (as
``benchmarks/overhead.py`` does), then replays every corpus transcript as an agent session,
a few sessions at a time: one streamed request per assistant turn (the history so far, as
OpenCode sends it), then a compaction request carrying the transcript. Every pass over the
corpus uses new session ids, so per-session state keeps arriving. The requests name a
project directory, so captures, recall and checkpoints touch memory files too.

Each minute it prints the proxy's resident memory, its open files and the size of its state
database; at the end, how much the RSS grew over the second half of the run.

    python -m benchmarks.soak                 # ten minutes
    python -m benchmarks.soak --minutes 2     # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.overhead import CORPUS, children, free_port, wait_ready
from proxy.replay_wire import request_body

PATH = "/v1/chat/completions"
DB_FILES = ("deepmem.sqlite3", "deepmem.sqlite3-wal", "deepmem.sqlite3-shm")
SUMMARIZER = "You are a helpful AI assistant tasked with summarizing conversations."


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    bytes_sent: int = 0
    sessions: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    minute: float
    rss_mb: float
    open_files: int
    db_mb: float
    requests: int
    sessions: int
    errors: int


def transcripts() -> list[dict[str, Any]]:
    paths = sorted(CORPUS.glob("*.json"))
    loaded = [orjson.loads(path.read_bytes()) for path in paths if path.name != "manifest.json"]
    usable = [t for t in loaded if isinstance(t, dict) and t.get("messages")]
    if not usable:
        raise SystemExit(f"no transcripts in {CORPUS} (set DEEPMEM_CORPUS)")
    return usable


def session_requests(
    transcript: dict[str, Any], project: Path, stream: bool = True, dialect: str = "chat"
) -> Iterator[bytes]:
    """One body per assistant turn (the history before it), then the compaction, in the wire
    format of ``dialect`` (a key of ``proxy.replay_wire.DIALECTS``)."""

    def wire(history: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
        return orjson.dumps(
            request_body(dialect, history, tools) | {"model": "soak", "stream": stream}
        )

    messages = list(transcript["messages"])
    if messages and messages[0].get("role") == "system":
        system = dict(messages[0])
        system["content"] = f"{system.get('content') or ''}\nWorking directory: {project}"
        messages[0] = system
    tools = transcript.get("tools") or [
        {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    ]
    for index, message in enumerate(messages):
        if message.get("role") == "assistant" and index > 0:
            yield wire(messages[:index], tools)
    lines = []
    for message in messages[1:]:
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        lines.append(f"[{message.get('role', '?').title()}]: {text}")
    compaction = [
        {"role": "system", "content": SUMMARIZER},
        {
            "role": "user",
            "content": "Here is the conversation so far:\n\n<conversation>\n"
            + "\n\n".join(lines)
            + "\n</conversation>\n\nSummarize it.",
        },
    ]
    yield wire(compaction, [])


async def replay(
    client: aiohttp.ClientSession,
    url: str,
    corpus: list[dict[str, Any]],
    project: Path,
    deadline: float,
    counts: Counts,
    worker: int,
    workers: int,
) -> None:
    for round_ in itertools.count():
        for index, transcript in enumerate(corpus):
            if index % workers != worker:
                continue
            session = f"soak-{round_}-{index}-{transcript.get('id', index)}"
            counts.sessions += 1
            for body in session_requests(transcript, project):
                if time.monotonic() >= deadline:
                    return
                try:
                    async with client.post(
                        url + PATH,
                        data=body,
                        headers={"x-session-id": session, "Content-Type": "application/json"},
                    ) as response:
                        await response.read()
                        counts.statuses[response.status] = (
                            counts.statuses.get(response.status, 0) + 1
                        )
                        counts.errors += response.status != 200
                except aiohttp.ClientError:
                    counts.errors += 1
                counts.requests += 1
                counts.bytes_sent += len(body)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def db_mb(data_dir: Path) -> float:
    return sum((data_dir / n).stat().st_size for n in DB_FILES if (data_dir / n).exists()) / 2**20


async def soak(minutes: float, workers: int, every: float) -> list[Sample]:
    corpus = transcripts()
    upstream_port, proxy_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="deepmem-soak-") as tmp:
        root = Path(tmp)
        data_dir, project = root / "data", root / "project"
        project.mkdir()
        with children(
            upstream_port, proxy_port, str(data_dir), ["--allowed-roots", str(root)]
        ) as procs:
            url = f"http://127.0.0.1:{proxy_port}"
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_read=120)
            ) as client:
                await wait_ready(client, f"http://127.0.0.1:{upstream_port}/health", procs[0])
                await wait_ready(client, url + "/health", procs[1])
                return await _measure(
                    client, url, corpus, project, data_dir, procs[1], minutes, workers, every
                )


async def _measure(
    client: aiohttp.ClientSession,
    url: str,
    corpus: list[dict[str, Any]],
    project: Path,
    data_dir: Path,
    proxy: subprocess.Popen[bytes],
    minutes: float,
    workers: int,
    every: float,
) -> list[Sample]:
    counts = Counts()
    started = time.monotonic()
    deadline = started + minutes * 60
    samples = [Sample(0, rss_mb(proxy.pid), open_files(proxy.pid), db_mb(data_dir), 0, 0, 0)]
    _print_header()
    _print(samples[0])
    tasks = [
        asyncio.create_task(replay(client, url, corpus, project, deadline, counts, w, workers))
        for w in range(workers)
    ]
    for tick in itertools.count(1):
        wake = started + tick * every
        if wake > deadline + 1:
            break
        done, _ = await asyncio.wait(tasks, timeout=max(0.0, wake - time.monotonic()))
        for task in done:
            task.result()  # a crash of the replay ends the run
        if proxy.poll() is not None:
            raise SystemExit(f"the proxy exited with {proxy.returncode}")
        sample = Sample(
            round(tick * every / 60, 2),
            rss_mb(proxy.pid),
            open_files(proxy.pid),
            db_mb(data_dir),
            counts.requests,
            counts.sessions,
            counts.errors,
        )
        samples.append(sample)
        _print(sample)
    await asyncio.gather(*tasks)
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(counts.statuses.items()))
    print(
        f"\n{counts.requests} requests ({counts.bytes_sent / 2**20:.0f} MiB), statuses {statuses}"
    )
    return samples


def _print_header() -> None:
    print(
        f"{'minute':>6} {'RSS MiB':>8} {'open files':>10} {'state db MiB':>12} "
        f"{'requests':>9} {'sessions':>9} {'errors':>7}"
    )


def _print(sample: Sample) -> None:
    print(
        f"{sample.minute:>6g} {sample.rss_mb:>8.1f} {sample.open_files:>10} {sample.db_mb:>12.1f} "
        f"{sample.requests:>9} {sample.sessions:>9} {sample.errors:>7}",
        flush=True,
    )


def verdict(samples: list[Sample]) -> str:
    """RSS growth over the second half of the run, against the first half."""
    if len(samples) < 3:
        return "too short to tell whether RSS levels off"
    middle = samples[len(samples) // 2]
    first = middle.rss_mb - samples[0].rss_mb
    second = samples[-1].rss_mb - middle.rss_mb
    return (
        f"RSS grew {first:+.1f} MiB in the first half (minutes 0-{middle.minute}) and "
        f"{second:+.1f} MiB in the second (minutes {middle.minute}-{samples[-1].minute})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to replay")
    parser.add_argument("--sessions", type=int, default=4, help="sessions replayed at once")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    args = parser.parse_args()
    samples = asyncio.run(soak(args.minutes, args.sessions, args.every))
    print(verdict(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
