"""Which project a request belongs to: memoised per session, never poisoned by a compaction."""

from __future__ import annotations

import pytest

from compressors.view import Dialect
from compressors.wire import parse_conversation
from proxy.projects import ProjectResolver


def chat(system: str):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
    return parse_conversation(Dialect.OPENAI_CHAT, body)


def test_a_session_reads_its_working_directory_once(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    resolver = ProjectResolver(None, (tmp_path,))
    assert resolver.for_request(None, chat(f"Working directory: {first}"), "s1").path == first
    # Same session: the memoised answer, not a new reading of the prompt.
    assert resolver.for_request(None, chat(f"Working directory: {second}"), "s1").path == first
    assert resolver.for_request(None, chat(f"Working directory: {second}"), "s2").path == second
    # A header is part of the key.
    assert resolver.for_request(str(second), chat(""), "s1").path == second


def test_a_compaction_seen_first_does_not_hide_the_agents_project(tmp_path):
    project = tmp_path / "app"
    project.mkdir()
    resolver = ProjectResolver(None, (tmp_path,))
    summarizer = chat("You are a context summarization agent.")
    assert resolver.for_request(None, summarizer, "s", agent=False).path is None
    agent = chat(f"Working directory: {project}")
    assert resolver.for_request(None, agent, "s").path == project
    assert resolver.for_request(None, summarizer, "s", agent=False).path == project


def test_a_vanished_directory_is_looked_up_again(tmp_path):
    project = tmp_path / "app"
    project.mkdir()
    resolver = ProjectResolver(None, (tmp_path,))
    assert resolver.for_request(None, chat(f"Working directory: {project}"), "s").path == project
    project.rmdir()
    assert resolver.for_request(None, chat(f"Working directory: {project}"), "s").path is None


def test_a_refused_call_project_names_its_source_once(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    resolver = ProjectResolver(outside, (root,))
    messages = []
    for argument, endpoint in ((str(outside), None), (None, str(outside)), (None, None)):
        with pytest.raises(ValueError) as refused:
            resolver.for_call(argument, endpoint)
        messages.append(str(refused.value))
    assert [message.split(" '/")[0] for message in messages] == [
        "the 'project' argument's project directory",
        "the endpoint's project directory",
        "the configured project directory",
    ]
    assert all("project project" not in message for message in messages)


def test_an_unreachable_shared_activity_never_makes_a_call_guess_its_project(tmp_path):
    """With replicas, which project the sessions work in is in the shared state: while it
    cannot be read, a memory call without a project is refused, not sent to the global memory."""
    from memory.state import StateUnavailable
    from proxy.projects import AmbiguousProject, ProjectResolver

    class Away:
        def note(self, session_id: str, project: str, now: float) -> None:
            pass

        def project_of(self, session_id: str) -> str | None:
            raise StateUnavailable("cannot read the project of session s on redis://h/0")

        def active_since(self, since: float) -> list[str]:
            raise StateUnavailable("cannot read the active projects on redis://h/0")

    resolver = ProjectResolver(None, (tmp_path,), activity=Away())
    with pytest.raises(AmbiguousProject, match=r"unknown now .*pass 'project'"):
        resolver.for_call(None, None)
    assert resolver.for_call(str(tmp_path), None).path == tmp_path
