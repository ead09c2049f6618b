"""Retrieval benchmark: does recall find what was meant, and nothing when nothing was meant?

The fixture (``fixtures/retrieval/``, see its README) is the memory of one made-up project,
English and Chinese: ``MEMORY.md``, ``notes.md`` captures and session checkpoints (written with
the real ``memory.archive.write_checkpoint`` when the memory is built), and labelled queries in
four groups:

- ``same_words``: the query shares words with its target entry;
- ``paraphrase``: the query shares no content word with its target (checked here with the
  project's own tokenizer; the benchmark refuses to run otherwise);
- ``cross_language``: an English query for a Chinese entry or the reverse;
- ``unrelated``: a message about something else; the right answer is nothing.

Each method turns a query into a ranked list of entry texts. ``bigram``, ``jieba`` (BM25 alone)
and ``hybrid`` (with the embedding model of the ``semantic`` extra) go through the real recall
path (``MemoryCatalog(...).get(project).recall(text, MAX_HITS)``, as
proxy/injections/recall.py calls it); ``dense`` is the embedding model alone, for comparison.
A query's rank is the position of the first returned line that contains one of its targets;
recall@1, recall@5 and MRR are per group and method, and for ``unrelated`` the false-recall
rate: the share of queries that returned anything. Latency is the wall time of one method
call (p50 / p95 over every query).

The ranking constants (``memory.search``, ``memory.catalog.RECALL_FLOOR``,
``memory.semantic.MATCH_FLOOR``) were set on the even-numbered queries (``--half tuning``);
report the odd ones (``--half held-out``) beside them.

A new method is one more entry in ``METHODS`` (a factory that gets the built memory and returns
a ``Searcher``); ``hybrid`` and ``dense`` exist only where the extra is installed; methods
defined elsewhere pass ``extra_methods`` to ``main``.

    python -m benchmarks.retrieval [--methods bigram,jieba] [--half all|tuning|held-out]
        [--per-group N] [--pad N] [--misses METHOD] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from benchmarks import memory_search
from memory import semantic
from memory.archive import CHECKPOINT_FILE, write_checkpoint
from memory.catalog import _STOPWORDS, MemoryCatalog, MemorySettings
from memory.checkpoint import Checkpoint
from memory.project import global_memory_dir, project_memory_dir
from memory.store import MEMORY_FILE, NOTES_FILE, normalize
from memory.tokenize import TokenizerMode, tokenize
from proxy.injections.recall import MAX_HITS

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "retrieval"
GROUPS = ("same_words", "paraphrase", "cross_language", "unrelated")
# The fixture's "today": entry dates run from mid 2025 to October 2026.
NOW = date(2026, 11, 1)
TOP = 5  # recall@5

# Words a paraphrase may share with its target: function words the recall query keeps
# (``memory.catalog._STOPWORDS`` removes the rest) and Chinese particles.
_FUNCTION_WORDS = frozenset(
    " ".join(
        (
            "about after all also am another any been before being both did each even every",
            "get got had has he her here him his just least may more most much must new one",
            "only other out over own same she should some such than their them these they",
            "those through too up very were who whom whose yet",
            "的 了 是 在 和 与 或 也 都 就 要 会 能 可以 什么 怎么 怎样 哪 哪里 哪个 哪些",
            "吗 呢 吧 把 被 给 对 从 到 用 有 没有 还 再 又 这 那 一 个 多少 多久 为什么",
            "以后 之后 时 时候 里 上 下 后 前 中",
        )
    ).split(" ")
)
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "es", "ed", "ly", "s", "er")


@dataclass(frozen=True, slots=True)
class Query:
    id: str
    group: str
    text: str
    targets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BuiltMemory:
    """A project directory holding the fixture's memory, and every entry text it indexes."""

    data_dir: Path
    project: Path
    entries: tuple[str, ...]  # unique (by ``normalize``) entry texts, file order


# query -> entry texts, best first
Searcher = Callable[[str], Sequence[str]]
MethodFactory = Callable[[BuiltMemory], Searcher]


def recall_method(tokenizer: TokenizerMode, semantic: bool = False) -> MethodFactory:
    """Through ``ProjectMemory.recall``: the lines the proxy would inject (with ``semantic``,
    by meaning too: the embedding model of the ``semantic`` extra)."""

    def build(memory: BuiltMemory) -> Searcher:
        settings = MemorySettings(tokenizer=tokenizer, semantic=semantic)
        catalog = MemoryCatalog(memory.data_dir, settings)
        project = catalog.get(memory.project)

        def search(text: str) -> list[str]:
            return [line.text for line in project.recall(text, MAX_HITS, now=NOW)]

        search("warm up")  # the first search parses the files (and loads jieba, the model)
        return search

    return build


def dense_method(limit: int = 15) -> MethodFactory:
    """The embedding model alone, for comparison: entries by cosine, at or above its floor."""

    def build(memory: BuiltMemory) -> Searcher:
        embeddings = semantic.Embeddings(None)
        entries = list(memory.entries)
        matrix = embeddings.vectors(entries)

        def search(text: str) -> list[str]:
            similarity = matrix @ embeddings.query(text)
            best = sorted(range(len(entries)), key=lambda i: -similarity[i])[:limit]
            return [entries[i] for i in best if similarity[i] >= semantic.MATCH_FLOOR]

        return search

    return build


METHODS: dict[str, MethodFactory] = {
    "bigram": recall_method("bigram"),
    "jieba": recall_method("jieba"),
}


def available_methods() -> dict[str, MethodFactory]:
    """``METHODS``, and where the ``semantic`` extra is installed, the hybrid recall and the
    embedding model alone."""
    methods = dict(METHODS)
    if semantic.installed():
        methods["hybrid"] = recall_method("bigram", semantic=True)
        methods["dense"] = dense_method()
    return methods


# ---------------------------------------------------------------- fixture


def load_queries(fixture: Path = FIXTURE) -> list[Query]:
    queries: list[Query] = []
    with (fixture / "queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                raw = json.loads(line)
                queries.append(Query(raw["id"], raw["group"], raw["query"], tuple(raw["targets"])))
    return queries


def load_checkpoints(fixture: Path = FIXTURE) -> list[Checkpoint]:
    raw = json.loads((fixture / "checkpoints.json").read_text(encoding="utf-8"))
    checkpoints = [
        Checkpoint(
            session_id=item["session_id"],
            captured_at=datetime.fromisoformat(item["captured_at"]),
            message_count=item["message_count"],
            intents=item["intents"],
            decisions=item["decisions"],
            constraints=item["constraints"],
            gotchas=item["gotchas"],
            file_changes=item["file_changes"],
            files_read=[(path, count) for path, count in item["files_read"]],
        )
        for item in raw
    ]
    return sorted(checkpoints, key=lambda checkpoint: checkpoint.captured_at)


def build_memory(root: Path, fixture: Path = FIXTURE, pad: int = 0) -> BuiltMemory:
    """The fixture's memory as a project's ``.deep-memory/`` under ``root``; checkpoints in
    capture order, so ``checkpoint.md`` is the newest one (as after real compactions).

    ``pad``: that many synthetic entries (``benchmarks.memory_search``'s generator, about
    another project) go to the global memory, for latency at scale and recall among
    distractors."""
    data_dir, project = root / "data", root / "project"
    memory_dir = project_memory_dir(project)
    memory_dir.mkdir(parents=True)
    data_dir.mkdir()
    if pad > 0:
        global_dir = global_memory_dir(data_dir)
        global_dir.mkdir()
        filler = memory_search.memory_md(random.Random(7), pad)
        (global_dir / MEMORY_FILE).write_text(filler, encoding="utf-8")
    for name in (MEMORY_FILE, NOTES_FILE):
        shutil.copyfile(fixture / name, memory_dir / name)
    for checkpoint in load_checkpoints(fixture):
        write_checkpoint(
            memory_dir, checkpoint.session_id, checkpoint.captured_at, [], checkpoint.render()
        )
    index = MemoryCatalog(data_dir).get(project).index
    index.refresh()  # the archive copies are indexed on the first search; checkpoint.md holds
    assert (memory_dir / CHECKPOINT_FILE).exists()  # the newest, and the others are below
    texts: dict[str, str] = {}
    for document in index.documents:
        for entry in document.entries:
            texts.setdefault(normalize(entry.text), entry.text)
    for checkpoint in load_checkpoints(fixture):
        for text in _checkpoint_texts(checkpoint):
            texts.setdefault(normalize(text), text)
    return BuiltMemory(data_dir, project, tuple(texts.values()))


def _checkpoint_texts(checkpoint: Checkpoint) -> Iterator[str]:
    rendered = checkpoint.render()
    for line in rendered.splitlines():
        if line.startswith("- ") and line != "- (none)":
            yield line[2:].strip()


@contextmanager
def built_memory(fixture: Path = FIXTURE, pad: int = 0) -> Iterator[BuiltMemory]:
    with tempfile.TemporaryDirectory(prefix="deepmem-retrieval-") as tmp:
        yield build_memory(Path(tmp), fixture, pad)


# ---------------------------------------------------------------- fixture checks


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry meaning, crudely stemmed: the project's tokenizer
    (jieba for Chinese), recall's stopwords and the function words above left out."""
    words: set[str] = set()
    for token in tokenize(_STOPWORDS.sub(" ", text), "jieba"):
        if token in _FUNCTION_WORDS or not token.strip():
            continue
        words.add(_stem(token))
    return words


def _stem(token: str) -> str:
    if not token.isascii() or not token.isalpha():
        return token
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            token = token[: -len(suffix)]
            break
    return token[:-1] if token.endswith("e") and len(token) > 3 else token  # base / bases


def fixture_problems(queries: Sequence[Query], memory: BuiltMemory) -> list[str]:
    """Everything that makes the fixture wrong, as messages (empty: all good)."""
    problems: list[str] = []
    normalized = [normalize(entry) for entry in memory.entries]
    seen_ids: set[str] = set()
    for query in queries:
        if query.id in seen_ids:
            problems.append(f"{query.id}: duplicate id")
        seen_ids.add(query.id)
        if query.group not in GROUPS:
            problems.append(f"{query.id}: unknown group {query.group!r}")
        if (query.group == "unrelated") != (not query.targets):
            problems.append(f"{query.id}: unrelated queries and only they have no target")
        for target in query.targets:
            found = [
                entry
                for entry, key in zip(memory.entries, normalized, strict=True)
                if normalize(target) in key
            ]
            if len(found) != 1:
                problems.append(f"{query.id}: target {target!r} matches {len(found)} entries")
            elif query.group == "paraphrase":
                shared = content_words(query.text) & content_words(found[0])
                if shared:
                    problems.append(f"{query.id}: paraphrase shares {sorted(shared)}")
            elif query.group == "cross_language" and _has_han(query.text) == _has_han(found[0]):
                problems.append(f"{query.id}: query and target are in the same language")
    return problems


_HAN_RE = re.compile(r"[\u3400-\u9fff]")


def _has_han(text: str) -> bool:
    return len(_HAN_RE.findall(text)) >= 2


# ---------------------------------------------------------------- scoring


@dataclass(slots=True)
class GroupScore:
    queries: int = 0
    at_1: int = 0
    at_top: int = 0
    reciprocal: float = 0.0
    answered: int = 0  # queries that returned anything
    latencies_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, float | int]:
        count = self.queries or 1
        return {
            "queries": self.queries,
            "recall@1": round(self.at_1 / count, 3),
            f"recall@{TOP}": round(self.at_top / count, 3),
            "mrr": round(self.reciprocal / count, 3),
            "answered": round(self.answered / count, 3),
        }


def rank_of(query: Query, found: Sequence[str]) -> int | None:
    """1-based position of the first line containing one of the query's targets."""
    targets = [normalize(target) for target in query.targets]
    for position, text in enumerate(found, 1):
        key = normalize(text)
        if any(target in key for target in targets):
            return position
    return None


def score(queries: Sequence[Query], search: Searcher) -> dict[str, GroupScore]:
    groups = {group: GroupScore() for group in GROUPS}
    for query in queries:
        started = time.perf_counter()
        found = search(query.text)
        elapsed_ms = (time.perf_counter() - started) * 1000
        group = groups[query.group]
        group.queries += 1
        group.latencies_ms.append(elapsed_ms)
        group.answered += bool(found)
        rank = rank_of(query, found) if query.targets else None
        if rank is not None:
            group.at_1 += rank == 1
            group.at_top += rank <= TOP
            group.reciprocal += 1.0 / rank
    return groups


def percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(
    queries: Sequence[Query], methods: Mapping[str, MethodFactory], memory: BuiltMemory
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, factory in methods.items():
        started = time.perf_counter()
        search = factory(memory)
        build_ms = (time.perf_counter() - started) * 1000
        groups = score(queries, search)
        latencies = [ms for group in groups.values() for ms in group.latencies_ms]
        results[name] = {
            "groups": {group: groups[group].row() for group in GROUPS if groups[group].queries},
            "false_recall": groups["unrelated"].row()["answered"],
            "build_ms": round(build_ms, 1),
            "latency_ms": {
                "p50": round(statistics.median(latencies), 2) if latencies else 0.0,
                "p95": round(percentile(latencies, 0.95), 2),
            },
        }
    return results


def render_table(results: Mapping[str, Any]) -> str:
    header = (
        f"{'group':<15} {'method':<14} {'n':>4} {'R@1':>6} {'R@5':>6} {'MRR':>6} {'answered':>9}"
    )
    lines = [header, "-" * len(header)]
    for group in GROUPS:
        for name, result in results.items():
            row = result["groups"].get(group)
            if row is None:
                continue
            if group == "unrelated":
                lines.append(
                    f"{group:<15} {name:<14} {row['queries']:>4} {'':>6} {'':>6} {'':>6} "
                    f"{row['answered']:>9.3f}  (false recall)"
                )
            else:
                lines.append(
                    f"{group:<15} {name:<14} {row['queries']:>4} {row['recall@1']:>6.3f} "
                    f"{row[f'recall@{TOP}']:>6.3f} {row['mrr']:>6.3f} {row['answered']:>9.3f}"
                )
    lines.append("")
    for name, result in results.items():
        latency = result["latency_ms"]
        lines.append(
            f"{name:<14} build {result['build_ms']:.0f} ms, query p50 {latency['p50']:.2f} ms, "
            f"p95 {latency['p95']:.2f} ms"
        )
    return "\n".join(lines)


def misses(queries: Sequence[Query], search: Searcher) -> list[str]:
    """One line per query the method got wrong: a target not in the top ``TOP``, or an
    unrelated query that recalled something; with the first line it did return."""
    lines: list[str] = []
    for query in queries:
        found = search(query.text)
        rank = rank_of(query, found) if query.targets else None
        wrong = bool(found) if not query.targets else rank is None or rank > TOP
        if wrong:
            want = f" | want: {query.targets[0]}" if query.targets else ""
            got = found[0] if found else "(nothing)"
            lines.append(f"{query.id} (rank {rank}) | {query.text}{want} | got: {got}")
    return lines


HALVES = ("all", "tuning", "held-out")


def in_half(query: Query, half: str) -> bool:
    """Queries with an even number are the tuning half (the ranking constants were set on
    them), odd ones the held-out half."""
    if half == "all":
        return True
    even = int(query.id.rsplit("-", 1)[1]) % 2 == 0
    return even == (half == "tuning")


def select(queries: Sequence[Query], per_group: int | None, half: str = "all") -> list[Query]:
    queries = [query for query in queries if in_half(query, half)]
    if per_group is None:
        return list(queries)
    taken: dict[str, int] = {}
    chosen: list[Query] = []
    for query in queries:
        if taken.get(query.group, 0) < per_group:
            taken[query.group] = taken.get(query.group, 0) + 1
            chosen.append(query)
    return chosen


def main(
    argv: Sequence[str] | None = None, extra_methods: Mapping[str, MethodFactory] | None = None
) -> dict[str, Any]:
    methods = {**available_methods(), **(extra_methods or {})}
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--methods",
        default=",".join(methods),
        help=f"comma-separated, of {', '.join(methods)} (default: all)",
    )
    parser.add_argument("--per-group", type=int, default=None, help="first N queries per group")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--half",
        choices=HALVES,
        default="all",
        help="the queries to run: all, the tuning half (even numbers) or the held-out half",
    )
    parser.add_argument(
        "--pad",
        type=int,
        default=0,
        metavar="N",
        help="add N synthetic entries about another project (latency at scale, distractors)",
    )
    parser.add_argument(
        "--misses", metavar="METHOD", help="also list the queries METHOD gets wrong"
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.methods.split(",") if name.strip()]
    unknown = [name for name in [*chosen, args.misses or chosen[0]] if name not in methods]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {sorted(methods)}")
    queries = select(load_queries(), args.per_group, args.half)
    with built_memory(pad=args.pad) as memory:
        problems = fixture_problems(queries, memory)
        if problems:
            raise SystemExit("the fixture is wrong:\n  " + "\n  ".join(problems))
        results = run(queries, {name: methods[name] for name in chosen}, memory)
        wrong = misses(queries, methods[args.misses](memory)) if args.misses else None
    report: dict[str, Any] = {
        "entries": len(memory.entries),
        "queries": len(queries),
        "methods": results,
    }
    if wrong is not None:
        report["misses"] = {args.misses: wrong}
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(
            f"{report['entries']} entries, {report['queries']} queries ({args.half}), recall via "
            f"ProjectMemory.recall(text, {MAX_HITS}) at {NOW}"
        )
        print(render_table(results))
        if wrong is not None:
            print(f"\n{len(wrong)} queries {args.misses} gets wrong:")
            print("\n".join(wrong))
    return report


if __name__ == "__main__":
    main()
