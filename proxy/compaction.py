"""The compaction stage: save the history before OpenCode summarises it away, and help the
summarizer.

For agent requests it only remembers the body the session last sent (the originals, as bytes;
nothing is parsed or copied). For a compaction request (``proxy.sessions.classify``: no tools,
a ``<conversation>`` transcript) it, in order:

1. begins the checkpoint (``memory.archive``): the raw history as last seen, the extraction
   (``memory.checkpoint``), the per-session archive and the compaction log, written by the
   memory's background thread (``MemoryCatalog.writes``) while the request goes upstream; the
   session's next request waits for it (``Flow.begin``). With replicas (a shared state
   backend) the answer waits for it too: the next request, sent after it, may reach another
   process. A failure to write is reported in ``/health`` and the log, and the
   request still goes on;
2. compresses the large tool results inside the transcript (``compaction_compress``), keeping
   their originals in CCR so a marker the summary carries forward can still be expanded;
3. improves the summarizer's instructions (``compaction_prompt``): ``augment`` adds a handoff
   note to the system prompt, ``replace`` swaps OpenCode's template for an eight-section one,
   ``off`` leaves them alone.
"""

from __future__ import annotations

import functools
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
from compressors.view import Conversation, Dialect, Kind, Role
from compressors.wire import FORMATS, parse_conversation
from memory.archive import SESSIONS_DIR, archive_paths, session_dirname, write_checkpoint
from memory.catalog import MemoryCatalog, ProjectMemory
from memory.checkpoint import Checkpoint, extract, extract_transcript
from memory.files import LockTimeout, make_memory_dirs
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
        lines.append(f"deepmem keeps the full history ({messages} messages) at {archive}.")
    return wrap("handoff", "\n".join(lines))


@dataclass(frozen=True, slots=True)
class History:
    """What a compaction's checkpoint keeps: a request body as it was received."""

    dialect: Dialect
    raw: bytes
    body: Any | None  # ``raw`` parsed, when it was already
    messages: int  # its wire messages (``WireFormat.history_messages``)
    source: str  # "proxy": the session's last request this proxy saw; "transcript": its own

    def parsed(self) -> Any:
        return orjson.loads(self.raw) if self.body is None else self.body


@dataclass(frozen=True, slots=True)
class CheckpointJob:
    """A compaction's checkpoint to write: what it keeps and where."""

    memory: ProjectMemory
    memory_dir: Path
    flow: Flow
    now: datetime  # the compaction's time: its archive's name
    history: History
    report: CompactionReport


@dataclass(slots=True)
class CompactionReport:
    project: Path | None
    memory_dir: Path
    messages: int
    source: str  # "proxy": the history this proxy saw; "transcript": the request's own text
    archive: Path | None = None  # where the history is being written, as the summarizer is told
    checkpoint: Path | None = None  # where it was written, once it has been
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
        history = self._history(conversation, flow)
        report = CompactionReport(project, memory_dir, history.messages, history.source)
        flow.reports.append(report)
        if resolution.refused:
            # A project outside the allowed roots: its history is not kept, not even globally.
            report.write_error = resolution.reason
            self._log(flow.session_id, report)
        elif self.settings.checkpoints:
            self._begin_checkpoint(CheckpointJob(memory, memory_dir, flow, now, history, report))
        changed = False
        if self.settings.compaction_compress:
            changed = self._compress(conversation, report)
        mode = self.settings.compaction_prompt
        archive = report.archive
        if mode == "augment":
            note = handoff_note(archive, history.messages)
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
            changed = (
                self._replace_template(conversation, archive, history.messages, report) or changed
            )
            report.prompt = mode
        return changed

    def _history(self, conversation: Conversation, flow: Flow) -> History:
        """The history the checkpoint keeps: the session's last agent request as this proxy
        saw it, else the compaction's own transcript: its bytes, parsed here only as far as
        the handoff note's message count needs; the extraction is the background's work."""
        try:
            cached = self.histories.get(flow.session_id)
        except StateUnavailable as exc:  # a shared backend away: the transcript still serves
            log.warning(
                "session %s: %s; the checkpoint comes from the transcript", flow.session_id, exc
            )
            cached = None
        if cached is not None:
            dialect, raw = cached
            body = orjson.loads(raw)
            count = len(FORMATS[dialect].history_messages(body))
            return History(dialect, raw, body, count, "proxy")
        # The addons after this one edit the conversation in place: the checkpoint reads
        # the request's own bytes.
        count = len(history_messages(conversation))
        return History(flow.dialect, flow.raw, None, count, "transcript")

    def _begin_checkpoint(self, job: CheckpointJob) -> None:
        """Make the session's archive directory (so a memory dir that cannot take it is
        known before the summarizer is told of the archive), then write the checkpoint in the
        background: the compaction goes upstream meanwhile, and its answer's bookkeeping waits
        for the write (``Flow.begin``). With a shared state backend (replicas), so does the
        answer: the client sends the next request, which may reach another replica, after it."""
        report, session_id = job.report, job.flow.session_id
        try:
            make_memory_dirs(job.memory_dir, SESSIONS_DIR, session_dirname(session_id))
        except OSError as exc:
            self._write_failed(job.memory_dir, report, exc)
            self._log(session_id, report)
            return
        report.archive = archive_paths(job.memory_dir, session_id, job.now)[1]
        # Replicas: the session's next request may reach another process, which cannot wait
        # for this one's background, and its resume block reads the checkpoint.
        replicas = self.settings.state_url is not None
        write = functools.partial(self._checkpoint, job)
        job.flow.begin(self.catalog.writes, write, answer_waits=replicas)

    def _checkpoint(self, job: CheckpointJob) -> None:
        """Extract and write the checkpoint, then let the project's index take it in (so the
        session's next user message does not wait for that in its search)."""
        history, report, memory_dir, now = job.history, job.report, job.memory_dir, job.now
        session_id = job.flow.session_id
        try:
            body = history.parsed()
            seen = parse_conversation(history.dialect, body)
            if history.source == "proxy":
                checkpoint = extract(seen, session_id, now)
            else:
                transcript = "\n".join(
                    item.text
                    for item in seen.items
                    if item.role is Role.USER and item.kind is Kind.TEXT
                )
                checkpoint = extract_transcript(transcript, session_id, now)
            written = write_checkpoint(
                memory_dir,
                session_id,
                now,
                FORMATS[history.dialect].history_messages(body),
                _rendered(checkpoint, memory_dir, session_id, now),
                keep=self.settings.checkpoint_keep,
                log_fields={"source": report.source, "project": str(report.project or "")},
                lock_dir=self.catalog.lock_dir,
            )
        except (OSError, LockTimeout) as exc:
            self._write_failed(memory_dir, report, exc)
        except Exception as exc:  # nobody waits for this thread to report it
            log.exception("checkpoint of session %s not written", session_id)
            self._write_failed(memory_dir, report, exc)
        else:
            report.checkpoint = written.archived_raw
            if self.health is not None:
                self.health.clear("checkpoint_writes")
        self._log(session_id, report)
        if report.checkpoint is not None:
            try:
                job.memory.refresh_index()
            except Exception:  # the next search catches the index up
                log.exception("memory index of %s not refreshed", report.project)

    def _write_failed(self, memory_dir: Path, report: CompactionReport, exc: Exception) -> None:
        # The compaction itself goes on: OpenCode is out of context and waiting.
        report.write_error = str(exc)
        log.warning("cannot write the checkpoint in %s: %s", memory_dir, exc)
        if self.health is not None:
            self.health.report("checkpoint_writes", f"cannot write in {memory_dir}: {exc}")

    @staticmethod
    def _log(session_id: str, report: CompactionReport) -> None:
        """What became of a compaction's history (the rest of what the stage did is in the
        request's rewrite record)."""
        log.info(
            "compaction of session %s: %s",
            session_id,
            f"checkpoint {report.checkpoint}" if report.checkpoint else "no checkpoint written",
            extra={
                "fields": {
                    "messages": report.messages,
                    "history": report.source,
                    "write_error": report.write_error,
                }
            },
        )

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
