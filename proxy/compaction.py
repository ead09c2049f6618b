"""The compaction stage: save the history before OpenCode summarises it away, and help the
summarizer.

For agent requests it only remembers the body the session last sent (the originals, as bytes;
nothing is parsed or copied). For a compaction request (``proxy.sessions.classify``: no tools,
a ``<conversation>`` transcript) it, in order:

1. writes the checkpoint (``memory.archive``): the raw history as last seen, the extraction
   (``memory.checkpoint``), the per-session archive and the compaction log. A failure to write
   is reported in ``/health`` and the log, and the request still goes on;
2. compresses the large tool results inside the transcript (``compaction_compress``), keeping
   their originals in CCR so a marker the summary carries forward can still be expanded;
3. improves the summarizer's instructions (``compaction_prompt``): ``augment`` adds a handoff
   note to the system prompt, ``replace`` swaps OpenCode's template for an eight-section one,
   ``off`` leaves them alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from compressors.changes import SYSTEM_PROMPT, Change, ChangeKind
from compressors.pipeline import CompressionSettings
from compressors.transcript import compress_transcript
from compressors.transcript_grammar import CLOSE
from compressors.view import Conversation, Kind, Role
from compressors.wire import parse_conversation
from memory.archive import archive_paths, write_checkpoint
from memory.catalog import MemoryCatalog
from memory.checkpoint import Checkpoint, extract, extract_transcript
from memory.files import LockTimeout
from memory.in_process import LocalHistories
from memory.injection import block_kinds, wrap
from memory.interfaces import Histories, Originals
from memory.project import NO_PROJECT
from memory.state import StateUnavailable
from proxy.compression import STATE_WRITES
from proxy.flow import Flow
from proxy.health import Health
from proxy.options import Option, choice, parse_bool, parse_positive_int
from proxy.sessions import RequestKind, Tally

if TYPE_CHECKING:
    from proxy.config import Settings

log = logging.getLogger("deepmem.compaction")


COVERAGE = (
    "(1) the task overview, (2) progress so far, (3) key decisions and why, (4) constraints "
    "and user preferences, (5) files touched, (6) errors met and how they were fixed, (7) next "
    "steps, (8) critical context: exact paths, commands, identifiers, error strings"
)
MARKER_NOTE = (
    'Markers like [deep-memory: … — original intact: deep_expand("ccr:…")] stand for tool '
    "output that was shortened; the original is intact. Keep the key of any marker whose "
    "content matters, so the next agent can expand it."
)
REPLACEMENT_TEMPLATE = """\
Write a handoff summary of the conversation above for the coding agent that continues the \
work. It will see only your summary, so keep exact file paths, commands, identifiers, error \
strings and URLs. Use terse bullets, and the language of the conversation. Do not continue \
the conversation and do not answer questions in it. Output exactly these sections, in this \
order, keeping every section (write "(none)" when a section is empty):

## Task Overview
## Progress
## Key Decisions
## Constraints
## Files Touched
## Errors and Fixes
## Next Steps
## Critical Context
"""


OPTIONS: tuple[Option, ...] = (
    Option(
        "checkpoints",
        parse_bool,
        True,
        "On a compaction request, save the session's history and a checkpoint (intents, "
        "decisions, constraints, gotchas, file changes) in the project's .deep-memory/.",
        "BOOL",
    ),
    Option(
        "checkpoint_keep",
        parse_positive_int,
        5,
        "Archived checkpoints kept per session under .deep-memory/sessions/<sid>/.",
        "N",
    ),
    Option(
        "compaction_prompt",
        choice("off", "augment", "replace"),
        "augment",
        "What the summarizer is told: 'augment' adds a handoff note (eight things to cover, "
        "where the history is archived) to its system prompt, 'replace' swaps OpenCode's "
        "template for an eight-section handoff, 'off' changes nothing.",
        "MODE",
    ),
    Option(
        "compaction_compress",
        parse_bool,
        True,
        "Compress large tool results inside the compaction transcript (originals stay expandable).",
        "BOOL",
    ),
)


def handoff_note(archive: Path | None, messages: int) -> str:
    lines = [
        "The summary you write is all the next agent will see of this conversation: write it "
        f"as a handoff. Within the requested format, cover {COVERAGE}.",
        MARKER_NOTE,
    ]
    if archive is not None:
        lines.append(f"deepmem archived the full history ({messages} messages) at {archive}.")
    return wrap("handoff", "\n".join(lines))


@dataclass(slots=True)
class CompactionReport:
    project: Path | None
    memory_dir: Path
    messages: int
    source: str  # "proxy": the history this proxy saw; "transcript": the request's own text
    checkpoint: Path | None = None
    write_error: str | None = None
    outputs_compressed: int = 0
    prompt: str = "off"
    changed: list[Change] = field(default_factory=list)

    def account(self, tally: Tally) -> None:
        tally.checkpoints += self.checkpoint is not None

    def changes(self) -> list[Change]:
        return self.changed


def history_messages(conversation: Conversation) -> list[Any]:
    """The wire messages of a request, with a top-level system prompt as a first message."""
    return conversation.wire.history_messages(conversation.body)


@dataclass
class CompactionStage:
    settings: Settings
    catalog: MemoryCatalog
    originals: Originals
    compression: CompressionSettings
    health: Health | None = None
    histories: Histories = field(default_factory=LocalHistories)

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        if flow.kind is RequestKind.AGENT:
            self.histories.remember(flow.session_id, flow.dialect, flow.raw)
            return False
        if flow.kind is not RequestKind.COMPACTION:
            return False
        resolution = flow.project or NO_PROJECT
        project = resolution.path
        memory = self.catalog.get(project)
        memory_dir = memory.memory_dir or memory.global_dir
        now = datetime.now(UTC)
        history, source, checkpoint = self._history(conversation, flow.session_id, now)
        report = CompactionReport(project, memory_dir, len(history), source)
        flow.reports.append(report)
        if resolution.refused:
            # A project outside the allowed roots: its history is not kept, not even globally.
            report.write_error = resolution.reason
        elif self.settings.checkpoints:
            self._write(memory_dir, flow.session_id, now, history, checkpoint, report)
            if report.checkpoint is not None:
                # The project's index takes the new checkpoint in once the answer is out, so
                # the session's next user message does not wait for it in its search.
                flow.defer(memory.refresh_index)
        changed = False
        if self.settings.compaction_compress:
            changed = self._compress(conversation, report)
        mode = self.settings.compaction_prompt
        archive = report.checkpoint
        if mode == "augment":
            note = handoff_note(archive, len(history))
            if conversation.append_to_system(note):
                changed = True
                report.changed.append(
                    Change(
                        ChangeKind.PROMPT_CHANGED,
                        SYSTEM_PROMPT,
                        0,
                        len(note),
                        note,
                        blocks=block_kinds(note),
                    )
                )
            report.prompt = mode
        elif mode == "replace":
            changed = self._replace_template(conversation, archive, len(history), report) or changed
            report.prompt = mode
        log.info(
            "compaction of session %s: %s",
            flow.session_id,
            f"checkpoint {report.checkpoint}" if report.checkpoint else "no checkpoint written",
            extra={
                "fields": {
                    "messages": report.messages,
                    "history": report.source,
                    "outputs_compressed": report.outputs_compressed,
                    "prompt": report.prompt,
                    "write_error": report.write_error,
                }
            },
        )
        return changed

    def _history(
        self, conversation: Conversation, session_id: str, now: datetime
    ) -> tuple[list[Any], str, Checkpoint]:
        try:
            cached = self.histories.get(session_id)
        except StateUnavailable as exc:  # a shared backend away: the transcript still serves
            log.warning("session %s: %s; the checkpoint comes from the transcript", session_id, exc)
            cached = None
        if cached is not None:
            dialect, raw = cached
            seen = parse_conversation(dialect, orjson.loads(raw))
            return history_messages(seen), "proxy", extract(seen, session_id, now)
        transcript = "\n".join(
            item.text
            for item in conversation.items
            if item.role is Role.USER and item.kind is Kind.TEXT
        )
        checkpoint = extract_transcript(transcript, session_id, now)
        return history_messages(conversation), "transcript", checkpoint

    def _write(
        self,
        memory_dir: Path,
        session_id: str,
        now: datetime,
        history: list[Any],
        checkpoint: Checkpoint,
        report: CompactionReport,
    ) -> None:
        try:
            written = write_checkpoint(
                memory_dir,
                session_id,
                now,
                history,
                _rendered(checkpoint, memory_dir, session_id, now),
                keep=self.settings.checkpoint_keep,
                log_fields={"source": report.source, "project": str(report.project or "")},
                lock_dir=self.catalog.lock_dir,
            )
        except (OSError, LockTimeout) as exc:
            # The compaction itself must go on: OpenCode is out of context and waiting.
            report.write_error = str(exc)
            log.warning("cannot write the checkpoint in %s: %s", memory_dir, exc)
            if self.health is not None:
                self.health.report("checkpoint_writes", f"cannot write in {memory_dir}: {exc}")
            return
        report.checkpoint = written.archived_raw
        if self.health is not None:
            self.health.clear("checkpoint_writes")

    def _compress(self, conversation: Conversation, report: CompactionReport) -> bool:
        changed = False
        for item in conversation.items:
            if item.role is not Role.USER or item.kind is not Kind.TEXT:
                continue
            text = item.text
            if CLOSE not in text:
                continue
            result = compress_transcript(text, self.compression)
            if result.originals:
                try:
                    self.originals.put_many(result.originals)
                except StateUnavailable as exc:  # no marker without its original: fail open
                    if self.health is not None:
                        self.health.report(STATE_WRITES, str(exc))
                    raise
                if self.health is not None:
                    self.health.clear(STATE_WRITES)
                report.changed.append(
                    Change(
                        ChangeKind.TRANSCRIPT_COMPRESSED,
                        item.message,
                        len(text),
                        len(result.text),
                        result.text,
                        keys=tuple(result.originals),
                        tokens_before=result.tokens_before,
                        tokens_after=result.tokens_after,
                    )
                )
                conversation.set_text(item, result.text)
                report.outputs_compressed += result.compressed
                changed = True
        return changed

    def _replace_template(
        self,
        conversation: Conversation,
        archive: Path | None,
        messages: int,
        report: CompactionReport,
    ) -> bool:
        for item in reversed(conversation.items):
            if item.role is not Role.USER or item.kind is not Kind.TEXT:
                continue
            text = item.text
            end = text.rfind(CLOSE)
            if end < 0:
                continue
            tail = REPLACEMENT_TEMPLATE + "\n" + MARKER_NOTE
            if archive is not None:
                tail += (
                    f"\nThe full history ({messages} messages) is archived at {archive}; "
                    "mention this path under Critical Context."
                )
            replaced = text[: end + len(CLOSE)] + "\n\n" + tail
            report.changed.append(
                Change(ChangeKind.PROMPT_CHANGED, item.message, len(text), len(replaced), tail)
            )
            conversation.set_text(item, replaced)
            return True
        return False


def _rendered(checkpoint: Checkpoint, memory_dir: Path, session_id: str, now: datetime) -> str:
    checkpoint.archive = str(archive_paths(memory_dir, session_id, now)[1])
    return checkpoint.render()
