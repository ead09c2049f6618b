"""The kinds of injection one by one, and how a moment's pieces compose into blocks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from compressors.pipeline import SeenTexts
from compressors.view import Conversation, Dialect
from compressors.wire import parse_conversation
from memory.catalog import MemoryCatalog, MemorySettings
from memory.injection import RECALL_KIND, RESUME_KIND, STABLE_KIND, TAG
from memory.injection_memo import Injected, SessionInjections
from proxy.config import Settings
from proxy.flow import Flow
from proxy.injections import build_injections
from proxy.injections.base import MemoryReader, MemoryReport, Moment, Piece, compose
from proxy.injections.captures import Captures
from proxy.injections.nudges import Nudges
from proxy.injections.recall import Recall
from proxy.injections.resume import Resume
from proxy.injections.stable import StableBlock
from proxy.memory_stage import _user_turns, message_anchors
from proxy.sessions import RequestKind

MEMORY_MD = """# Project Memory

## Decisions

- Deploys go through the staging cluster first [2026-10-02]

## Constraints

- Never call the network from the request path
"""
TOOLS = [{"type": "function", "function": {"name": "deepmem_memory_store", "parameters": {}}}]


def moment(tmp_path: Path, users: list[str], memo: SessionInjections | None = None) -> Moment:
    project = tmp_path / "project"
    (project / ".deep-memory").mkdir(parents=True, exist_ok=True)
    (project / ".deep-memory" / "MEMORY.md").write_text(MEMORY_MD, encoding="utf-8")
    messages = [{"role": "system", "content": "You are a coding agent."}]
    for text in users:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    body = {"model": "m", "messages": messages[:-1], "tools": TOOLS}
    conversation = parse_conversation(Dialect.OPENAI_CHAT, body)
    flow = Flow(Dialect.OPENAI_CHAT, "session-1", RequestKind.AGENT)
    memory = MemoryCatalog(tmp_path / "data", MemorySettings(".deep-memory")).get(project)
    return Moment(
        conversation,
        flow,
        memory,
        memo or SessionInjections(),
        conversation.user_messages(),
        MemoryReport(project, "test"),
    )


def at_newest(found: Moment) -> Moment:
    found.message, found.newest = len(found.users) - 1, True
    return found


def test_pieces_compose_into_one_block_per_kind_in_order_with_their_tags():
    text, tags = compose(
        [
            Piece(RESUME_KIND, "checkpoint", "resume:1"),
            Piece(RECALL_KIND, "hits"),
            Piece(RECALL_KIND, "nudge", "memory"),
        ]
    )
    assert text == (
        f'<{TAG} kind="resume">\ncheckpoint\n</{TAG}>\n\n'
        f'<{TAG} kind="recall">\nhits\n\nnudge\n</{TAG}>'
    )
    assert tags == ("resume:1", "memory")
    assert compose([]) == ("", ())


def test_the_stable_block_speaks_at_the_start_only(tmp_path):
    stable = StableBlock(600, MemoryReader())
    start = moment(tmp_path, ["hello"])
    (piece,) = stable.decide(start)
    assert piece.block == STABLE_KIND and "Never call the network" in piece.text
    assert stable.decide(at_newest(moment(tmp_path, ["hello"]))) == []


def test_recall_answers_the_newest_message_and_counts_what_it_shows(tmp_path):
    recall = Recall(1000, 400, MemoryReader())
    found = at_newest(moment(tmp_path, ["how do deploys reach the staging cluster?"]))
    (piece,) = recall.decide(found)
    assert "staging cluster first" in piece.text and found.report.hits == 1
    older = moment(tmp_path, ["how do deploys reach the staging cluster?", "thanks"])
    older.message = 0
    assert recall.decide(older) == []


def test_recall_leaves_out_what_the_resume_block_shows(tmp_path):
    """Regression: a session's first recall block repeated lines its resume block showed."""
    recall = Recall(1000, 400, MemoryReader())
    found = at_newest(moment(tmp_path, ["how do deploys reach the staging cluster?"]))
    (piece,) = recall.decide(found)
    line = next(line for line in piece.text.splitlines() if "staging cluster first" in line)
    text = line.split(") ", 1)[1].rsplit(" [", 1)[0]
    again = at_newest(moment(tmp_path, ["how do deploys reach the staging cluster?"]))
    again.shown = [Piece(RESUME_KIND, f"checkpoint essentials:\n- {text}", "resume:1")]
    assert all("staging cluster first" not in p.text for p in recall.decide(again))


def test_a_nudge_waits_for_its_cooldown(tmp_path):
    nudges = Nudges(cooldown_turns=5, pressure_tokens=1)
    found = at_newest(moment(tmp_path, ["We decided to always use uv from now on", "go on"]))
    kinds = [piece.tag for piece in nudges.decide(found)]
    assert kinds == ["memory", "pressure"] and found.report.nudges == ("memory", "pressure")
    given = SessionInjections(by_anchor={"a#0": Injected("", 0, ("memory", "pressure"))})
    later = at_newest(moment(tmp_path, ["We decided to always use uv from now on", "go"], given))
    assert nudges.decide(later) == []


def test_resume_offers_another_sessions_checkpoint_only_on_a_first_message(tmp_path):
    resume = Resume(800)
    first = at_newest(moment(tmp_path, ["continue"]))
    assert resume.decide(first) == []  # no checkpoint anywhere yet
    seen = SessionInjections(by_anchor={"a#0": Injected("", 0)})
    assert resume.decide(at_newest(moment(tmp_path, ["continue", "more"], seen))) == []


def test_captures_add_nothing_but_keep_the_note(tmp_path):
    found = at_newest(moment(tmp_path, ["Remember: the CI runs on Python 3.11 only"]))
    assert Captures().decide(found) == [] and found.report.captured
    assert "Python 3.11 only" in found.memory.store.notes()
    # The index takes the note in once the answer is out (deferred), not at the next search.
    for job in found.flow.after:
        job()
    memory = found.memory
    assert memory.store.notes_path in memory.index.paths
    with memory.index_lock:
        assert memory.index.refresh() is False


def test_the_list_follows_the_settings_in_block_order():
    kinds = [type(i) for i in build_injections(Settings())]
    assert kinds == [StableBlock, Resume, Recall, Nudges, Captures]
    quiet = replace(Settings(), memory_inject=False, resume=False, memory_nudges=False)
    assert [type(i) for i in build_injections(quiet)] == [Captures]


def test_a_store_that_keeps_no_live_copy_still_sends_the_same_bytes_first(tmp_path):
    """The first request of a session carries what later ones do, even when the memo store
    hands out a fresh copy on every load (nothing kept live)."""
    import orjson

    from memory.db import open_database
    from memory.injection_memo import InjectionMemo
    from memory.project import Resolution
    from proxy.memory_stage import MemoryStage

    found = moment(tmp_path, ["how do deploys reach the staging cluster?"])
    catalog = MemoryCatalog(tmp_path / "data", MemorySettings(".deep-memory"))
    memo = InjectionMemo(open_database(None), live_bytes=1)
    stage = MemoryStage(catalog, memo, build_injections(Settings()))
    project = found.memory.project_dir
    sent = []
    for _ in range(2):
        body = orjson.loads(orjson.dumps(found.conversation.body))
        conversation = parse_conversation(Dialect.OPENAI_CHAT, body)
        flow = Flow(Dialect.OPENAI_CHAT, "session-1", RequestKind.AGENT)
        flow.project = Resolution(project, "config", "test")
        assert stage.request(conversation, flow)
        sent.append(orjson.dumps(body))
    assert sent[0] == sent[1] and b"Never call the network" in sent[0]
    assert b"staging cluster first" in sent[0]


def test_the_memory_stage_reads_only_the_user_turns_a_step_adds(monkeypatch):
    """A session's steps share their repeated message objects: the user turns and anchors
    read from what the last step found (``SeenTexts.carried``) are those a whole read gives,
    copies of a text counted across the two parts, and only the messages after the repeated
    ones are read; a message sent again as another object is read again."""
    starts: list[int] = []
    whole_read = Conversation.user_messages

    def user_messages(self: Conversation, start: int = 0) -> list[tuple[int, str]]:
        starts.append(start)
        return whole_read(self, start)

    monkeypatch.setattr(Conversation, "user_messages", user_messages)
    seen = SeenTexts()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    steps = [["fix it", "ok"], ["fix it", "done?"], ["again"], ["fix it"]]
    for step, texts in enumerate(steps):
        repeated = len(messages) if step else 0
        if step == 3:  # the client sends the last step's last message again, changed
            messages[-1] = {**messages[-1], "content": "k!"}
            repeated -= 1
        for text in texts:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "k"}]
        body = {"model": "m", "messages": list(messages), "tools": TOOLS}
        starts.clear()
        found = _user_turns(parse_conversation(Dialect.OPENAI_CHAT, body), seen)
        starts_seen = list(starts)
        whole = parse_conversation(Dialect.OPENAI_CHAT, {**body})
        assert found.users == whole_read(whole)
        assert found.anchors == message_anchors(found.users)
        assert starts_seen == [repeated]
    assert len(set(found.anchors)) == len(found.anchors)
