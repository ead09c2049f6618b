"""Paired A/B overhead: each corpus request direct, through the control and through each tree.

The evaluator measures one proxy per run, and two runs of the same code differ by up to 0.15 ms
at p50 (the machine drifts between them), more than most changes to the request path. This
script puts the trees to compare in one run: every request goes direct to the fake provider
(``benchmarks/fake_provider.py``), through the evaluator's pass-through control and through
``deepmem serve`` of each tree (``--tree NAME=PATH``, the tree's code on ``PYTHONPATH``), in an
order drawn at random for each request. The order matters: a proxy's deferred work (after its
answer) still runs while the next target is timed, and a fixed rotation put one tree always
after another and charged it 0.25-0.45 ms more on the worker steps. Before each send
``--flush-mb`` MB are written, so the caches are as cold as the evaluator's own work between
requests leaves them. Each target first answers the smallest request a few times, so no
process counts its start-up.

Sessions are the corpus transcripts' (``benchmarks.soak.session_requests``, the first
``--limit`` requests of each, ``x-session-id`` per transcript), in one dialect. Printed: each
target's overhead (time minus the same request's time direct) at p50, p95 and mean, its ratio
to the control's at p50, each tree's time before forwarding and rewrite by where the rewrite
ran (its ``Server-Timing``), and every tree against the first per request (median and mean of
the differences).

    python -m benchmarks.paired --tree base=/tmp/base --tree new=.      # A/B, chat
    python -m benchmarks.paired --dialect anthropic --limit 10 --json

The control is ``../shared/eval/passthrough_proxy.py`` beside the repository, or
``--control`` / ``DEEPMEM_CONTROL_PROXY``. A measuring script: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.concurrency import CONTROL, Setup
from benchmarks.overhead import HERE, fetch, free_port, percentile, processes, wait_ready
from benchmarks.soak import session_requests, transcripts
from proxy.replay_wire import DIALECTS

ROOT = HERE.parent
WARMUP_ROUNDS = 10  # of the smallest request, to each target, before the clock starts


@dataclass
class Target:
    name: str
    url: str
    ms: list[float] = field(default_factory=list)  # per request, in the corpus's order
    # Per request: deepmem's time before forwarding, its rewrite's and where that ran.
    timing: list[tuple[float, float, str] | None] = field(default_factory=list)


def tree_command(port: int, upstream: str, data_dir: str) -> list[str]:
    return [
        sys.executable, "-m", "proxy", "serve", "--port", str(port),
        "--upstream", f"{upstream}/v1", "--data-dir", data_dir, "--log-level", "warning",
    ]  # fmt: skip


def requests(dialect: str, limit: int, project: Path) -> list[tuple[str, bytes]]:
    """The first ``limit`` requests of each corpus transcript, with its session id."""
    found: list[tuple[str, bytes]] = []
    for number, transcript in enumerate(transcripts()):
        session = f"paired-{number}"
        bodies = list(session_requests(transcript, project, False, dialect))[:limit]
        found.extend((session, body) for body in bodies)
    return found


async def replay(
    targets: list[Target], bodies: list[tuple[str, bytes]], setup: Setup, flush_mb: int, seed: int
) -> None:
    flush = bytearray(flush_mb << 20)
    draw = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector) as client:
        # No process counts its start-up (imports, first parse) against the run.
        warm_up = {**setup.headers, "x-session-id": "paired-warm-up"}
        smallest = min((body for _, body in bodies), key=len)
        for _ in range(WARMUP_ROUNDS):
            for target in targets:
                await fetch(client, target.url, smallest, warm_up)
        for session, body in bodies:
            headers = {**setup.headers, "x-session-id": session}
            order = draw.sample(targets, len(targets))
            for target in order:
                if flush:
                    flush[::64] = b"\x01" * len(flush[::64])
                timing = await fetch(client, target.url, body, headers)
                if timing.status != 200:
                    raise SystemExit(f"{target.name}: HTTP {timing.status}")
                target.ms.append(timing.total_ns / 1e6)
                target.timing.append(timing.rewrite())


def report(targets: list[Target]) -> dict[str, Any]:
    direct, control = targets[0], targets[1]
    overhead = {t.name: [a - b for a, b in zip(t.ms, direct.ms, strict=True)] for t in targets[1:]}
    control_p50 = percentile(overhead[control.name], 50)
    out: dict[str, Any] = {"requests": len(direct.ms), "targets": {}, "against_first": {}}
    for target in targets[1:]:
        values = overhead[target.name]
        figures: dict[str, Any] = {
            "overhead_p50": round(percentile(values, 50), 3),
            "overhead_p95": round(percentile(values, 95), 3),
            "overhead_mean": round(statistics.fmean(values), 3),
            "ratio_p50": (
                round(percentile(values, 50) / control_p50, 2) if control_p50 > 0 else None
            ),
        }
        split: dict[str, list[tuple[float, float]]] = {}
        for found in target.timing:
            if found is not None:
                split.setdefault(found[2], []).append(found[:2])
        figures["rewritten_on"] = {
            where: {
                "requests": len(pairs),
                "before_forwarding_p50": round(percentile([p for p, _ in pairs], 50), 3),
                "rewrite_p50": round(percentile([r for _, r in pairs], 50), 3),
            }
            for where, pairs in sorted(split.items())
        }
        out["targets"][target.name] = figures
    trees = targets[2:]
    for tree in trees[1:]:
        differences = [b - a for a, b in zip(trees[0].ms, tree.ms, strict=True)]
        out["against_first"][tree.name] = {
            "median": round(statistics.median(differences), 3),
            "mean": round(statistics.fmean(differences), 3),
        }
    return out


def print_report(figures: dict[str, Any], trees: list[Target], meta: dict[str, Any]) -> None:
    print(
        f"{figures['requests']} requests ({meta['dialect']}, first {meta['limit']} of each "
        f"transcript), each direct, through the control and {len(trees)} tree(s), in a random "
        f"order per request; {meta['flush_mb']} MB written before each send; times in ms"
    )
    for name, target in figures["targets"].items():
        line = (
            f"  {name:16s} overhead p50 {target['overhead_p50']:.3f}  p95 "
            f"{target['overhead_p95']:.3f}  mean {target['overhead_mean']:.3f}"
        )
        if name != "control":
            line += f"  ratio p50 {target['ratio_p50']}"
        print(line)
        for where, split in target["rewritten_on"].items():
            print(
                f"      {where:7s} n={split['requests']:5d}  before forwarding p50 "
                f"{split['before_forwarding_p50']:.3f}  rewrite p50 {split['rewrite_p50']:.3f}"
            )
    for name, difference in figures["against_first"].items():
        print(
            f"  {name} - {trees[0].name}, per request: median {difference['median']:+.3f}, "
            f"mean {difference['mean']:+.3f}"
        )


def parse_tree(value: str) -> tuple[str, Path]:
    name, _, path = value.rpartition("=")
    tree = Path(path or value).resolve()
    if not (tree / "proxy" / "__main__.py").is_file():
        raise argparse.ArgumentTypeError(f"{tree} is not a deepmem tree (no proxy/__main__.py)")
    return name or tree.name, tree


async def run(args: argparse.Namespace, trees: list[tuple[str, Path]]) -> list[Target]:
    setup = Setup(1, None, False, args.dialect, args.control)
    upstream_port, control_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{upstream_port}"
    ports = [free_port() for _ in trees]
    with tempfile.TemporaryDirectory(prefix="deepmem-paired-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        bodies = requests(args.dialect, args.limit, project)
        control = [sys.executable, str(args.control), "--port", str(control_port)]
        commands = [
            [sys.executable, str(HERE / "fake_provider.py"), "--port", str(upstream_port)],
            [*control, "--upstream", upstream],
        ]
        environments: list[dict[str, str] | None] = [None, None]
        for (name, path), port in zip(trees, ports, strict=True):
            home = root / name
            home.mkdir()
            commands.append(tree_command(port, upstream, str(home / "data")))
            environments.append({**os.environ, "PYTHONPATH": str(path), "HOME": str(home)})
        with processes(commands, environments, cwd=str(root)) as procs:
            targets = [Target("direct", upstream + setup.path)]
            targets.append(Target("control", f"http://127.0.0.1:{control_port}{setup.path}"))
            targets += [
                Target(name, f"http://127.0.0.1:{port}{setup.path}")
                for (name, _), port in zip(trees, ports, strict=True)
            ]
            async with aiohttp.ClientSession() as client:
                origins = [upstream, f"http://127.0.0.1:{control_port}"]
                origins += [f"http://127.0.0.1:{port}" for port in ports]
                for origin, proc in zip(origins, procs, strict=True):
                    await wait_ready(client, origin + "/health", proc)
            started = time.perf_counter()
            await replay(targets, bodies, setup, args.flush_mb, args.seed)
            print(f"replayed in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        type=parse_tree,
        help="NAME=PATH of a deepmem checkout to measure (repeatable; default: this one)",
    )
    parser.add_argument("--dialect", choices=sorted(DIALECTS), default="chat")
    parser.add_argument("--limit", type=int, default=20, help="requests of each transcript")
    parser.add_argument("--flush-mb", type=int, default=48, help="MB written before each send")
    parser.add_argument("--seed", type=int, default=1, help="of the order drawn per request")
    parser.add_argument("--control", type=Path, default=CONTROL)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if not args.control.is_file():
        parser.error(f"no control proxy at {args.control} (--control or DEEPMEM_CONTROL_PROXY)")
    if args.limit < 1 or args.flush_mb < 0:
        parser.error("--limit takes a positive number, --flush-mb one not below 0")
    trees = args.tree or [("deepmem", ROOT)]
    if len({name for name, _ in trees}) != len(trees) or {"direct", "control"} & {
        name for name, _ in trees
    }:
        parser.error("each tree needs a name of its own (not direct or control)")
    targets = asyncio.run(run(args, trees))
    figures = report(targets)
    meta = {"dialect": args.dialect, "limit": args.limit, "flush_mb": args.flush_mb}
    if args.json:
        print(json.dumps({"meta": meta} | figures, indent=2))
    else:
        print_report(figures, targets[2:], meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
