"""What the pipeline forwards, as one digest per request: proof that a refactor changed nothing.

    python -m benchmarks.replay_digests DIR --out digests.json
    python -m benchmarks.replay_digests DIR --compare digests.json

Every transcript of DIR is replayed in each wire format (chat, anthropic, responses) the way
``deepmem replay`` does it: request k is ``messages[:k]``, one session per transcript, through
the same rewrite hook and stores, each request followed by the work it deferred
(``Flow.defer``: compressions computed ahead), as the proxy runs it once the answer is out.
The digest of a request is the key scheme's hash of the exact bytes forwarded upstream.
``--compare`` replays again and lists every request whose digest differs from the recorded one
(exit status 1 when any does).

``--whole`` parses every request whole (no body cache: the full path of the compression stage,
without what a session's earlier requests left for its next one); the digests of a run with
and without it must be identical.

``--memory`` adds project memory to the request path, as the proxy runs it: each transcript
gets a fresh project whose ``MEMORY.md`` holds a few entries (English and Chinese) and whose
memory has an earlier session's checkpoint, and the request offers a ``memory_store`` tool,
so the stable block, recall, nudges, resume and checkpoints are all exercised. Captures are
off: a captured note carries the wall-clock time, and recall would show it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from compressors.markers import ccr_key
from memory.archive import write_checkpoint
from memory.checkpoint import Checkpoint
from proxy.addons import build_addons
from proxy.bodies import BodyCache
from proxy.config import Settings
from proxy.flow import Addon
from proxy.memory_api import memory_service
from proxy.pipeline import rewrite_request
from proxy.replay import load_transcript, transcript_files
from proxy.replay_wire import DIALECTS, request_body
from proxy.stores import open_stores

Digests = dict[str, dict[str, list[str]]]  # dialect -> transcript -> digest per request


PROJECT_MEMORY = """# Project Memory

## Decisions

- Run the test suite with pytest -q before every commit [2026-10-02]
- Errors are reported in the provider's error shape, never as a traceback [2026-09-12]

## Constraints

- Never change a file outside the repository
- 修改代码之前先阅读相关的测试文件

## Gotchas

- The fixture loader breaks when PYTHONHASHSEED is set; unset it first [2026-11-01]
- Import errors after a rename usually mean a stale __init__.py export [2026-11-10]
"""
MEMORY_STORE = {
    "type": "function",
    "function": {
        "name": "deepmem_memory_store",
        "description": "Store a memory entry",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


def memory_project(root: Path) -> Path:
    """A project with a small MEMORY.md and an earlier session's checkpoint."""
    project = root / "project"
    memory_dir = project / ".deep-memory"
    memory_dir.mkdir(parents=True)
    (memory_dir / "MEMORY.md").write_text(PROJECT_MEMORY, encoding="utf-8")
    earlier = Checkpoint(
        "earlier-session",
        datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
        40,
        intents=["Make the proxy fail open when the state database is locked"],
        decisions=["Keep the original bytes when anything of ours throws"],
        file_changes=["proxy/app.py (edited)"],
    )
    write_checkpoint(memory_dir, "earlier-session", earlier.captured_at, [], earlier.render())
    return project


def transcript_digests(
    path: Path, dialect: str, settings: Settings, memory: bool = False, whole: bool = False
) -> list[str]:
    data = load_transcript(path)
    messages = data["messages"]
    tools = data.get("tools") or []
    with tempfile.TemporaryDirectory() as scratch:
        if memory:
            root = Path(scratch)
            (root / "data").mkdir()  # the embedding cache's home
            settings = replace(
                settings,
                data_dir=root / "data",
                project_dir=memory_project(root),
                allowed_roots=(root,),
                memory_captures=False,
            )
            tools = [*tools, MEMORY_STORE]
        stores = open_stores(settings, in_memory=True)
        service = memory_service(settings) if memory else None
        addons = build_addons(settings, stores, service)
        return _digests(path, dialect, messages, tools, addons, whole)


def _digests(
    path: Path,
    dialect: str,
    messages: list[Any],
    tools: list[Any],
    addons: list[Addon],
    whole: bool,
) -> list[str]:
    headers = {"x-session-id": f"replay-{path.stem}"}
    # As the proxy parses: each request from where it differs; or each parsed whole.
    bodies = None if whole else BodyCache()
    digests: list[str] = []
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or k == 0:
            continue
        raw = orjson.dumps(request_body(dialect, messages[:k], tools))
        rewrite = rewrite_request(raw, DIALECTS[dialect], headers, addons, bodies=bodies)
        digests.append(ccr_key(rewrite.body.decode("utf-8", "surrogatepass")))
        for job in rewrite.flow.after if rewrite.flow is not None else ():
            job()  # what the proxy runs once the answer is out (compressions computed ahead)
    return digests


def corpus_digests(
    target: Path, settings: Settings, memory: bool = False, whole: bool = False
) -> Digests:
    paths = transcript_files(target)
    return {
        dialect: {
            path.stem: transcript_digests(path, dialect, settings, memory, whole) for path in paths
        }
        for dialect in DIALECTS
    }


def differences(recorded: Digests, current: Digests) -> list[str]:
    """One line per transcript whose requests differ (or that only one side has)."""
    found: list[str] = []
    for dialect in sorted(set(recorded) | set(current)):
        before, after = recorded.get(dialect, {}), current.get(dialect, {})
        for name in sorted(set(before) | set(after)):
            old, new = before.get(name), after.get(name)
            if old is None or new is None:
                found.append(f"{dialect} {name}: only in the {'new' if old is None else 'old'} run")
            elif old != new:
                changed = [k for k, (a, b) in enumerate(zip(old, new, strict=False)) if a != b]
                if len(old) != len(new):
                    changed.append(min(len(old), len(new)))
                found.append(
                    f"{dialect} {name}: {len(changed)} of {len(old)} requests differ, "
                    f"first at request {changed[0]}"
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", type=Path, help="a transcript or a directory of them")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", type=Path, help="write the digests to this file")
    action.add_argument("--compare", type=Path, help="compare with digests written before")
    parser.add_argument(
        "--memory", action="store_true", help="with project memory on the request path"
    )
    parser.add_argument(
        "--whole", action="store_true", help="parse every request whole (no body cache)"
    )
    args = parser.parse_args(argv)
    current = corpus_digests(args.target, Settings(), args.memory, args.whole)
    requests = sum(len(d) for by_name in current.values() for d in by_name.values())
    if args.out is not None:
        args.out.write_bytes(orjson.dumps(current, option=orjson.OPT_INDENT_2))
        print(f"{requests} request digests written to {args.out}")
        return 0
    found = differences(orjson.loads(args.compare.read_bytes()), current)
    for line in found:
        print(line)
    transcripts = len(next(iter(current.values()), {}))
    verdict = "differ" if found else "identical"
    print(f"{requests} requests, {transcripts} transcripts, {len(current)} dialects: {verdict}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
