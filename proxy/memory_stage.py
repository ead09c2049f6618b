"""The memory stage of the request path: captures, recalled hits, nudges and the stable block.

Runs after compression, on agent requests only. Where injected text goes (DESIGN.md §3.6):

- the **stable block** (constraints and decisions, decided on the session's first request and
  then fixed) is appended after the system prompt, as its last bytes, so the prompt prefix
  before it never changes;
- **hits and nudges** for a user message are decided on the first request that carries the
  message and appended to the end of that message; every later request of the session
  re-applies the remembered text to the same message, byte for byte.

Neither adds a ``cache_control`` marker. A message gets new text only while it is the newest
user message, so bytes the provider has already cached are never changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import xxhash

from compressors.tokens import estimate_bytes_tokens, estimate_tokens
from compressors.view import Conversation, Kind, Role
from memory.archive import latest_checkpoint, session_checkpoints, session_dirname
from memory.catalog import MemoryCatalog, ProjectMemory
from memory.checkpoint import Checkpoint, essentials
from memory.files import LockTimeout, read_text
from memory.injection import Line, defang, recall_block, stable_block, wrap
from memory.injection_memo import Injected, SessionInjections
from memory.interfaces import InjectionMemos
from memory.project import NO_PROJECT
from memory.signals import capture, nudge_reasons
from memory.state import StateUnavailable
from memory.store import MemoryStoreError
from proxy.config import Settings
from proxy.flow import Flow
from proxy.health import Health
from proxy.sessions import PARENT_SESSION_HEADER, RequestKind, Tally

log = logging.getLogger("deepmem.memory")

INJECTION_STATE = "state_db_injections"  # the /health component for the injection memo
RESUME_OWN = "This conversation was compacted; deepmem saved a checkpoint first. Its essentials:"
RESUME_OTHER = (
    "deepmem's checkpoint of an earlier session in this project ({session}, {when}), for "
    "continuity; the user's message above comes first."
)
MAX_HITS = 5
MEMORY_STORE_TOOL = "memory_store"


@dataclass(slots=True)
class MemoryReport:
    project: Path | None
    project_reason: str  # why the project was accepted, or why none was
    new_turn: bool = False
    hits: int = 0
    captured: bool = False
    nudges: tuple[str, ...] = ()  # the kinds of reminder given with a new user message
    resumed: str = ""  # the tag of the checkpoint the new user message resumes, if any
    notes: list[str] = field(default_factory=list)
    injected_tokens: int = 0  # estimated tokens this request carries because of memory blocks

    def account(self, tally: Tally) -> None:
        tally.tokens_injected += self.injected_tokens
        if self.new_turn:
            tally.memory_turns += 1
            tally.memory_hits += self.hits
            tally.memory_nudges += len(self.nudges)
            tally.memory_captures += self.captured


def message_anchors(users: list[tuple[int, str]]) -> list[str]:
    """A key per user message: a hash of its text and how many earlier ones had that text."""
    seen: dict[str, int] = {}
    anchors = []
    for _, text in users:
        digest = xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
        copy = seen.get(digest, 0)
        seen[digest] = copy + 1
        anchors.append(f"{digest}#{copy}")
    return anchors


def _previous_turn_texts(conversation: Conversation, users: list[tuple[int, str]]) -> list[str]:
    """The user text and assistant text of the turn before the newest user message."""
    if len(users) < 2:
        return [users[-1][1]] if users else []
    start, end = users[-2][0], users[-1][0]
    texts = [users[-2][1]]
    texts += [
        item.text
        for item in conversation.items
        if item.role is Role.ASSISTANT and item.kind is Kind.TEXT and start < item.message < end
    ]
    return [*texts, users[-1][1]]


@dataclass
class MemoryStage:
    """An addon: remembers, recalls and reminds; every decision memoised per session."""

    settings: Settings
    catalog: MemoryCatalog
    memo: InjectionMemos
    health: Health | None = None

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        try:
            changed = self._inject(conversation, flow)
        except StateUnavailable as exc:  # the hook forwards the original bytes
            if self.health is not None:
                self.health.report(INJECTION_STATE, str(exc))
            raise
        if self.health is not None:
            self.health.clear(INJECTION_STATE)
        return changed

    def _inject(self, conversation: Conversation, flow: Flow) -> bool:
        if flow.kind is not RequestKind.AGENT:
            return False
        resolution = flow.project or NO_PROJECT
        report = MemoryReport(resolution.path, resolution.reason)
        flow.reports.append(report)
        if resolution.path is None and log.isEnabledFor(logging.DEBUG):
            log.debug("session %s: no project memory (%s)", flow.session_id, resolution.reason)
        if resolution.refused:
            # A directory outside the allowed roots: its messages are neither captured (not
            # even into the global memory) nor answered with memory of other projects.
            return False
        memory = self.catalog.get(resolution.path)
        memo = self.memo.load(flow.session_id)
        changed = False
        if self.settings.memory_inject:
            if memo.stable is None:
                lines = (
                    self._read(memory.stable_lines) if self.settings.memory_stable_tokens else []
                )
                self.memo.set_stable(
                    flow.session_id, stable_block(lines, self.settings.memory_stable_tokens)
                )
            if memo.stable:
                changed = conversation.append_to_system(memo.stable)
                report.injected_tokens += estimate_tokens(memo.stable) if changed else 0
        users = conversation.user_messages()
        if not users:
            return changed
        anchors = message_anchors(users)
        fresh = [k for k, anchor in enumerate(anchors) if anchor not in memo.by_anchor]
        resume = ("", "", False)
        if fresh and self.settings.resume and self.settings.resume_tokens:
            resume = self._resume(memory, memo, flow)
        if resume[2] and fresh[0] != len(anchors) - 1:
            # After a compaction OpenCode restarts the history with "What did we do so far?"
            # and the summary; the checkpoint goes with that first message not seen before,
            # which may not be the newest (a compaction in mid tool loop continues the turn).
            self.memo.add(
                flow.session_id, anchors[fresh[0]], Injected(resume[0], memo.turns, (resume[1],))
            )
            resume = ("", "", False)
        if anchors[-1] not in memo.by_anchor:
            report.new_turn = True
            self._new_turn(conversation, flow, memory, memo, users, anchors[-1], report, resume[:2])
        for k in fresh:  # older messages seen for the first time: nothing to add, look once
            if anchors[k] not in memo.by_anchor:
                self.memo.add(flow.session_id, anchors[k], Injected("", memo.turns))
        for (index, _), anchor in zip(users, anchors, strict=True):
            injected = memo.by_anchor.get(anchor)
            text = injected.text if injected is not None else ""
            if text and conversation.append_to_message(index, text):
                report.injected_tokens += estimate_tokens(text)
                changed = True
        return changed

    def _new_turn(
        self,
        conversation: Conversation,
        flow: Flow,
        memory: ProjectMemory,
        memo: SessionInjections,
        users: list[tuple[int, str]],
        anchor: str,
        report: MemoryReport,
        resume: tuple[str, str],
    ) -> None:
        settings = self.settings
        text = users[-1][1]
        first = memo.turns == 0
        lines = []
        budget = settings.memory_first_recall_tokens if first else settings.memory_recall_tokens
        if settings.memory_inject and budget:
            stable = memo.stable or ""
            found = self._read(lambda: memory.recall(text, MAX_HITS))
            lines = [line for line in found if line.render() not in stable]
        nudges = self._nudges(conversation, flow, memo, users) if settings.memory_nudges else []
        block = recall_block(lines, budget, [text for _, text in nudges])
        report.hits = len(lines) if block else 0
        report.nudges = tuple(kind for kind, _ in nudges)
        resume_block, resume_tag = resume
        tags = report.nudges
        if resume_block:
            block = resume_block + "\n\n" + block if block else resume_block
            report.resumed = resume_tag
            tags += (resume_tag,)
        self.memo.add(flow.session_id, anchor, Injected(block, memo.turns, tags))
        if settings.memory_captures:
            report.captured = self._capture(memory, flow.session_id, text, report)

    def _read(self, read: Callable[[], list[Line]]) -> list[Line]:
        """Lines from the memory files; none when they cannot be read (reported, not raised)."""
        try:
            lines = read()
        except (OSError, ValueError) as exc:
            log.warning("cannot read the memory files: %s", exc)
            if self.health is not None:
                self.health.report("memory_reads", f"cannot read the memory files: {exc}")
            return []
        if self.health is not None:
            self.health.clear("memory_reads")
        return lines

    def _resume(
        self, memory: ProjectMemory, memo: SessionInjections, flow: Flow
    ) -> tuple[str, str, bool]:
        """The resume block, its memo tag and whether it is the session's own checkpoint;
        ("", "", False) when there is nothing to resume.

        The session's own newest checkpoint, once, after a compaction; on a session's first
        message, the newest checkpoint of any other session of the project (not for a
        subagent: its parent already has the context, and its task is narrow).
        """
        session_id = flow.session_id
        subagent = flow.headers is not None and bool(flow.headers.get(PARENT_SESSION_HEADER))
        memory_dir = memory.memory_dir or memory.global_dir
        used = {
            tag for i in memo.by_anchor.values() for tag in i.nudges if tag.startswith("resume:")
        }
        own = session_checkpoints(memory_dir, session_id)
        if own and f"resume:{own[0].stamp}" not in used:
            chosen, intro = own[0], RESUME_OWN
        elif memo.turns == 0 and not subagent:
            latest = latest_checkpoint(memory_dir)
            if latest is None or latest.session == session_dirname(session_id):
                return "", "", False
            chosen, intro = latest, RESUME_OTHER
        else:
            return "", "", False
        try:
            checkpoint = Checkpoint.parse(read_text(chosen.checkpoint))
        except (OSError, ValueError) as exc:
            log.warning("cannot read checkpoint %s: %s", chosen.checkpoint, exc)
            return "", "", False
        digest = essentials(checkpoint, self.settings.resume_tokens)
        if not digest.strip():
            return "", "", False
        day = f"{chosen.stamp[:4]}-{chosen.stamp[4:6]}-{chosen.stamp[6:8]}"
        header = intro.format(session=checkpoint.session_id, when=day)
        block = wrap("resume", defang(header + "\n" + digest))  # the session id is file text
        return block, f"resume:{chosen.stamp}", intro is RESUME_OWN

    def _nudges(
        self,
        conversation: Conversation,
        flow: Flow,
        memo: SessionInjections,
        users: list[tuple[int, str]],
    ) -> list[tuple[str, str]]:
        tool = next(
            (
                n
                for n in conversation.wire.tool_names(conversation.body)
                if n.endswith(MEMORY_STORE_TOOL)
            ),
            None,
        )
        if tool is None:
            return []
        turn, cooldown = memo.turns, self.settings.nudge_cooldown_turns

        def cooled(kind: str) -> bool:
            last = memo.last_nudge_turn(kind)
            return last is None or turn - last > cooldown

        nudges: list[tuple[str, str]] = []
        if cooled("memory"):
            signals = nudge_reasons(_previous_turn_texts(conversation, users))
            if signals:
                found = "; ".join(f'{s.kind}: "{s.excerpt}"' for s in signals)
                sections = ", ".join(dict.fromkeys(s.section for s in signals))
                nudges.append(
                    (
                        "memory",
                        f"Reminder from deepmem: the recent turns look worth remembering "
                        f"({found}). If it should outlive this session, save a one-line entry "
                        f"with the {tool} tool (section: {sections}).",
                    )
                )
        threshold = self.settings.pressure_nudge_tokens
        if threshold and cooled("pressure"):
            size = _request_tokens(conversation, flow)
            if size >= threshold:
                nudges.append(
                    (
                        "pressure",
                        f"Reminder from deepmem: this conversation is about {size:,} tokens "
                        "long and will be compacted soon. Before that, store the decisions, "
                        f"constraints and gotchas worth keeping with the {tool} tool.",
                    )
                )
        return nudges

    def _capture(
        self, memory: ProjectMemory, session_id: str, text: str, report: MemoryReport
    ) -> bool:
        note = capture(text)
        if note is None:
            return False
        try:
            added = memory.store.capture_note(session_id, note, datetime.now(UTC))
        except (OSError, LockTimeout, MemoryStoreError) as exc:
            # A capture is a convenience; a read-only project must not break the request.
            report.notes.append(f"capture failed: {exc}")
            log.warning("could not write %s: %s", memory.store.notes_path, exc)
            if self.health is not None:
                self.health.report(
                    "memory_writes", f"cannot write {memory.store.notes_path}: {exc}"
                )
            return False
        if self.health is not None:
            self.health.clear("memory_writes")
        return added


def _request_tokens(conversation: Conversation, flow: Flow) -> int:
    """The request's size as the client sent it (DESIGN.md section 7 counts the serialized
    request), estimated at C speed."""
    if flow.raw:
        return estimate_bytes_tokens(flow.raw)
    return sum(estimate_tokens(item.text) for item in conversation.items)


def build_memory_stage(
    settings: Settings,
    catalog: MemoryCatalog,
    memo: InjectionMemos,
    health: Health | None = None,
) -> MemoryStage | None:
    """The addon, or None when injection, captures and nudges are all switched off."""
    if not (settings.memory_inject or settings.memory_captures or settings.memory_nudges):
        return None
    return MemoryStage(settings, catalog, memo, health)
