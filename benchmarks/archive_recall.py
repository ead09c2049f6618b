"""The memory stage's first request of a new session, in a project with many archived sessions.

Builds a project whose ``.deep-memory/sessions/`` holds ``--sessions`` archived sessions of
``--per-session`` checkpoints each (a checkpoint and its raw history, as ``memory.archive``
writes them), then times ``MemoryStage`` on the first request of new sessions, the way the
proxy calls it on the event loop:

- ``cold``: a fresh process state (new catalog), the first request of a session;
- ``warm``: the same catalog, the first request of each further new session (the median).

Then one more compaction is written (``write_checkpoint``, which prunes old sessions) and the
size of ``.deep-memory/`` and the number of sessions left are printed.

    python -m benchmarks.archive_recall [--sessions 300] [--per-session 5] [--rounds 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from compressors.view import Dialect
from compressors.wire import parse_conversation
from memory.archive import write_checkpoint
from memory.catalog import MemoryCatalog
from memory.checkpoint import Checkpoint
from memory.db import open_database
from memory.injection_memo import InjectionMemo
from proxy.config import load_settings
from proxy.flow import Addon, Flow
from proxy.memory_stage import build_memory_stage
from proxy.projects import IdentifyProject, ProjectResolver
from proxy.sessions import RequestKind

WORDS = [
    "proxy",
    "cache",
    "sqlite",
    "session",
    "token",
    "stream",
    "upstream",
    "header",
    "retry",
    "timeout",
    "config",
    "docker",
    "pytest",
    "asyncio",
    "marker",
    "compress",
    "dedup",
    "checkpoint",
    "memory",
    "search",
    "index",
    "provider",
    "request",
    "response",
    "latency",
    "port",
    "nginx",
    "deploy",
    "release",
    "branch",
    "commit",
    "schema",
    "migration",
    "fixture",
    "loader",
]


def checkpoint_text(rng: random.Random, sid: str, when: datetime) -> str:
    def lines(count: int) -> list[str]:
        return [" ".join(rng.choices(WORDS, k=8)) for _ in range(count)]

    checkpoint = Checkpoint(sid, when, 200, lines(3), lines(4), lines(2), lines(3), lines(6))
    return checkpoint.render()


def build_project(root: Path, sessions: int, per_session: int, rng: random.Random) -> Path:
    project = root / "home" / "app"
    sessions_dir = project / ".deep-memory" / "sessions"
    start = datetime(2026, 11, 1, tzinfo=UTC)
    raw = '{"messages": [' + ",".join(['{"role": "user", "content": "x"}'] * 200) + "]}"
    for s in range(sessions):
        sid = f"ses_{s:05d}"
        directory = sessions_dir / sid
        directory.mkdir(parents=True)
        for k in range(per_session):
            when = start + timedelta(minutes=s * 10 + k)
            stamp = when.strftime("%Y%m%dT%H%M%S%fZ")
            (directory / f"checkpoint-{stamp}.md").write_text(checkpoint_text(rng, sid, when))
            (directory / f"checkpoint-{stamp}.raw.json").write_text(raw)
    (project / ".deep-memory").mkdir(parents=True, exist_ok=True)
    memory_md = "## Decisions\n\n- Use SQLite in WAL mode for the state database [2026-10-02]\n"
    (project / ".deep-memory" / "MEMORY.md").write_text(memory_md)
    return project


def first_request_ms(addons: list[Addon], project: Path, session_id: str) -> float:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"<env>\n  Working directory: {project}\n</env>"},
            {"role": "user", "content": "the fixture loader fails after the sqlite migration"},
        ],
    }
    conversation = parse_conversation(Dialect.OPENAI_CHAT, body)
    flow = Flow(Dialect.OPENAI_CHAT, session_id, RequestKind.AGENT)
    started = time.perf_counter()
    for addon in addons:
        addon.request(conversation, flow)
    return (time.perf_counter() - started) * 1000


def du(path: Path) -> str:
    return subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True).stdout.split()[
        0
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--per-session", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = build_project(root, args.sessions, args.per_session, random.Random(7))
        settings = load_settings(
            {"data_dir": str(root / "data"), "allowed_roots": str(root / "home")}, environ={}
        )

        def new_stage() -> list[Addon]:
            catalog = MemoryCatalog(settings.data_dir)
            projects = ProjectResolver(None, settings.allowed_roots)
            stage = build_memory_stage(settings, catalog, InjectionMemo(open_database(None)))
            assert stage is not None
            return [IdentifyProject(projects), stage]

        cold = first_request_ms(new_stage(), project, "ses_cold")
        stage = new_stage()
        first_request_ms(stage, project, "ses_warmup")
        warm = [first_request_ms(stage, project, f"ses_new{n}") for n in range(args.rounds)]
        print(f"{args.sessions} archived sessions x {args.per_session} checkpoints")
        print(f"  cold first request of a new session: {cold:7.2f} ms")
        print(
            f"  warm first request of a new session: {statistics.median(warm):7.2f} ms median, "
            f"{max(warm):.2f} ms max over {args.rounds}"
        )
        memory_dir = project / ".deep-memory"
        print(f"  .deep-memory before one more compaction: {du(memory_dir)}")
        write_checkpoint(
            memory_dir, "ses_last", datetime.now(UTC), [{"role": "user", "content": "x"}], "# x\n"
        )
        left = sum(1 for p in (memory_dir / "sessions").iterdir() if p.is_dir())
        print(f"  after it: {du(memory_dir)}, {left} sessions kept")


if __name__ == "__main__":
    main()
