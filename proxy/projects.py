"""Which project a request or a tool call works on.

A chat request names its project through configuration, the ``X-Deep-Memory-Project`` header
or OpenCode's ``Working directory:`` line (``memory.project`` checks it lies under an allowed
root). An MCP or HTTP memory call carries no working directory, so it is chosen by one rule,
first match wins:

1. the call's own ``project`` argument (or ``?project=`` query parameter);
2. the endpoint's project: ``/mcp?project=DIR`` or the ``X-Deep-Memory-Project`` header on the
   MCP/HTTP request (OpenCode's remote MCP config can set either);
3. the configured ``project_dir``;
4. the project of the agent sessions active in the last ``ACTIVE_WINDOW`` seconds, when they
   all share one; when they name two or more, the call is refused with the list, never
   guessed;
5. otherwise no project: searches read the global memory only and stores go there.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache

from compressors.view import Conversation
from memory.in_process import LocalActivity
from memory.interfaces import ProjectActivity
from memory.project import (
    DEFAULT_MEMORY_DIRNAME,
    PROJECT_HEADER,
    Resolution,
    check_project_dir,
    explain_project_dir,
)
from memory.state import StateUnavailable
from proxy.flow import Flow
from proxy.options import Option, parse_dir_name, parse_list, parse_optional_str
from proxy.sessions import RequestKind

ACTIVE_WINDOW = 600.0


OPTIONS: tuple[Option, ...] = (
    Option(
        "project_dir",
        parse_optional_str,
        None,
        "Project whose .deep-memory/ every request uses, instead of the X-Deep-Memory-Project "
        "header or the 'Working directory:' line of OpenCode's system prompt. It must still lie "
        "under an allowed root.",
        "DIR",
    ),
    Option(
        "allowed_roots",
        parse_list,
        [],
        "Directories under which a project's .deep-memory/ may be read and written; a request "
        "naming a directory elsewhere gets no project memory. Empty: the user's home.",
        "DIR,...",
    ),
    Option(
        "memory_dir_name",
        parse_dir_name,
        ".deep-memory",
        "Name of the memory directory inside a project.",
        "NAME",
    ),
)


class AmbiguousProject(ValueError):
    """Several projects are active and the call did not say which one it means."""


@dataclass(frozen=True, slots=True)
class ProjectChoice:
    path: Path | None
    source: str  # "argument", "endpoint", "config", "active session", "none"


class ProjectResolver:
    """Shared by the rewrite threads and the memory endpoints: its caches change under a lock."""

    def __init__(
        self,
        configured: Path | None,
        allowed_roots: tuple[Path, ...],
        dirname: str = DEFAULT_MEMORY_DIRNAME,
        activity: ProjectActivity | None = None,
    ) -> None:
        self.configured = configured
        self.allowed_roots = list(allowed_roots)
        self.dirname = dirname
        # Which project each session names: shared by replicas when the state is.
        self.activity: ProjectActivity = activity or LocalActivity()
        self._cache: LRUCache[tuple[str, str | None], Resolution] = LRUCache(maxsize=4096)
        self._lock = threading.Lock()

    def for_request(
        self, header: str | None, conversation: Conversation, session_id: str, agent: bool = True
    ) -> Resolution:
        """The project of a chat request, memoised per session and header: a session's
        working directory does not change, so an agent's system prompt is read once.

        A request without a working directory of its own (``agent`` false: a compaction
        request carries the summarizer's prompt) gets the project its session last named, and
        is not memoised, so the session's next agent request still reads its own prompt.
        """
        key = (session_id, header)
        with self._lock:
            found = self._cache.get(key)
        if found is None or (found.path is not None and not found.path.is_dir()):
            found = explain_project_dir(
                self.configured, header, conversation.system_text, self.allowed_roots, self.dirname
            )
            if agent:
                with self._lock:
                    self._cache[key] = found
        if found.path is not None:
            self.activity.note(session_id, str(found.path), time.time())
            return found
        if agent or found.source is not None:
            # An agent request names no project: neither do the others of its session (they
            # carry the same system prompt), so only a compaction request asks what it was.
            return found
        try:
            known = self.activity.project_of(session_id)
        except StateUnavailable as exc:
            return Resolution(None, None, f"the project of session {session_id} is unknown: {exc}")
        if known is not None:
            return Resolution(Path(known), "session", f"the project session {session_id} named")
        return found

    def for_session(self, session_id: str) -> Path | None:
        """The project the session's requests last named, if one was seen."""
        known = self.activity.project_of(session_id)
        return Path(known) if known is not None else None

    def check(self, raw: str, source: str) -> Path:
        """An explicitly named project, or ``ValueError`` saying why it is refused."""
        resolution = check_project_dir(source, raw.strip(), self.allowed_roots)
        if resolution.path is None:
            raise ValueError(resolution.reason)
        return resolution.path

    def active(self, window: float = ACTIVE_WINDOW) -> list[Path]:
        return [Path(path) for path in self.activity.active_since(time.time() - window)]

    def for_call(self, argument: str | None, endpoint: str | None) -> ProjectChoice:
        """The project of an MCP/HTTP memory call, by the rule in this module's docstring."""
        if argument:
            return ProjectChoice(self.check(argument, "the 'project' argument's"), "argument")
        if endpoint:
            return ProjectChoice(self.check(endpoint, "the endpoint's"), "endpoint")
        if self.configured is not None:
            return ProjectChoice(self.check(str(self.configured), "the configured"), "config")
        try:
            active = self.active()
        except StateUnavailable as exc:  # a shared state backend is away: never guess
            raise AmbiguousProject(
                f"the active sessions' project is unknown now ({exc}); pass 'project' with the "
                "absolute path of the one you mean"
            ) from exc
        if len(active) == 1:
            return ProjectChoice(active[0], "active session")
        if len(active) > 1:
            names = ", ".join(str(path) for path in active)
            raise AmbiguousProject(
                f"sessions in several projects are active ({names}); pass 'project' with the "
                "absolute path of the one you mean"
            )
        return ProjectChoice(None, "none")


@dataclass
class IdentifyProject:
    """The first addon whenever memory is served: the project of an agent or compaction request,
    found once, before any other addon reads ``flow.project``."""

    projects: ProjectResolver

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        if flow.kind not in (RequestKind.AGENT, RequestKind.COMPACTION):
            return False
        header = flow.headers.get(PROJECT_HEADER) if flow.headers is not None else None
        # A compaction request carries the summarizer's prompt, not the agent's: it takes the
        # project its session last named (see ``for_request``).
        flow.project = self.projects.for_request(
            header, conversation, flow.session_id, agent=flow.kind is RequestKind.AGENT
        )
        return False
