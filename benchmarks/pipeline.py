"""Time the compression pipeline alone on a ~100K-token agent request built from the corpus.

cold: a session the memo has never seen (older outputs are compressed now, up to the
      per-request work cap; a larger backlog is worked off over the next requests);
warm: the same request again once the backlog is done (every decision is a memo hit);
next: the request one step later (one new output leaves the tail: the usual case), after
      the work the request before it deferred (the compressions computed ahead, which the
      proxy runs once an answer is out), and without it.
Each is timed through ``compress`` and through the proxy's whole rewrite hook (parse, compress,
store originals, serialise).

    python -m benchmarks.pipeline [--repeat N]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compressors.pipeline import CompressionSettings, SessionMemo, compress  # noqa: E402
from compressors.tokens import TokenCounter  # noqa: E402
from compressors.view import Dialect  # noqa: E402
from compressors.wire import parse_conversation  # noqa: E402
from proxy.addons import build_addons  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.pipeline import Rewrite, rewrite_request  # noqa: E402
from proxy.stores import open_stores  # noqa: E402

CORPUS = Path(os.environ.get("DEEPMEM_CORPUS", ROOT.parent / "shared" / "corpus" / "data"))
TARGET_TOKENS = 100_000


def build_request(target_tokens: int) -> tuple[dict[str, Any], int]:
    """One long agent session: the first transcript's head, then every transcript's steps."""
    counter = TokenCounter()
    files = sorted(CORPUS.glob("*.json"))
    if not files:
        raise SystemExit(f"no corpus transcripts in {CORPUS} (set DEEPMEM_CORPUS)")
    head = orjson.loads(files[0].read_bytes())["messages"][:2]
    messages: list[dict[str, Any]] = list(head)
    tokens = counter.count(orjson.dumps(messages).decode())
    for number, path in enumerate(files * 4):
        for message in orjson.loads(path.read_bytes())["messages"][2:]:
            message = copy.deepcopy(message)
            for call in message.get("tool_calls") or ():
                call["id"] = f"{number}-{call['id']}"
            if message.get("tool_call_id"):
                message["tool_call_id"] = f"{number}-{message['tool_call_id']}"
            messages.append(message)
            tokens += counter.count(orjson.dumps(message).decode())
        if tokens >= target_tokens and messages[-1]["role"] == "tool":
            break
    return {"model": "bench", "stream": True, "messages": messages}, tokens


def run_deferred(rewrite: Rewrite) -> None:
    """What the proxy runs once the request's answer has been relayed."""
    for job in rewrite.flow.after if rewrite.flow is not None else ():
        job()


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered):7.2f} ms   p95 {p95:7.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    body, tokens = build_request(TARGET_TOKENS)
    raw = orjson.dumps(body)
    step_back = orjson.dumps({**body, "messages": body["messages"][:-2]})
    settings = CompressionSettings()
    print(f"request: {len(raw):,} bytes, {len(body['messages'])} messages, {tokens:,} tokens")

    cold: list[float] = []
    warm: list[float] = []
    full_cold: list[float] = []
    full_warm: list[float] = []
    full_next: list[float] = []
    full_next_cold: list[float] = []
    for _ in range(args.repeat):
        memo = SessionMemo()
        conversation = parse_conversation(Dialect.OPENAI_CHAT, orjson.loads(raw))
        started = time.perf_counter()
        compress(conversation, memo, settings)
        cold.append((time.perf_counter() - started) * 1000)
        backlog = 0
        while True:  # work off what the cap deferred
            conversation = parse_conversation(Dialect.OPENAI_CHAT, orjson.loads(raw))
            backlog += 1
            if not compress(conversation, memo, settings).counters["deferred"]:
                break
        conversation = parse_conversation(Dialect.OPENAI_CHAT, orjson.loads(raw))
        started = time.perf_counter()
        compress(conversation, memo, settings)
        warm.append((time.perf_counter() - started) * 1000)

        proxy_settings = load_settings({}, environ={})
        for ahead in (True, False):
            stores = open_stores(proxy_settings, in_memory=True)
            addons = build_addons(proxy_settings, stores)
            headers = {"x-session-id": "bench"}
            started = time.perf_counter()
            rewrite = rewrite_request(step_back, Dialect.OPENAI_CHAT, headers, addons)
            if ahead:
                full_cold.append((time.perf_counter() - started) * 1000)
            for _ in range(backlog):  # the same backlog, worked off through the hook
                rewrite = rewrite_request(step_back, Dialect.OPENAI_CHAT, headers, addons)
            if ahead:
                run_deferred(rewrite)
            started = time.perf_counter()
            rewrite_request(raw, Dialect.OPENAI_CHAT, headers, addons)
            (full_next if ahead else full_next_cold).append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        rewrite_request(raw, Dialect.OPENAI_CHAT, headers, addons)
        full_warm.append((time.perf_counter() - started) * 1000)

    print(
        f"backlog worked off over {backlog} more request(s) (work cap "
        f"{settings.max_work_chars:,} characters per request)"
    )
    print(f"compress(), cold (new session)     {_ms(cold)}   goal p50 <= 20 ms")
    print(f"compress(), warm (memo hits)       {_ms(warm)}   goal p50 <=  3 ms")
    print(f"rewrite hook, cold                 {_ms(full_cold)}")
    print(f"rewrite hook, next step            {_ms(full_next)}")
    print(f"  nothing computed ahead           {_ms(full_next_cold)}")
    print(f"rewrite hook, warm (same request)  {_ms(full_warm)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
