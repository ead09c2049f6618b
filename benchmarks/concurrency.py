"""Proxy overhead under concurrent sessions: deepmem against a plain pass-through control.

Starts ``benchmarks/fake_provider.py``, ``python -m proxy serve`` and the evaluator's
pass-through proxy (``passthrough_proxy.py``, the control: an aiohttp relay that changes
nothing) as child processes, then replays ``--sessions`` corpus transcripts at once, each an
agent session of its own (``x-session-id``): one request per assistant turn, the history
before it, then the compaction (as ``benchmarks/soak.py`` replays them). Every request is sent
direct to the fake provider, through the control and through deepmem, one after the other in
an order that rotates, so the three see the same load.

Overhead is the time through a proxy minus the time direct, at the same percentile; the ratio
is deepmem's overhead over the control's, for all requests, for those over ~100K tokens, for
the first request of each session, for the requests that begin a user turn and for the
compactions (``request_kinds``): the kinds that make deepmem's slowest requests. A second
table takes the overhead per request, as ``../shared/eval/blackbox_eval.py`` does: each
request's time through a proxy minus its own time direct, then the percentiles of those (under
load the three times of one request meet different moments of it, so these spread wider; both
are given, with the goals' verdict on each). ``--stream``
asks for streamed answers and adds their time to first byte; ``--dialect anthropic|responses``
sends the sessions in that wire format (``proxy/replay_wire.py``). A line of deepmem's own
totals (fail-opens, tokens removed) shows it did its work rather than relay, and a third
table, from deepmem's ``Server-Timing``, where its time went on the requests but each session's
first: by where the rewrite ran (the event loop, a light step; or a worker), its time before
forwarding, the rewrite's own part of it and what waited (for the session's turn, a worker or
the loop). A line of each proxy's CPU time per request (its event loop's and all its threads',
from ``/proc``) gives a figure that the machine's other work moves less than the times, and a
line of deepmem's by thread, by the names its threads give the kernel
(``memory.threads.NamedThread``): the rewrite workers, the embedding thread, unnamed ones (a
native library's) and those that ended meanwhile.

    python -m benchmarks.concurrency                              # 50 sessions, whole
    python -m benchmarks.concurrency --limit-requests 20          # 20 requests a session
    python -m benchmarks.concurrency --sessions 5 --stream --json
    python -m benchmarks.concurrency --think-ms 1000              # agents that wait on a model

Without ``--think-ms`` every session sends its next request the moment its answer is in, so
50 sessions keep every process saturated and what is measured is the proxy's throughput; with
it, each waits about that long first, as an agent waits for its model's next step.

The control is ``../shared/eval/passthrough_proxy.py`` beside the repository, or
``--control`` / ``DEEPMEM_CONTROL_PROXY``. A measuring script: it exits 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.overhead import (
    HEADERS,
    HERE,
    LARGE_BODY_BYTES,
    Timing,
    children,
    cpu_by_thread,
    cpu_seconds,
    fetch,
    free_port,
    page_faults,
    percentile,
    processes,
    to_ms,
    wait_ready,
)
from benchmarks.soak import session_requests, transcripts
from compressors.view import Dialect
from compressors.wire import FORMATS, parse_conversation
from proxy.replay_wire import DIALECTS

CONTROL = Path(
    os.environ.get(
        "DEEPMEM_CONTROL_PROXY",
        HERE.parents[1] / "shared" / "eval" / "passthrough_proxy.py",
    )
)
TARGETS = ("direct", "control", "deepmem")
PROXIES = ("control", "deepmem")
# Goals of issue 16 on deepmem's overhead over the control's, by bucket and percentile.
GOALS: dict[str, dict[str, float]] = {"all": {"p50": 1.5, "p95": 2.0}, "large": {"p50": 2.0}}
BUCKETS = {
    "all": "all requests",
    "large": f"over {LARGE_BODY_BYTES // 1000} KB",
    "first": "first of a session",
    "user_turn": "a user turn begins",
    "compaction": "compactions",
}
# What a request of a replayed session is (``request_kinds``): the buckets but "all" and "large".
FIRST, STEP, USER_TURN, COMPACTION = "first", "step", "user_turn", "compaction"
WARMUP_ROUNDS = 10


@dataclass(frozen=True)
class Sample:
    """One request, sent to each target."""

    session: int
    index: int  # its place in the session
    body_bytes: int
    timings: dict[str, Timing]
    kind: str = STEP  # ``request_kinds``


@dataclass(frozen=True)
class Setup:
    sessions: int
    limit: int | None  # requests a session
    stream: bool
    dialect: str  # a key of proxy.replay_wire.DIALECTS
    control: Path
    projects: int = 1  # project directories the sessions work in
    think_ms: float = 0.0  # a session's pause between an answer and its next request

    @property
    def path(self) -> str:
        return "/v1" + FORMATS[DIALECTS[self.dialect]].path_suffix

    @property
    def headers(self) -> dict[str, str]:
        return (
            {**HEADERS, "anthropic-version": "2023-06-01"}
            if self.dialect == "anthropic"
            else HEADERS
        )


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0))
    session_s: list[float] = field(default_factory=list)  # how long each session took
    wall_s: float = 0.0
    deepmem: dict[str, int] = field(default_factory=dict)  # what deepmem did, from its /stats
    # What deepmem's memory search ranks by (its /health): the embedding model, when installed
    # in its environment, is much of its time under load, so runs are compared only alike.
    memory_search: str = ""
    # Each proxy's CPU time per request sent to it, in ms, over the replay: its event loop's
    # ("loop") and all its threads' ("all"); empty where /proc is not there to read.
    cpu_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    # deepmem's, by thread (``benchmarks.overhead.cpu_by_thread``): which of them used the CPU.
    # What threads that ended meanwhile used is "ended threads".
    cpu_ms_by_thread: dict[str, float] = field(default_factory=dict)
    # Each proxy's minor page faults per request sent to it, over the replay.
    faults: dict[str, float] = field(default_factory=dict)

    @property
    def mean_sessions_active(self) -> float:
        """Sessions in flight, on average over the run (fewer than all once short ones end)."""
        return sum(self.session_s) / self.wall_s if self.wall_s else 0.0


def spread(count: int, limit: int | None) -> list[int]:
    """``limit`` indexes out of ``count``, evenly spaced with the first and the last among them,
    so a shortened session still grows to its largest requests."""
    if limit is None or limit >= count:
        return list(range(count))
    if limit <= 1:
        return [0][:limit]
    return [round(i * (count - 1) / (limit - 1)) for i in range(limit)]


def session_bodies(
    corpus: list[dict[str, Any]], projects: list[Path], setup: Setup
) -> list[list[bytes]]:
    """Each session's request bodies, built before the clock starts: session i replays
    transcript i (cycled) in project i (cycled); sessions alike share their bodies."""
    built: dict[tuple[int, int], list[bytes]] = {}
    bodies = []
    for session in range(setup.sessions):
        key = (session % len(corpus), session % len(projects))
        if key not in built:
            transcript, project = corpus[key[0]], projects[key[1]]
            every = list(session_requests(transcript, project, setup.stream, setup.dialect))
            built[key] = [every[i] for i in spread(len(every), setup.limit)]
        bodies.append(built[key])
    return bodies


def request_kinds(bodies: list[bytes], dialect: Dialect) -> list[str]:
    """What each of a session's requests is, as ``session_requests`` builds them: its first,
    the compaction it ends with, and in between a step that begins a user turn (its last real
    user message is one it adds: recall and the turn's compression run then) or not."""
    wire = FORMATS[dialect]
    kinds, sent = [], 0
    for index, body in enumerate(bodies):
        parsed = orjson.loads(body)
        if index == 0:
            kinds.append(FIRST)
        elif index == len(bodies) - 1:
            kinds.append(COMPACTION)
        else:
            adds_user = parse_conversation(dialect, parsed).last_user_message >= sent
            kinds.append(USER_TURN if adds_user else STEP)
        sent = wire.message_count(parsed)
    return kinds


async def send(
    client: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> Timing | None:
    try:
        timing = await fetch(client, url, body, headers)
    except (TimeoutError, aiohttp.ClientError):
        return None
    return timing if timing.status == 200 else None


async def replay_session(
    client: aiohttp.ClientSession,
    urls: dict[str, str],
    headers: dict[str, str],
    session: int,
    bodies: list[bytes],
    run: Run,
    think_ms: float = 0.0,
    kinds: list[str] | None = None,
) -> None:
    headers = {**headers, "x-session-id": f"concurrency-{session}-{time.time_ns()}"}
    pauses = random.Random(session)  # the model's time to its next step: 0.5x to 1.5x
    started = time.perf_counter()
    for index, body in enumerate(bodies):
        if index and think_ms:
            await asyncio.sleep(think_ms * (0.5 + pauses.random()) / 1000)
        shift = (session + index) % len(TARGETS)
        order = TARGETS[shift:] + TARGETS[:shift]
        timings: dict[str, Timing] = {}
        for target in order:
            timing = await send(client, urls[target], body, headers)
            if timing is None:
                run.errors[target] += 1
            else:
                timings[target] = timing
        if len(timings) == len(TARGETS):
            kind = kinds[index] if kinds is not None else STEP
            run.samples.append(Sample(session, index, len(body), timings, kind))
    run.session_s.append(time.perf_counter() - started)


async def warm_up(
    client: aiohttp.ClientSession,
    urls: dict[str, str],
    headers: dict[str, str],
    bodies: list[bytes],
) -> None:
    """The run's smallest request a few times and its largest once, to each target, so no
    process counts its start-up against the run."""
    headers = {**headers, "x-session-id": "concurrency-warm-up"}
    for body in [min(bodies, key=len)] * WARMUP_ROUNDS + [max(bodies, key=len)]:
        for target in TARGETS:
            await send(client, urls[target], body, headers)


async def run(setup: Setup) -> Run:
    corpus = transcripts()
    upstream_port, proxy_port, control_port = free_port(), free_port(), free_port()
    origins = {
        "direct": f"http://127.0.0.1:{upstream_port}",
        "control": f"http://127.0.0.1:{control_port}",
        "deepmem": f"http://127.0.0.1:{proxy_port}",
    }
    urls = {target: origin + setup.path for target, origin in origins.items()}
    control_command = [
        sys.executable, str(setup.control), "--port", str(control_port),
        "--upstream", origins["direct"],
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="deepmem-concurrency-") as tmp:
        root = Path(tmp)
        data_dir = root / "data"
        projects = [root / f"project-{n}" for n in range(setup.projects)]
        for project in projects:
            project.mkdir()
        bodies = session_bodies(corpus, projects, setup)
        kinds_of: dict[int, list[str]] = {}  # sessions alike share their bodies
        for replayed in bodies:
            if id(replayed) not in kinds_of:
                kinds_of[id(replayed)] = request_kinds(replayed, DIALECTS[setup.dialect])
        with (
            children(upstream_port, proxy_port, str(data_dir), ["--allowed-roots", str(root)]) as (
                upstream,
                proxy,
            ),
            processes([control_command]) as (relay,),
        ):
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
                for target, proc in zip(TARGETS, (upstream, relay, proxy), strict=True):
                    await wait_ready(client, origins[target] + "/health", proc)
                await warm_up(
                    client, urls, setup.headers, list(itertools.chain.from_iterable(bodies))
                )
                result = Run()
                measured = {"control": relay.pid, "deepmem": proxy.pid}
                cpu_before = {name: cpu_seconds(pid) for name, pid in measured.items()}
                threads_before = cpu_by_thread(proxy.pid)
                faults_before = {name: page_faults(pid) for name, pid in measured.items()}
                started = time.perf_counter()
                await asyncio.gather(
                    *(
                        replay_session(
                            client,
                            urls,
                            setup.headers,
                            session,
                            bodies[session],
                            result,
                            setup.think_ms,
                            kinds_of[id(bodies[session])],
                        )
                        for session in range(setup.sessions)
                    )
                )
                result.wall_s = time.perf_counter() - started
                sent = sum(map(len, bodies))
                for name, pid in measured.items():
                    before, after = cpu_before[name], cpu_seconds(pid)
                    if before is not None and after is not None and sent:
                        result.cpu_ms[name] = {
                            "loop": round((after[0] - before[0]) * 1000 / sent, 3),
                            "all": round((after[1] - before[1]) * 1000 / sent, 3),
                        }
                for name, pid in measured.items():
                    faulted, faults_after = faults_before[name], page_faults(pid)
                    if faulted is not None and faults_after is not None and sent:
                        result.faults[name] = round((faults_after - faulted) / sent, 1)
                result.cpu_ms_by_thread = _by_thread(
                    threads_before, cpu_by_thread(proxy.pid), result.cpu_ms.get("deepmem"), sent
                )
                result.deepmem = await deepmem_totals(client, origins["deepmem"])
                result.memory_search = await memory_search(client, origins["deepmem"])
    return result


def _by_thread(
    before: dict[int, tuple[str, float]] | None,
    after: dict[int, tuple[str, float]] | None,
    whole: dict[str, float] | None,
    sent: int,
) -> dict[str, float]:
    """CPU ms per request by thread name between two ``cpu_by_thread`` readings, largest first,
    and what the process's whole figure (``whole["all"]``) leaves over: threads that ended."""
    if before is None or after is None or not sent:
        return {}
    seconds: dict[str, float] = {}
    for thread, (name, used) in after.items():
        earlier = before.get(thread)
        seconds[name] = seconds.get(name, 0.0) + used - (earlier[1] if earlier else 0.0)
    per_request = {name: round(used * 1000 / sent, 3) for name, used in seconds.items()}
    if whole is not None:
        ended = whole["all"] - sum(per_request.values())
        per_request["ended threads"] = round(max(0.0, ended), 3)
    return dict(sorted(per_request.items(), key=lambda item: -item[1]))


async def deepmem_totals(client: aiohttp.ClientSession, origin: str) -> dict[str, int]:
    """Whether deepmem did its work rather than relay (fail open): a few of its /stats totals."""
    async with client.get(origin + "/stats") as response:
        totals = (await response.json())["totals"]
    return {
        "requests": totals["requests"],
        "errors": totals["errors"],
        "fail_opens": totals["fail_opens"],
        "answers_read": totals["usage_seen"]["responses"],
        "tokens_removed": totals["compression"]["tokens_removed"],
    }


async def memory_search(client: aiohttp.ClientSession, origin: str) -> str:
    """What deepmem's memory search ranks by (``bm25``, or ``bm25+`` the embedding model)."""
    async with client.get(origin + "/health") as response:
        return str((await response.json())["memory_search"])


# ---------------------------------------------------------------- figures


def _ms_at(values: list[int], q: int) -> float:
    return to_ms(percentile(values, q))


def _ratio(numerator: float, denominator: float) -> float | None:
    """None when the denominator is no overhead at all (noise can make it zero or less)."""
    return round(numerator / denominator, 2) if denominator > 0 else None


def bucket_summary(samples: list[Sample], stream: bool) -> dict[str, Any]:
    """Percentiles of each target, each proxy's overhead over direct and deepmem/control."""
    out: dict[str, Any] = {"requests": len(samples)}
    if not samples:
        return out
    out["body_bytes_p50"] = round(statistics.median(s.body_bytes for s in samples))

    def totals(target: str) -> list[int]:
        return [s.timings[target].total_ns for s in samples]

    def first_bytes(target: str) -> list[int]:
        return [s.timings[target].first_byte_ns for s in samples]

    direct = totals("direct")
    out["direct"] = {"p50": _ms_at(direct, 50), "p95": _ms_at(direct, 95)}
    if stream:
        out["direct"] |= {
            "ttfb_p50": _ms_at(first_bytes("direct"), 50),
            "ttfb_p95": _ms_at(first_bytes("direct"), 95),
        }
    for proxy in PROXIES:
        through = totals(proxy)
        paired = [p - d for p, d in zip(through, direct, strict=True)]
        figures: dict[str, float] = {
            "p50": _ms_at(through, 50),
            "p95": _ms_at(through, 95),
            "overhead_p50": to_ms(percentile(through, 50) - percentile(direct, 50)),
            "overhead_p95": to_ms(percentile(through, 95) - percentile(direct, 95)),
            "paired_p50": _ms_at(paired, 50),
            "paired_p95": _ms_at(paired, 95),
        }
        if stream:
            figures |= {
                "ttfb_p50": _ms_at(first_bytes(proxy), 50),
                "ttfb_p95": _ms_at(first_bytes(proxy), 95),
            }
        out[proxy] = figures
    control, deepmem = out["control"], out["deepmem"]
    out["ratio"] = {
        "p50": _ratio(deepmem["overhead_p50"], control["overhead_p50"]),
        "p95": _ratio(deepmem["overhead_p95"], control["overhead_p95"]),
        "paired_p50": _ratio(deepmem["paired_p50"], control["paired_p50"]),
        "paired_p95": _ratio(deepmem["paired_p95"], control["paired_p95"]),
    }
    if stream:
        for q in ("ttfb_p50", "ttfb_p95"):
            out["ratio"][q] = _ratio(deepmem[q] - out["direct"][q], control[q] - out["direct"][q])
            out["ratio"][f"{q}_over_direct"] = _ratio(deepmem[q], out["direct"][q])
    return out


SPLIT_FIGURES = ("overhead", "before_forwarding", "rewrite", "waited")


def rewrite_split(samples: list[Sample]) -> dict[str, Any]:
    """Where deepmem's time went, from its Server-Timing, for the requests but each session's
    first, by where the rewrite ran (``loop``: a light step; ``worker``): how many, deepmem's
    overhead over direct (paired, per request), its time before forwarding, the rewrite's own
    part of that, and the rest (waiting for the session's turn, a worker or the loop)."""
    found: dict[str, dict[str, list[float]]] = {}
    for sample in samples:
        timing = sample.timings["deepmem"]
        read = timing.rewrite()
        if sample.index == 0 or read is None:
            continue
        before, own, where = read
        overhead = to_ms(timing.total_ns - sample.timings["direct"].total_ns)
        figures = found.setdefault(where, {name: [] for name in SPLIT_FIGURES})
        for name, value in zip(SPLIT_FIGURES, (overhead, before, own, before - own), strict=True):
            figures[name].append(value)
    return {
        where: {"requests": len(figures["overhead"])}
        | {
            f"{name}_p{q}": round(percentile(values, q), 2)
            for name, values in figures.items()
            for q in (50, 95)
        }
        for where, figures in sorted(found.items())
    }


def summary(result: Run, stream: bool) -> dict[str, Any]:
    members = {
        "all": result.samples,
        "large": [s for s in result.samples if s.body_bytes > LARGE_BODY_BYTES],
        "first": [s for s in result.samples if s.index == 0],
        "user_turn": [s for s in result.samples if s.kind == USER_TURN],
        "compaction": [s for s in result.samples if s.kind == COMPACTION],
    }
    buckets = {}
    for name, samples in members.items():
        figures = bucket_summary(samples, stream)
        goals = GOALS.get(name, {})
        if goals and "ratio" in figures:
            ratio = figures["ratio"]
            figures["goals"] = goals
            figures["meets_goals"] = all(
                ratio[q] is not None and ratio[q] <= goal for q, goal in goals.items()
            )
            figures["meets_goals_paired"] = all(
                ratio[f"paired_{q}"] is not None and ratio[f"paired_{q}"] <= goal
                for q, goal in goals.items()
            )
        buckets[name] = figures
    return buckets


def print_table(
    buckets: dict[str, Any], meta: dict[str, Any], rewrites: dict[str, Any] | None = None
) -> None:
    print(
        f"deepmem under {meta['sessions']} concurrent sessions: {meta['python']}, "
        f"aiohttp {meta['aiohttp']}, {meta['cpus']} CPUs, loopback, "
        f"{'streamed' if meta['stream'] else 'non-streamed'} {meta['dialect']} requests, "
        f"{meta['projects']} project{'s' if meta['projects'] > 1 else ''}, "
        f"{meta['think_ms']:g} ms between a session's answer and its next request"
    )
    errors = ", ".join(f"{t} {n}" for t, n in meta["errors"].items() if n) or "none"
    print(
        f"{meta['requests']} requests to each of direct, control and deepmem in "
        f"{meta['wall_s']:.1f} s: {meta['requests_per_s']:.1f} requests/s each, "
        f"{meta['http_requests_per_s']:.1f} HTTP requests/s in all; failed: {errors}; "
        f"{meta['mean_sessions_active']:g} sessions in flight on average"
    )
    print(
        "deepmem (warm-up included): "
        + ", ".join(f"{name.replace('_', ' ')} {n:,}" for name, n in meta["deepmem"].items())
        + f"; memory search {meta['memory_search']}"
    )
    cpu = meta["cpu_ms_per_request"]
    if cpu:
        print(
            "CPU ms per request (process time: steadier than wall time on a shared machine): "
            + "; ".join(
                f"{name} event loop {used['loop']:.3f}, all threads {used['all']:.3f}"
                for name, used in cpu.items()
            )
        )
    faults = meta.get("page_faults_per_request")
    if faults:
        print(
            "minor page faults per request: "
            + ", ".join(f"{name} {count:g}" for name, count in faults.items())
        )
    threads = meta.get("deepmem_cpu_ms_per_request_by_thread")
    if threads:
        print(
            "deepmem CPU ms per request by thread: "
            + ", ".join(f"{name} {ms:.3f}" for name, ms in threads.items())
        )
    print(
        "times in ms; overhead = proxy p - direct p at the same percentile; "
        "ratio = deepmem overhead / control overhead"
    )
    header = (
        f"{'requests':<20}{'n':>6}{'direct p50':>11}{'p95':>9}"
        f"{'control ovh p50':>17}{'p95':>9}{'deepmem ovh p50':>17}{'p95':>9}"
        f"{'ratio p50':>11}{'p95':>8}  goals"
    )
    print(header)
    print("-" * len(header))
    for name, label in BUCKETS.items():
        b = buckets[name]
        if not b["requests"]:
            print(f"{label:<20}{0:>6}")
            continue
        goals = b.get("goals", {})
        verdict = ""
        if goals:
            wanted = ", ".join(f"{q} <= {g:g}" for q, g in goals.items())
            verdict = f"{wanted}: {'ok' if b['meets_goals'] else 'MISSED'}"
        print(
            f"{label:<20}{b['requests']:>6}{b['direct']['p50']:>11.2f}{b['direct']['p95']:>9.2f}"
            f"{b['control']['overhead_p50']:>17.2f}{b['control']['overhead_p95']:>9.2f}"
            f"{b['deepmem']['overhead_p50']:>17.2f}{b['deepmem']['overhead_p95']:>9.2f}"
            f"{_fmt(b['ratio']['p50']):>11}{_fmt(b['ratio']['p95']):>8}  {verdict}"
        )
    rows = []
    for name, label in BUCKETS.items():
        b = buckets[name]
        if not b["requests"]:
            continue
        cells = [f"{b[t]['paired_p50']:.2f} / {b[t]['paired_p95']:.2f}" for t in PROXIES]
        cells.append(f"{_fmt(b['ratio']['paired_p50'])} / {_fmt(b['ratio']['paired_p95'])}")
        if b.get("goals"):
            cells.append("ok" if b["meets_goals_paired"] else "MISSED")
        else:
            cells.append("")
        rows.append((label, b["requests"], cells))
    _print_pairs(
        "\noverhead per request, as ../shared/eval counts it (each request's time through the"
        " proxy minus its own time direct, then the percentiles), ms p50 / p95",
        "requests",
        [("control", 18), ("deepmem", 18), ("ratio", 14), ("goals", 8)],
        rows,
    )
    if rewrites:
        _print_pairs(
            "\nwhere deepmem's time went (its Server-Timing), requests but each session's first,"
            " ms p50 / p95",
            "rewritten on",
            [("overhead", 18), ("before forwarding", 20), ("rewrite", 18), ("waited", 18)],
            [
                (
                    where,
                    f["requests"],
                    [f"{f[name + '_p50']:.2f} / {f[name + '_p95']:.2f}" for name in SPLIT_FIGURES],
                )
                for where, f in rewrites.items()
            ],
        )
    if not meta["stream"]:
        return
    rows = []
    for name, label in BUCKETS.items():
        b = buckets[name]
        if not b["requests"]:
            continue
        ratio = b["ratio"]
        cells = [f"{b[t]['ttfb_p50']:.2f} / {b[t]['ttfb_p95']:.2f}" for t in ("direct", *PROXIES)]
        cells.append(f"{_fmt(ratio['ttfb_p50'])} / {_fmt(ratio['ttfb_p95'])}")
        cells.append(
            f"{_fmt(ratio['ttfb_p50_over_direct'])} / {_fmt(ratio['ttfb_p95_over_direct'])}"
        )
        rows.append((label, b["requests"], cells))
    columns = ["direct", "control", "deepmem", "ratio (ovh)", "deepmem/direct"]
    _print_pairs(
        "\ntime to first byte of the streamed answer, ms (p50 / p95)",
        "requests",
        [(column, 20) for column in columns],
        rows,
    )


def _print_pairs(
    title: str,
    first: str,
    columns: list[tuple[str, int]],
    rows: list[tuple[str, int, list[str]]],
) -> None:
    """A table of ``p50 / p95`` cells: its title, a header of ``columns`` (name, width) after
    the rows' label and count, and each row."""
    print(title)
    header = f"{first:<20}{'n':>6}" + "".join(f"{name:>{width}}" for name, width in columns)
    print(header)
    print("-" * len(header))
    for label, count, cells in rows:
        widths = [width for _, width in columns]
        line = "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        print(f"{label:<20}{count:>6}{line}")


def _fmt(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50, help="sessions replayed at once")
    parser.add_argument(
        "--limit-requests",
        type=int,
        default=None,
        metavar="N",
        help="at most N requests a session, evenly spaced over it (its first and last among "
        "them, so the large late requests stay); default: every request",
    )
    parser.add_argument(
        "--stream", action="store_true", help="ask for streamed answers; adds time to first byte"
    )
    parser.add_argument(
        "--dialect",
        choices=tuple(DIALECTS),
        default="chat",
        help="the wire format the sessions speak (default: %(default)s)",
    )
    parser.add_argument(
        "--projects",
        type=int,
        default=1,
        metavar="N",
        help="project directories the sessions work in, session i in project i mod N "
        "(default: %(default)s, all sessions share one project's memory)",
    )
    parser.add_argument(
        "--control",
        type=Path,
        default=CONTROL,
        help="the pass-through proxy to compare with (default: %(default)s; "
        "env DEEPMEM_CONTROL_PROXY)",
    )
    parser.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="a session's pause between an answer and its next request, as the model takes "
        "to write its next step (each pause 0.5x to 1.5x this; default: %(default)s, every "
        "session sends at once: the proxy's throughput, not its overhead, then decides)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if not args.control.is_file():
        parser.error(
            f"the control proxy {args.control} does not exist: give the evaluator's "
            "passthrough_proxy.py with --control or DEEPMEM_CONTROL_PROXY"
        )
    limit = 1 if args.limit_requests is None else args.limit_requests
    if min(args.sessions, args.projects, limit) < 1:
        parser.error("--sessions, --projects and --limit-requests take a positive number")
    # SIGTERM unwinds like Ctrl-C, so the children are ended either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        setup = Setup(
            args.sessions,
            args.limit_requests,
            args.stream,
            args.dialect,
            args.control,
            args.projects,
            args.think_ms,
        )
        result = asyncio.run(run(setup))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    requests = len(result.samples)
    meta: dict[str, Any] = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "aiohttp": aiohttp.__version__,
        "cpus": os.cpu_count(),
        "sessions": args.sessions,
        "limit_requests": args.limit_requests,
        "stream": args.stream,
        "dialect": args.dialect,
        "projects": args.projects,
        "think_ms": args.think_ms,
        "control": str(args.control),
        "large_body_bytes": LARGE_BODY_BYTES,
        "requests": requests,
        "errors": result.errors,
        "wall_s": round(result.wall_s, 3),
        "mean_sessions_active": round(result.mean_sessions_active, 1),
        "deepmem": result.deepmem,
        "memory_search": result.memory_search,
        "cpu_ms_per_request": result.cpu_ms,
        "deepmem_cpu_ms_per_request_by_thread": result.cpu_ms_by_thread,
        "page_faults_per_request": result.faults,
        "requests_per_s": round(requests / result.wall_s, 2) if result.wall_s else 0.0,
        "http_requests_per_s": (
            round(len(TARGETS) * requests / result.wall_s, 2) if result.wall_s else 0.0
        ),
    }
    buckets, rewrites = summary(result, args.stream), rewrite_split(result.samples)
    if args.json:
        report = {"meta": meta, "unit": "ms", "buckets": buckets, "rewrites": rewrites}
        print(json.dumps(report, indent=2))
    else:
        print_table(buckets, meta, rewrites)
    return 0


if __name__ == "__main__":
    sys.exit(main())
