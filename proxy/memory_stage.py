"""The memory addon: asks each kind of injection (``proxy/injections/``) what to add, once
per moment of a session, and re-applies what was decided on every request.

Runs after compression, on agent requests only. Where injected text goes (DESIGN.md §3.6):

- what the session's **start** gets (the stable block of constraints and decisions) is
  appended after the system prompt, as its last bytes, so the prompt prefix before it never
  changes;
- what a **user message** gets (recall hits, nudges, a resume block) is decided on the first
  request that carries the message and appended to the end of that message; every later
  request of the session re-applies the remembered text to the same message, byte for byte.

Neither adds a ``cache_control`` marker. A message gets new text only while it is the newest
user message (or, for a resume after a compaction, the first one not seen before), so bytes the
provider has already cached are never changed.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import xxhash

from compressors.changes import SYSTEM_PROMPT
from compressors.pipeline import SeenTexts
from compressors.view import Conversation
from memory.catalog import MemoryCatalog
from memory.injection_memo import Injected
from memory.interfaces import InjectionMemos
from memory.project import NO_PROJECT
from memory.state import StateUnavailable
from proxy.bodies import same_objects
from proxy.flow import Flow
from proxy.health import Health
from proxy.injections import build_injections
from proxy.injections.base import Injection, MemoryReport, Moment, Piece, compose
from proxy.sessions import RequestKind

if TYPE_CHECKING:
    from proxy.config import Settings

log = logging.getLogger("deepmem.memory")

INJECTION_STATE = "state_db_injections"  # the /health component for the injection memo

__all__ = ["MemoryReport", "MemoryStage", "build_memory_stage", "message_anchors"]


def message_anchors(users: list[tuple[int, str]], before: Sequence[str] = ()) -> list[str]:
    """A key per user message: a hash of its text and how many earlier ones had that text;
    ``before``: the anchors of the user messages before these."""
    seen: dict[str, int] = {}
    for anchor in before:
        digest, _, earlier = anchor.partition("#")
        seen[digest] = int(earlier) + 1
    anchors = []
    for _, text in users:
        digest = xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
        copy = seen.get(digest, 0)
        seen[digest] = copy + 1
        anchors.append(f"{digest}#{copy}")
    return anchors


@dataclass(frozen=True, slots=True)
class _UserTurns:
    """A request's user messages that start a turn and their anchors, with the wire messages
    they were read from (as the memory stage found them): the session's next request reads
    only the messages after those it repeats object for object (``SeenTexts.carried``)."""

    messages: list[Any]
    users: list[tuple[int, str]]
    anchors: list[str]


_CARRIED = "memory.user_turns"


def _user_turns(conversation: Conversation, seen: SeenTexts) -> _UserTurns:
    """The conversation's user turns and anchors; what it repeats of the session's last
    request (the same message objects) taken from what that request found."""
    messages = conversation.wire.messages(conversation.body)
    last = seen.carried.get(_CARRIED)
    same = same_objects(messages, last.messages) if isinstance(last, _UserTurns) else 0
    if same == 0 or last is None:
        users = conversation.user_messages()
        found = _UserTurns(list(messages), users, message_anchors(users))
    else:
        kept = bisect.bisect_left(last.users, same, key=itemgetter(0))
        new = conversation.user_messages(same)
        before = last.anchors[:kept]
        anchors = before + message_anchors(new, before)
        found = _UserTurns(list(messages), last.users[:kept] + new, anchors)
    seen.carried[_CARRIED] = found
    return found


@dataclass
class MemoryStage:
    """An addon: remembers, recalls and reminds; every decision memoised per session."""

    catalog: MemoryCatalog
    memo: InjectionMemos
    injections: list[Injection]
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
        session = flow.session_id
        memo = self.memo.load(session)
        turns = _user_turns(conversation, flow.seen)
        users = turns.users
        moment = Moment(conversation, flow, self.catalog.get(resolution.path), memo, users, report)
        changed = False
        stable_is_new = memo.stable is None
        if memo.stable is None:
            self.memo.set_stable(session, compose(self._decide(moment))[0])
            # What is stored now (another process may have decided first), whichever copy
            # the store keeps live.
            moment.memo = memo = self.memo.load(session)
        if memo.stable:
            changed = conversation.append_to_system(memo.stable)
            if changed:
                report.inject(SYSTEM_PROMPT, memo.stable, stable_is_new)
        if not users:
            return changed
        anchors = turns.anchors
        fresh = [k for k, anchor in enumerate(anchors) if anchor not in memo.by_anchor]
        newest = len(anchors) - 1
        if fresh and fresh[0] != newest:
            # The first message not seen before, when older than the newest: only what goes
            # with that very message (a resume after a compaction) is decided for it.
            moment.message = fresh[0]
            text, tags = compose(self._decide(moment))
            if text:
                self.memo.add(session, anchors[fresh[0]], Injected(text, memo.turns, tags))
                moment.memo = memo = self.memo.load(session)
        if anchors[newest] not in memo.by_anchor:
            report.new_turn = True
            moment.message, moment.newest = newest, True
            text, tags = compose(self._decide(moment))
            self.memo.add(session, anchors[newest], Injected(text, memo.turns, tags))
        for k in fresh:  # older messages seen for the first time: nothing to add, look once
            if anchors[k] not in memo.by_anchor:
                self.memo.add(session, anchors[k], Injected("", memo.turns))
        if fresh:
            memo = self.memo.load(session)  # what is stored now, as on every later request
        decided_now = {anchors[k] for k in fresh}
        for (index, _), anchor in zip(users, anchors, strict=True):
            injected = memo.by_anchor.get(anchor)
            text = injected.text if injected is not None else ""
            if text and conversation.append_to_message(index, text):
                report.inject(conversation.arrived_index(index), text, anchor in decided_now)
                changed = True
        return changed

    def _decide(self, moment: Moment) -> list[Piece]:
        moment.shown = []
        for injection in self.injections:
            moment.shown.extend(injection.decide(moment))
        return moment.shown


def build_memory_stage(
    settings: Settings,
    catalog: MemoryCatalog,
    memo: InjectionMemos,
    health: Health | None = None,
) -> MemoryStage | None:
    """The addon, or None when injection, captures and nudges are all switched off."""
    if not (settings.memory_inject or settings.memory_captures or settings.memory_nudges):
        return None
    return MemoryStage(catalog, memo, build_injections(settings, health), health)
