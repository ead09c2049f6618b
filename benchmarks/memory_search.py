"""Memory search benchmark: 10,000 synthetic entries (English and Chinese), build and query times.

Two layouts, both 10,000 entries:
- ``files``: a realistic .deep-memory/ — two MEMORY.md files with big sections, a notes.md with
  2,000 captures and 40 session checkpoints (few, long documents);
- ``sections``: a notes.md with 10,000 one-entry captures (10,000 documents: the worst case for
  the per-document postings).

Query time is the wall time of ``MemoryIndex.search`` (it includes the (mtime, size) check of
every watched file), measured over mixed English / Chinese / OR queries.

    python -m benchmarks.memory_search [--tokenizer bigram|jieba|both] [--rounds N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from memory.search import MemoryIndex
from memory.tokenize import tokenize

TOTAL = 10_000
NOW = date(2025, 6, 1)


def words(text: str) -> list[str]:
    return text.split()


EN_WORDS = words(
    "proxy cache sqlite session token stream upstream header retry timeout config "
    "docker pytest asyncio marker original compress dedup reasoning checkpoint "
    "memory search index bm25 jieba provider anthropic openai request response "
    "latency port nginx deploy release branch commit ruff format lint schema "
    "migration database backup logging metrics the a to of in for on with when must "
    "never always use fails error because"
)
ZH_WORDS = words(
    "使用 存储 会话 状态 数据库 生产 修改 缓存 请求 响应 流式 转发 压缩 记忆 检索 分词 "
    "部署 发布 日志 密钥 配置 端口 超时 重试 测试 失败 路径 文件 目录 镜像 时区 用户 "
    "项目 代码 注释 接口 比例 索引 不能 必须 的 是 在 和"
)
SECTIONS = ("Decisions", "Constraints", "Gotchas", "Facts", "Notes")
QUERIES = [
    "sqlite session",
    "upstream timeout retry",
    "docker port nginx",
    "never modify the database",
    "会话状态 存储",
    "生产数据库",
    "流式响应 转发",
    "日志 密钥",
    "cache | 缓存",
    "release | 发布 | deploy",
    "pytest asyncio fails",
    "压缩比例 接口",
    "memory_search.index",
    "bm25 分词",
    "the",
]


def entry(rng: random.Random) -> str:
    words = rng.sample(EN_WORDS, rng.randint(4, 9))
    if rng.random() < 0.5:
        zh = "".join(rng.sample(ZH_WORDS, rng.randint(3, 7)))
        words.insert(rng.randint(0, len(words)), zh)
    day = NOW - timedelta(days=rng.randint(0, 400))
    return f"{' '.join(words)} [{day.isoformat()}]"


def memory_md(rng: random.Random, count: int) -> str:
    per = count // len(SECTIONS)
    parts = ["# Memory\n"]
    for title in SECTIONS:
        parts.append(f"\n## {title}\n")
        parts.extend(f"- {entry(rng)}\n" for _ in range(per))
    return "".join(parts)


def notes_md(rng: random.Random, count: int) -> str:
    parts = []
    for i in range(count):
        stamp = NOW - timedelta(minutes=37 * (count - i))
        parts.append(f"## {stamp.isoformat()}T00:00:00Z (session {i:08x}) [{i * 7919:08x}]\n")
        parts.append(entry(rng).rsplit(" [", 1)[0] + "\n\n")
    return "".join(parts)


def checkpoint_md(rng: random.Random, sid: int, count: int) -> str:
    parts = [f"# Checkpoint — {sid:08x}\n\n## User Intent\n{entry(rng)}\n"]
    for title in ("Decisions", "Constraints", "Gotchas", "File Changes"):
        parts.append(f"\n## {title}\n")
        parts.extend(f"- {entry(rng)}\n" for _ in range(count // 4))
    return "".join(parts)


def write_layout(root: Path, layout: str, rng: random.Random) -> list[Path]:
    files: dict[Path, str] = {}
    if layout == "sections":
        files[root / "notes.md"] = notes_md(rng, TOTAL)
    else:
        files[root / "global" / "MEMORY.md"] = memory_md(rng, 2_000)
        files[root / "project" / "MEMORY.md"] = memory_md(rng, 4_000)
        files[root / "project" / "notes.md"] = notes_md(rng, 2_040)
        for sid in range(40):
            path = root / "project" / "sessions" / f"{sid:08x}" / "checkpoint.md"
            files[path] = checkpoint_md(rng, sid, 48)  # 1 intent + 48 entries
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(files)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(layout: str, mode: str, rounds: int) -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_layout(Path(tmp), layout, rng)
        if mode == "jieba":
            tokenize("预热", "jieba")  # dictionary load is a one-off, reported separately
        start = time.perf_counter()
        index = MemoryIndex(paths, tokenizer=mode)  # type: ignore[arg-type]
        index.refresh()
        build_ms = (time.perf_counter() - start) * 1000
        entries = sum(len(doc.entries) for doc in index.documents)
        times: list[float] = []
        for _ in range(rounds):
            for query in QUERIES:
                start = time.perf_counter()
                index.search(query, limit=5, now=NOW)
                times.append((time.perf_counter() - start) * 1000)
        print(
            f"{layout:8} {mode:6} entries={entries:5} docs={len(index.documents):5} "
            f"files={len(paths):2}  build {build_ms:7.1f} ms  "
            f"query p50 {statistics.median(times):.3f} ms  p95 {percentile(times, 0.95):.3f} ms  "
            f"max {max(times):.3f} ms  (n={len(times)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=["bigram", "jieba", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    modes = ["bigram", "jieba"] if args.tokenizer == "both" else [args.tokenizer]
    if "jieba" in modes:
        start = time.perf_counter()
        tokenize("预热", "jieba")
        print(f"jieba dictionary load: {(time.perf_counter() - start) * 1000:.0f} ms (once)")
    for layout in ("files", "sections"):
        for mode in modes:
            run(layout, mode, args.rounds)


if __name__ == "__main__":
    main()
