"""The house plan (DESIGN.md section 1): data flows one way down the three packages, and no
module imports another that imports it back, however late."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compressors", "memory", "proxy")
MAY_NOT_IMPORT = {"compressors": {"memory", "proxy"}, "memory": {"proxy"}, "proxy": set()}


def _imports() -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside a function (an
    import put off to dodge a cycle is still one); imports only for type checkers
    (``if TYPE_CHECKING:``) are left out: they never run."""
    graph: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            typing_only = {
                id(inner)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for inner in ast.walk(node)
            }
            for node in ast.walk(tree):
                if id(node) in typing_only:
                    continue
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                graph[module].update(
                    n for n in names if n.split(".")[0] in PACKAGES and n != module
                )
    return graph


def test_each_package_imports_only_those_below_it() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in _imports().items()
        for target in targets
        if target.split(".")[0] in MAY_NOT_IMPORT[module.split(".")[0]]
    ]
    assert wrong == []


def test_no_import_cycle() -> None:
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_a_gap_line_is_costed_in_one_place() -> None:
    """``compressors.markers.GAP_COST``, next to ``gap_line``; no compressor keeps its own."""
    own = []
    for path in (ROOT / "compressors").rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and "GAP_COST" in t.id for t in targets):
                own.append(path.relative_to(ROOT).as_posix())
    assert own == ["compressors/markers.py"]
