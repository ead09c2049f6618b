"""Project directory resolution: config > header > system prompt, only under allowed roots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory.project import (
    explain_project_dir,
    global_memory_dir,
    project_memory_dir,
    working_directory_from_prompt,
    workspace_root_from_prompt,
)
from memory.store import MemoryStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "opencode"


def prompt(path: Path | str) -> str:
    return (
        "You are OpenCode.\n<env>\n"
        f"  Working directory: {path}\n"
        "  Is directory a git repo: yes\n</env>\n"
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    (root / "proj").mkdir(parents=True)
    (root / "other").mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


def store_for_request(system_prompt: str, allowed: list[Path]) -> bool:
    """What the proxy does: resolve, and only then write memory."""
    project = explain_project_dir(None, None, system_prompt, allowed).path
    if project is None:
        return False
    MemoryStore(project_memory_dir(project)).store("Facts", "request fact", "2026-11-01")
    return True


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def test_working_directory_in_opencode_fixtures() -> None:
    prompts = [
        text
        for capture in sorted(FIXTURES.glob("*.json"))
        for text in _strings(json.loads(capture.read_text(encoding="utf-8")))
        if "Working directory:" in text
    ]
    assert len(prompts) >= 3
    for text in prompts:
        assert working_directory_from_prompt(text) == "/home/dev/demo-repo"


def test_system_prompt_inside_root_is_accepted(home: Path) -> None:
    result = explain_project_dir(None, None, prompt(home / "proj"), [home])
    assert result.path == (home / "proj").resolve()
    assert result.source == "system_prompt"
    assert store_for_request(prompt(home / "proj"), [home])
    assert (home / "proj" / ".deep-memory" / "MEMORY.md").exists()


def test_system_prompt_outside_root_writes_nothing(home: Path, outside: Path) -> None:
    result = explain_project_dir(None, None, prompt(outside), [home])
    assert result.path is None and "not under an allowed root" in result.reason
    assert not store_for_request(prompt(outside), [home])
    assert not (outside / ".deep-memory").exists()
    assert list(outside.iterdir()) == []


def test_symlink_escape_refused(home: Path, outside: Path) -> None:
    link = home / "escape"
    link.symlink_to(outside, target_is_directory=True)
    assert explain_project_dir(None, None, prompt(link), [home]).path is None
    assert not store_for_request(prompt(link), [home])
    assert not (outside / ".deep-memory").exists()


def test_symlinked_root_and_inside_link_accepted(tmp_path: Path, home: Path) -> None:
    root_link = tmp_path / "home-link"
    root_link.symlink_to(home, target_is_directory=True)
    inner = home / "inner-link"
    inner.symlink_to(home / "proj", target_is_directory=True)
    assert (
        explain_project_dir(None, None, prompt(inner), [root_link]).path
        == (home / "proj").resolve()
    )


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("does-not-exist", "does not exist"),
        ("relative", "not an absolute path"),
        ("dotdot", "contains '..'"),
        ("file", "not a directory"),
        ("nul", "NUL"),
    ],
)
def test_bad_paths_refused(home: Path, outside: Path, raw: str, why: str) -> None:
    (home / "a-file").write_text("x")
    candidates = {
        "does-not-exist": str(home / "missing"),
        "relative": "proj",
        "dotdot": f"{home}/proj/../../outside",
        "file": str(home / "a-file"),
        "nul": f"{home}/proj\x00",
    }
    result = explain_project_dir(None, None, prompt(candidates[raw]), [home])
    assert result.path is None and why in result.reason, result.reason
    assert result.source == "system_prompt"


def test_dotdot_staying_inside_root_is_still_refused(home: Path) -> None:
    header = f"{home}/other/../proj"
    assert explain_project_dir(None, header, "", [home]).path is None


def test_header_beats_system_prompt(home: Path) -> None:
    result = explain_project_dir(None, str(home / "other"), prompt(home / "proj"), [home])
    assert result.path == (home / "other").resolve() and result.source == "header"


def test_configured_beats_header(home: Path) -> None:
    result = explain_project_dir(home / "proj", str(home / "other"), prompt(home / "other"), [home])
    assert result.path == (home / "proj").resolve() and result.source == "config"


def test_refused_header_does_not_fall_back(home: Path, outside: Path) -> None:
    result = explain_project_dir(None, str(outside), prompt(home / "proj"), [home])
    assert result.path is None and result.source == "header"


def test_nothing_given(home: Path) -> None:
    result = explain_project_dir(None, None, "no env block here", [home])
    assert result.path is None and result.source is None
    assert explain_project_dir(None, "  ", "", [home]).path is None


def test_no_allowed_roots_refuses_everything(home: Path) -> None:
    assert explain_project_dir(home / "proj", None, "", []).path is None


def test_memory_dir_helpers(tmp_path: Path) -> None:
    assert project_memory_dir(tmp_path) == tmp_path / ".deep-memory"
    assert project_memory_dir(tmp_path, "mem") == tmp_path / "mem"
    for bad in ("../x", "a/b", "..", ""):
        with pytest.raises(ValueError):
            project_memory_dir(tmp_path, bad)
    assert global_memory_dir(tmp_path) == tmp_path / "memory"


def opencode_prompt(working: Path, workspace: Path | str) -> str:
    return (
        "You are OpenCode.\n<env>\n"
        f"  Working directory: {working}\n"
        f"  Workspace root folder: {workspace}\n"
        "  Is directory a git repo: yes\n</env>\n"
    )


def test_workspace_root_in_opencode_fixtures() -> None:
    prompts = [
        text
        for capture in sorted(FIXTURES.glob("*.json"))
        for text in _strings(json.loads(capture.read_text(encoding="utf-8")))
        if "Workspace root folder:" in text
    ]
    assert prompts
    for text in prompts:
        assert workspace_root_from_prompt(text) == "/home/dev/demo-repo"


def test_subdirectory_of_a_git_repository_gets_the_repositorys_memory(home: Path) -> None:
    repo = home / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "src" / ".deep-memory").mkdir()  # left behind by the old rule: the git root wins
    for working in (repo / "src", repo / "src" / "pkg"):
        result = explain_project_dir(None, None, prompt(working), [home])
        assert result.path == repo.resolve() and "git root" in result.reason
    assert store_for_request(prompt(repo / "src"), [home])
    assert (repo / ".deep-memory" / "MEMORY.md").exists()
    assert not (repo / "src" / ".deep-memory" / "MEMORY.md").exists()


def test_git_worktree_file_counts_as_a_git_root(home: Path) -> None:
    (home / "proj" / "lib").mkdir()
    (home / "proj" / ".git").write_text("gitdir: /elsewhere/.git/worktrees/proj\n")
    result = explain_project_dir(None, None, prompt(home / "proj" / "lib"), [home])
    assert result.path == (home / "proj").resolve()


def test_workspace_root_then_existing_memory_then_the_directory_itself(home: Path) -> None:
    deep = home / "proj" / "a" / "b"
    deep.mkdir(parents=True)
    named = explain_project_dir(None, None, opencode_prompt(deep, home / "proj"), [home])
    assert named.path == (home / "proj").resolve() and "workspace root" in named.reason
    # OpenCode names "/" outside a repository: not a project root
    (home / "proj" / "a" / ".deep-memory").mkdir()
    found = explain_project_dir(None, None, opencode_prompt(deep, "/"), [home])
    assert found.path == (home / "proj" / "a").resolve()
    plain = explain_project_dir(None, None, prompt(home / "other"), [home])
    assert plain.path == (home / "other").resolve()


def test_widening_never_leaves_the_allowed_root(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # a repository around the allowed root
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    result = explain_project_dir(None, None, opencode_prompt(root / "proj", tmp_path), [root])
    assert result.path == (root / "proj").resolve()


def test_header_and_config_are_not_widened(home: Path) -> None:
    (home / "proj" / ".git").mkdir()
    (home / "proj" / "sub").mkdir()
    sub = home / "proj" / "sub"
    assert explain_project_dir(None, str(sub), "", [home]).path == sub.resolve()
    assert explain_project_dir(sub, None, "", [home]).path == sub.resolve()
