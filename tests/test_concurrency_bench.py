"""benchmarks/concurrency.py: sessions replayed at once through deepmem and the control."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from benchmarks.concurrency import (
    CONTROL,
    TARGETS,
    Run,
    Sample,
    Setup,
    _by_thread,
    bucket_summary,
    request_kinds,
    rewrite_split,
    session_bodies,
    spread,
    summary,
)
from benchmarks.overhead import Timing, cpu_by_thread, cpu_seconds, page_faults
from benchmarks.soak import session_requests
from memory.threads import NamedThread
from proxy.replay_wire import DIALECTS

ROOT = Path(__file__).resolve().parents[1]
needs_control = pytest.mark.skipif(not CONTROL.is_file(), reason=f"no control proxy at {CONTROL}")


def transcript(tool_output: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return {
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Look at the logs."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": tool_output},
            {"role": "assistant", "content": "They are long."},
            {"role": "user", "content": "Thanks."},
            {"role": "assistant", "content": "You are welcome."},
        ]
    }


def run_benchmark(corpus: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.concurrency", *args],
        cwd=ROOT,
        env={**os.environ, "DEEPMEM_CORPUS": str(corpus)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_control
def test_three_sessions_of_three_requests_give_every_figure(tmp_path: Path) -> None:
    # Four requests a session (three turns and the compaction), of which the first, the third
    # and the last are sent; in the big transcript the last two are over 400 KB.
    (tmp_path / "a-big.json").write_bytes(orjson.dumps(transcript("log line\n" * 50_000)))
    (tmp_path / "b-small.json").write_bytes(orjson.dumps(transcript("two lines\n")))
    done = run_benchmark(tmp_path, "--sessions", "3", "--limit-requests", "3", "--stream", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    meta, buckets = report["meta"], report["buckets"]
    assert meta["sessions"] == 3 and meta["limit_requests"] == 3 and meta["stream"] is True
    assert meta["dialect"] == "chat" and meta["projects"] == 1
    assert meta["requests"] == 9 and meta["errors"] == dict.fromkeys(TARGETS, 0)
    assert meta["requests_per_s"] > 0 and meta["http_requests_per_s"] > meta["requests_per_s"]
    assert 0 < meta["mean_sessions_active"] <= 3
    # deepmem did its work on every request (warm-up included) rather than relay them
    deepmem = meta["deepmem"]
    assert deepmem["requests"] == deepmem["answers_read"] > 9
    assert deepmem["errors"] == deepmem["fail_opens"] == 0 and deepmem["tokens_removed"] > 0
    # each proxy's CPU time per request: its event loop's part of all its threads'
    if Path("/proc/self/stat").exists():
        cpu = meta["cpu_ms_per_request"]
        assert set(cpu) == {"control", "deepmem"}
        for used in cpu.values():
            assert 0 <= used["loop"] <= used["all"]
        assert cpu["deepmem"]["all"] > 0
        # and by thread: the loop and the rewrite workers by the names the kernel knows them by
        threads = meta["deepmem_cpu_ms_per_request_by_thread"]
        assert threads["event loop"] == pytest.approx(cpu["deepmem"]["loop"], abs=0.02)
        assert "deepmem-rewrite" in threads
        assert sum(threads.values()) == pytest.approx(cpu["deepmem"]["all"], abs=0.05)
        # and the page faults each took per request
        faults = meta["page_faults_per_request"]
        assert set(faults) == {"control", "deepmem"}
        assert all(count >= 0 for count in faults.values())
    # the embedding model is in the test environment (the [test] extra), so deepmem used it
    assert meta["memory_search"].startswith("bm25+"), meta["memory_search"]
    # sessions 0 and 2 replay the big transcript, session 1 the small one
    assert {name: b["requests"] for name, b in buckets.items()} == {
        "all": 9,
        "large": 4,
        "first": 3,
        "user_turn": 3,  # the third request of four ("Thanks.")
        "compaction": 3,
    }
    for bucket in buckets.values():
        assert set(bucket["direct"]) == {"p50", "p95", "ttfb_p50", "ttfb_p95"}
        for proxy in ("control", "deepmem"):
            assert set(bucket[proxy]) == {
                "p50",
                "p95",
                "overhead_p50",
                "overhead_p95",
                "paired_p50",
                "paired_p95",
                "ttfb_p50",
                "ttfb_p95",
            }
            assert bucket[proxy]["p50"] > 0
        assert set(bucket["ratio"]) == {
            "p50",
            "p95",
            "paired_p50",
            "paired_p95",
            "ttfb_p50",
            "ttfb_p95",
            "ttfb_p50_over_direct",
            "ttfb_p95_over_direct",
        }
    assert buckets["all"]["goals"] == {"p50": 1.5, "p95": 2.0}
    assert buckets["large"]["goals"] == {"p50": 2.0}
    assert isinstance(buckets["all"]["meets_goals"], bool) and "goals" not in buckets["first"]
    # where deepmem's time went, from its Server-Timing: every request but the firsts
    split = report["rewrites"]
    assert set(split) <= {"loop", "worker"} and sum(f["requests"] for f in split.values()) == 6
    for figures in split.values():
        assert 0 < figures["rewrite_p50"] <= figures["before_forwarding_p50"]


@needs_control
@pytest.mark.parametrize("dialect", ["anthropic", "responses"])
def test_the_table_in_other_dialects(tmp_path: Path, dialect: str) -> None:
    (tmp_path / "a-big.json").write_bytes(orjson.dumps(transcript("log line\n" * 50_000)))
    done = run_benchmark(
        tmp_path,
        "--sessions",
        "2",
        "--limit-requests",
        "3",
        "--dialect",
        dialect,
        "--projects",
        "2",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "deepmem under 2 concurrent sessions" in lines[0]
    assert f"non-streamed {dialect} requests, 2 projects" in lines[0]
    assert "6 requests to each of direct, control and deepmem" in lines[1]
    assert "failed: none" in lines[1]
    assert "errors 0, fail opens 0" in lines[2] and "tokens removed 0" not in lines[2]
    assert "; memory search bm25" in lines[2]
    assert any(line.startswith("first of a session") for line in lines)
    assert "first byte" not in done.stdout  # only streamed answers have one


@needs_control
@pytest.mark.parametrize("flag", ["--sessions", "--projects", "--limit-requests"])
def test_counts_must_be_positive(tmp_path: Path, flag: str) -> None:
    done = run_benchmark(tmp_path, flag, "0")
    assert done.returncode == 2 and "take a positive number" in done.stderr


def test_sessions_cycle_through_transcripts_and_projects(tmp_path: Path) -> None:
    corpus = [transcript("one\n"), transcript("two\n")]
    projects = [tmp_path / "p0", tmp_path / "p1", tmp_path / "p2"]
    setup = Setup(6, 3, False, "chat", CONTROL, projects=3)
    bodies = session_bodies(corpus, projects, setup)
    assert len(bodies) == 6 and all(len(requests) == 3 for requests in bodies)

    def where(requests: list[bytes]) -> tuple[str, str]:
        messages = orjson.loads(requests[1])["messages"]  # up to the second answer
        return messages[0]["content"].rsplit("/", 1)[1], messages[3]["content"]

    assert [where(requests) for requests in bodies] == [
        ("p0", "one\n"),
        ("p1", "two\n"),
        ("p2", "one\n"),
        ("p0", "two\n"),
        ("p1", "one\n"),
        ("p2", "two\n"),
    ]


def test_a_missing_control_is_refused_by_name(tmp_path: Path) -> None:
    done = run_benchmark(tmp_path, "--control", str(tmp_path / "nowhere.py"))
    assert done.returncode == 2
    assert f"the control proxy {tmp_path / 'nowhere.py'} does not exist" in done.stderr


def test_spread_keeps_the_first_and_last_requests_evenly_spaced() -> None:
    assert spread(10, None) == list(range(10))
    assert spread(3, 5) == [0, 1, 2]
    assert spread(9, 3) == [0, 4, 8]
    assert spread(100, 20)[:3] == [0, 5, 10] and spread(100, 20)[-1] == 99
    assert spread(7, 1) == [0]


def sample(index: int, body_bytes: int, direct: int, control: int, deepmem: int) -> Sample:
    ms = 1_000_000
    timings = {
        target: Timing(200, first_byte_ns=elapsed * ms // 2, total_ns=elapsed * ms)
        for target, elapsed in zip(TARGETS, (direct, control, deepmem), strict=True)
    }
    return Sample(0, index, body_bytes, timings)


def test_ratio_is_deepmem_overhead_over_control_overhead() -> None:
    samples = [sample(i, 1000, direct=10, control=11, deepmem=13) for i in range(5)]
    figures = bucket_summary(samples, stream=True)
    assert figures["control"]["overhead_p50"] == 1.0 and figures["deepmem"]["overhead_p50"] == 3.0
    assert figures["deepmem"]["paired_p50"] == 3.0 and figures["ratio"]["paired_p95"] == 3.0
    assert figures["ratio"]["p50"] == 3.0 and figures["ratio"]["p95"] == 3.0
    assert figures["ratio"]["ttfb_p50"] == 3.0  # (6.5 - 5) / (5.5 - 5)
    assert figures["ratio"]["ttfb_p50_over_direct"] == 1.3  # 6.5 / 5
    # a control no slower than direct has no overhead to divide by
    assert bucket_summary([sample(0, 1, 10, 10, 12)], stream=False)["ratio"]["p50"] is None


def test_paired_overhead_is_taken_per_request_as_the_evaluator_takes_it() -> None:
    """The evaluator subtracts each request's own direct time; the main table subtracts the
    direct percentile from the proxy's. A request slow through deepmem but fast direct, and
    one slow direct: the percentiles' difference says 20 ms at p50, each request's own 1."""
    samples = [
        sample(0, 1000, direct=10, control=11, deepmem=11),
        sample(1, 1000, direct=30, control=31, deepmem=31),
        sample(2, 1000, direct=10, control=11, deepmem=30),
    ]
    buckets = summary(Run(samples=samples), stream=False)
    figures = buckets["all"]
    assert figures["deepmem"]["overhead_p50"] == 20.0 and figures["ratio"]["p50"] == 20.0
    assert figures["deepmem"]["paired_p50"] == 1.0 and figures["control"]["paired_p50"] == 1.0
    assert figures["ratio"]["paired_p50"] == 1.0
    assert figures["meets_goals"] is False
    assert figures["meets_goals_paired"] is False  # p95: one request in three took 20 ms


def test_buckets_split_large_and_first_requests_and_judge_the_goals() -> None:
    samples = [
        sample(0, 1_000, direct=10, control=12, deepmem=13),  # ratio 1.5
        sample(1, 500_000, direct=20, control=22, deepmem=27),  # ratio 3.5
    ]
    buckets = summary(Run(samples=samples), stream=False)
    assert [buckets[n]["requests"] for n in ("all", "large", "first")] == [2, 1, 1]
    assert buckets["first"]["ratio"]["p50"] == 1.5 and "goals" not in buckets["first"]
    assert buckets["large"]["ratio"]["p50"] == 3.5 and buckets["large"]["meets_goals"] is False
    assert buckets["all"]["requests"] == 2


@pytest.mark.parametrize("dialect", ["chat", "anthropic", "responses"])
def test_request_kinds_tell_a_user_turn_from_a_step_in_every_dialect(
    tmp_path: Path, dialect: str
) -> None:
    # Requests before each assistant message: the first user message; the tool result; the
    # second user message ("Thanks."); then the compaction.
    bodies = list(session_requests(transcript("log\n"), tmp_path, False, dialect))
    assert request_kinds(bodies, DIALECTS[dialect]) == ["first", "step", "user_turn", "compaction"]


def test_user_turns_and_compactions_have_buckets_of_their_own() -> None:
    samples = [
        sample(0, 1_000, direct=10, control=11, deepmem=12),
        replace(sample(1, 1_000, direct=10, control=11, deepmem=14), kind="user_turn"),
        sample(2, 1_000, direct=10, control=11, deepmem=12),
        replace(sample(3, 1_000, direct=10, control=11, deepmem=30), kind="compaction"),
    ]
    buckets = summary(Run(samples=samples), stream=False)
    assert buckets["user_turn"]["requests"] == 1 and buckets["user_turn"]["ratio"]["p50"] == 4.0
    assert buckets["compaction"]["requests"] == 1 and buckets["compaction"]["ratio"]["p50"] == 20.0
    assert "goals" not in buckets["user_turn"] and "goals" not in buckets["compaction"]


def test_think_time_pauses_a_session_between_an_answer_and_its_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from benchmarks import concurrency

    sent: list[float] = []
    slept: list[float] = []

    async def send(client: object, url: str, body: bytes, headers: object) -> Timing | None:
        sent.append(len(slept))
        return None

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(concurrency, "send", send)
    monkeypatch.setattr(concurrency.asyncio, "sleep", sleep)
    urls = dict.fromkeys(concurrency.TARGETS, "http://x")
    run = concurrency.Run()
    asyncio.run(concurrency.replay_session(None, urls, {}, 0, [b"a", b"b", b"c"], run, 1000))  # type: ignore[arg-type]
    assert len(slept) == 2 and all(0.5 <= s <= 1.5 for s in slept)
    assert sent == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # a pause before each request but the first


def test_rewrite_split_reads_deepmem_s_server_timing_by_where_the_rewrite_ran() -> None:
    ms = 1_000_000

    def timed(index: int, deepmem_ms: int, header: str) -> Sample:
        timings = {
            "direct": Timing(200, ms, 10 * ms),
            "control": Timing(200, ms, 11 * ms),
            "deepmem": Timing(200, ms, (10 + deepmem_ms) * ms, header),
        }
        return Sample(0, index, 100, timings)

    samples = [
        timed(0, 50, 'deepmem;dur=40.000;desc="proxy", rewrite;dur=30.000;desc="worker"'),
        timed(1, 2, 'deepmem;dur=1.500;desc="proxy", rewrite;dur=1.000;desc="loop"'),
        timed(2, 3, 'deepmem;dur=2.500;desc="proxy", rewrite;dur=2.000;desc="loop"'),
        timed(3, 9, 'deepmem;dur=8.000;desc="proxy", rewrite;dur=5.000;desc="worker"'),
        timed(4, 1, 'deepmem;dur=0.500;desc="proxy"'),  # not a rewritten chat request
    ]
    split = rewrite_split(samples)
    assert split == {
        "loop": {  # percentiles as the other tables take them (inclusive)
            "requests": 2,
            "overhead_p50": 2.5,
            "overhead_p95": 2.95,
            "before_forwarding_p50": 2.0,
            "before_forwarding_p95": 2.45,
            "rewrite_p50": 1.5,
            "rewrite_p95": 1.95,
            "waited_p50": 0.5,
            "waited_p95": 0.5,
        },
        "worker": {  # the session's first request is left out
            "requests": 1,
            "overhead_p50": 9.0,
            "overhead_p95": 9.0,
            "before_forwarding_p50": 8.0,
            "before_forwarding_p95": 8.0,
            "rewrite_p50": 5.0,
            "rewrite_p95": 5.0,
            "waited_p50": 3.0,
            "waited_p95": 3.0,
        },
    }


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")
def test_page_faults_count_the_pages_a_process_touches_afresh() -> None:
    before = page_faults(os.getpid())
    assert before is not None
    pages = 2_000
    with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:  # anonymous: no page is mapped yet
        for page in range(pages):
            fresh[page * mmap.PAGESIZE] = 1
    after = page_faults(os.getpid())
    assert after is not None and after - before >= pages
    assert page_faults(2**22 + 12345) is None  # no such process


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")
def test_cpu_seconds_are_the_first_thread_s_part_of_the_process_s() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    sum(i * i for i in range(2_000_000))  # some CPU time on this, the first, thread
    after = cpu_seconds(os.getpid())
    assert after is not None
    assert after[0] > before[0] and after[1] >= after[0] > 0
    assert cpu_seconds(2**22 + 12345) is None  # no such process


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="no /proc")
def test_cpu_by_thread_names_the_loop_and_the_named_threads() -> None:
    done = threading.Event()

    def spin() -> None:
        sum(i * i for i in range(3_000_000))
        done.wait(5)

    worker = NamedThread(target=spin, name="deepmem-rewrite_7", daemon=True)
    worker.start()
    names: dict[str, float] = {}
    deadline = time.monotonic() + 10
    while not names.get("deepmem-rewrite") and time.monotonic() < deadline:
        used = cpu_by_thread(os.getpid())
        assert used is not None
        names = {}
        for name, seconds in used.values():
            names[name] = names.get(name, 0.0) + seconds
        time.sleep(0.01)
    done.set()
    worker.join()
    assert names["event loop"] > 0  # this, the first thread
    assert names["deepmem-rewrite"] > 0  # the worker's number left out
    assert cpu_by_thread(2**22 + 12345) is None


def test_cpu_by_thread_counts_each_thread_from_its_own_start() -> None:
    """A thread that ended between the readings is left to "ended threads"; one that started
    meanwhile under the same name counts from nothing, not against the ended one."""
    before = {1: ("event loop", 1.0), 2: ("deepmem-embed", 0.5)}
    after = {1: ("event loop", 1.5), 3: ("deepmem-embed", 0.2)}
    whole = {"loop": 50.0, "all": 100.0}  # ms per request over 10 requests: 1 s in all
    assert _by_thread(before, after, whole, 10) == {
        "event loop": 50.0,
        "ended threads": 30.0,
        "deepmem-embed": 20.0,
    }
    assert _by_thread(None, after, whole, 10) == {}
