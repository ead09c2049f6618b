"""Which project directory a request's memory belongs to, and whether we may write there.

The candidate comes from configuration, else a request header, else the `Working directory:`
line OpenCode puts in its system prompt. The first candidate given decides (there is no
silent fallback to the next one). It is accepted only when it is an absolute path without
`..`, exists, is a directory after resolving symlinks, and lies under an allowed root
(resolved too). A request can therefore never make the proxy write anywhere else.

A working directory read from the system prompt may be a subdirectory of the project
(`opencode run` started in `repo/src`), so it is widened to the project root, looking
upwards but never above the allowed root that holds it:

1. the nearest directory with a `.git` (directory, or file for worktrees and submodules);
2. else the `Workspace root folder:` OpenCode names, when it holds the working directory and
   is not the filesystem root (OpenCode names `/` outside a repository);
3. else the nearest directory that already has a memory directory (`.deep-memory`);
4. else the working directory itself.

Configuration and the header name the project exactly and are not widened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROJECT_HEADER = "X-Deep-Memory-Project"
DEFAULT_MEMORY_DIRNAME = ".deep-memory"
GLOBAL_MEMORY_DIRNAME = "memory"

_WORKING_DIR = re.compile(r"^[ \t]*Working directory:[ \t]*(?P<path>\S.*?)[ \t]*$", re.MULTILINE)
_WORKSPACE_ROOT = re.compile(
    r"^[ \t]*Workspace root folder:[ \t]*(?P<path>\S.*?)[ \t]*$", re.MULTILINE
)


@dataclass(frozen=True)
class Resolution:
    """The accepted project directory (or None), where it came from, and why."""

    path: Path | None
    source: str | None  # "config", "header", "system_prompt" or None
    reason: str

    @property
    def refused(self) -> bool:
        """A project was named but may not be used: none of its text is kept anywhere."""
        return self.path is None and self.source is not None


NO_PROJECT = Resolution(None, None, "no project was identified for this request")


def working_directory_from_prompt(system_prompt: str) -> str | None:
    """The path on OpenCode's `Working directory: /path` line, if any."""
    match = _WORKING_DIR.search(system_prompt or "")
    return match.group("path") if match else None


def workspace_root_from_prompt(system_prompt: str) -> str | None:
    """The path on OpenCode's `Workspace root folder: /path` line, if any."""
    match = _WORKSPACE_ROOT.search(system_prompt or "")
    return match.group("path") if match else None


def explain_project_dir(
    configured: Path | str | None,
    header: str | None,
    system_prompt: str,
    allowed_roots: list[Path],
    dirname: str = DEFAULT_MEMORY_DIRNAME,
) -> Resolution:
    """Resolve the project directory and say why it was accepted or refused."""
    working = working_directory_from_prompt(system_prompt)
    workspace = workspace_root_from_prompt(system_prompt)
    candidates = [
        ("config", None if configured is None else str(configured)),
        ("header", header),
        ("system_prompt", working or workspace),
    ]
    for source, raw in candidates:
        if raw is not None and raw.strip():
            found = check_project_dir(source, raw.strip(), allowed_roots)
            if source == "system_prompt" and found.path is not None:
                return _widened(found, workspace, allowed_roots, dirname)
            return found
    return Resolution(None, None, "no project directory in config, header or system prompt")


def _widened(
    found: Resolution, workspace: str | None, allowed_roots: list[Path], dirname: str
) -> Resolution:
    """The project root holding the accepted working directory (the module docstring's rule)."""
    assert found.path is not None
    start = found.path
    root = next(r for r in _resolved_roots(allowed_roots) if start.is_relative_to(r))
    upwards = [start, *(p for p in start.parents if p.is_relative_to(root))]
    chosen = next((p for p in upwards if (p / ".git").exists()), None)
    why = "git root"
    if chosen is None and workspace and workspace.strip():
        named = check_project_dir("system_prompt", workspace.strip(), allowed_roots).path
        if named is not None and named in upwards and named.parent != named:
            chosen, why = named, "workspace root"
    if chosen is None:
        chosen = next((p for p in upwards if (p / dirname).is_dir()), None)
        why = f"nearest {dirname}"
    if chosen is None or chosen == start:
        return found
    return Resolution(
        chosen, found.source, f"system_prompt project directory {chosen} ({why} of {start})"
    )


def check_project_dir(source: str, raw: str, allowed_roots: list[Path]) -> Resolution:
    """Accept ``raw`` (named by ``source``) only as an existing directory under a root."""

    def refuse(why: str) -> Resolution:
        return Resolution(None, source, f"{source} project directory {raw!r} refused: {why}")

    problem = _syntax_problem(raw)
    if problem:
        return refuse(problem)
    try:
        resolved = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        return refuse(f"does not exist or cannot be resolved ({exc.__class__.__name__})")
    if not resolved.is_dir():
        return refuse("not a directory")
    roots = _resolved_roots(allowed_roots)
    if not any(resolved.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(r) for r in roots) or "none configured"
        return refuse(f"{resolved} is not under an allowed root ({allowed})")
    return Resolution(resolved, source, f"{source} project directory {resolved}")


def _syntax_problem(raw: str) -> str | None:
    if "\x00" in raw:
        return "contains a NUL byte"
    path = Path(raw)
    if not path.is_absolute():
        return "not an absolute path"
    if ".." in path.parts:
        return "contains '..'"
    return None


def _resolved_roots(allowed_roots: list[Path]) -> list[Path]:
    roots: list[Path] = []
    for root in allowed_roots:
        try:
            roots.append(Path(root).expanduser().resolve(strict=True))
        except (OSError, RuntimeError):
            continue
    return roots


def project_memory_dir(project_dir: Path, dirname: str = DEFAULT_MEMORY_DIRNAME) -> Path:
    """`<project>/.deep-memory` (the directory name is configurable, but one plain name)."""
    if not dirname or Path(dirname).name != dirname or dirname in (".", ".."):
        raise ValueError(f"memory directory name must be a plain name, not {dirname!r}")
    return project_dir / dirname


def global_memory_dir(data_dir: Path) -> Path:
    """The memory directory shared by all projects, under the data dir."""
    return Path(data_dir) / GLOBAL_MEMORY_DIRNAME
