"""``deepmem replay --opencode``: the user's own OpenCode sessions, replayed like transcripts.

OpenCode's database (``memory.opencode_history``, opened strictly read-only) keeps each
session's messages and their parts. Each is turned into a transcript (OpenAI chat messages,
the form ``proxy.replay`` reads) and replayed through the same pipeline, in the wire format
the session's provider speaks: ``anthropic`` as Anthropic Messages, ``openai`` as OpenAI
Responses, any other as chat completions; its model prices it (``proxy.prices``).

What OpenCode sends is rebuilt from what it stored:

- a user message: its text parts (synthetic ones too; ``ignored`` ones not), and a
  compaction part as OpenCode's own words for it, "What did we do so far?";
- an assistant message: one chat message per step (OpenCode 1.x writes one message per
  step; an older message with several ``step-start`` parts is split at each): reasoning as
  ``reasoning_content``, text as content, tool parts as tool calls with their input, then
  one tool message per call: the output, the error, or OpenCode's "interrupted" text;
- the tools: each tool the session called, by name (the database keeps no schemas).

A compaction restarts the conversation OpenCode sends from its summary, so a session is cut
there: the part after each compaction is a transcript of its own (``ID+1``, ``ID+2``...).
The system prompt is not stored and is not replayed: the figures cover the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compressors.tokens import TokenCounter
from memory.opencode_history import (
    OpenCodeHistory,
    SessionInfo,
    StoredMessage,
)
from proxy.config import Settings
from proxy.replay import TranscriptReport, check_transcript, progress, replay_data

COMPACTION_TEXT = "What did we do so far?"  # how OpenCode sends a compaction part
INTERRUPTED = "[Tool execution was interrupted]"
CLEARED = "[Old tool result content cleared]"  # a tool output OpenCode pruned
DEFAULT_LAST = 5
DIALECT_BY_PROVIDER = {"anthropic": "anthropic", "openai": "responses"}


def dialect_for(provider: str | None) -> str:
    """The wire format OpenCode uses for ``provider``: anthropic, responses or chat."""
    return DIALECT_BY_PROVIDER.get(provider or "", "chat")


@dataclass
class SessionTranscript:
    """One replayable stretch of a session (the whole of it, or what follows a compaction)."""

    name: str
    session: SessionInfo
    provider: str | None
    model: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    @property
    def dialect(self) -> str:
        return dialect_for(self.provider)

    def transcript(self) -> dict[str, Any]:
        """The corpus form ``proxy.replay`` reads."""
        data: dict[str, Any] = {
            "messages": self.messages,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": "",
                        "parameters": {"type": "object"},
                    },
                }
                for name in self.tools
            ],
        }
        if self.model:
            data["model"] = self.model
        return data


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _user_message(message: StoredMessage) -> tuple[dict[str, Any] | None, bool]:
    """The chat message of a user message, and whether it is a compaction's."""
    texts: list[str] = []
    compaction = False
    for part in message.parts:
        kind = part.get("type")
        if kind == "text" and part.get("ignored") is not True:
            texts.append(_text(part.get("text")))
        elif kind == "compaction":
            compaction = True
            texts.append(COMPACTION_TEXT)
    text = "\n".join(t for t in texts if t)
    return ({"role": "user", "content": text} if text else None), compaction


def _tool_output(state: Mapping[str, Any]) -> str:
    status = state.get("status")
    if status == "completed":
        timing = state.get("time")
        if isinstance(timing, Mapping) and timing.get("compacted"):
            return CLEARED
        return _text(state.get("output"))
    if status == "error":
        return _text(state.get("error"))
    return INTERRUPTED


def _steps(message: StoredMessage) -> list[list[dict[str, Any]]]:
    """The assistant message's parts, one list per step (split at ``step-start``)."""
    steps: list[list[dict[str, Any]]] = [[]]
    for part in message.parts:
        if part.get("type") == "step-start" and steps[-1]:
            steps.append([])
        steps[-1].append(part)
    return steps


def _assistant_messages(message: StoredMessage, tools: list[str]) -> list[dict[str, Any]]:
    """Chat messages of one assistant message: per step, the reply and its tool results."""
    out: list[dict[str, Any]] = []
    for step in _steps(message):
        reasoning = [_text(p.get("text")) for p in step if p.get("type") == "reasoning"]
        texts = [
            _text(p.get("text"))
            for p in step
            if p.get("type") == "text" and p.get("ignored") is not True
        ]
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in step:
            if part.get("type") != "tool":
                continue
            name = _text(part.get("tool")) or "tool"
            call_id = _text(part.get("callID")) or f"call_{len(calls)}_{message.id}"
            state = part.get("state")
            state = state if isinstance(state, Mapping) else {}
            arguments = state.get("input")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": json.dumps(
                            arguments if arguments is not None else {}, ensure_ascii=False
                        ),
                    },
                }
            )
            results.append(
                {"role": "tool", "tool_call_id": call_id, "content": _tool_output(state)}
            )
            if name not in tools:
                tools.append(name)
        text = "".join(t for t in texts if t)
        thought = "".join(t for t in reasoning if t)
        if not (text or thought or calls):
            continue  # a step that failed before it said anything is not sent again
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if thought:
            reply["reasoning_content"] = thought
        if calls:
            reply["tool_calls"] = calls
        out += [reply, *results]
    return out


def session_transcripts(
    session: SessionInfo, stored: list[StoredMessage]
) -> list[SessionTranscript]:
    """A session as transcripts: one, plus one more after each compaction."""
    current = SessionTranscript(session.id, session, None, None)
    stretches = [current]
    for message in stored:
        if message.role == "user":
            reply, compaction = _user_message(message)
            if compaction and current.messages:
                current = SessionTranscript(
                    f"{session.id}+{len(stretches)}", session, current.provider, current.model
                )
                stretches.append(current)
            if reply is not None:
                current.messages.append(reply)
        elif message.role == "assistant":
            current.messages += _assistant_messages(message, current.tools)
            if message.model:
                current.provider, current.model = message.provider, message.model
    for stretch in stretches:  # a stretch before any reply takes the session's model
        if stretch.model is None:
            stretch.provider, stretch.model = current.provider, current.model
    return stretches


def load_sessions(
    database: Path, session_ids: Iterable[str] = (), last: int = DEFAULT_LAST
) -> list[SessionTranscript]:
    """The named sessions, else the ``last`` most recently updated, as transcripts (oldest
    session first). ``OpenCodeHistoryError`` when the database or a session cannot be read."""
    with OpenCodeHistory(database) as history:
        wanted = list(session_ids)
        sessions = (
            [history.session(sid) for sid in wanted]
            if wanted
            else list(reversed(history.sessions(limit=last)))
        )
        return [
            transcript
            for session in sessions
            for transcript in session_transcripts(session, history.stored_messages(session.id))
        ]


def replay_sessions(
    transcripts: list[SessionTranscript], settings: Settings, dialect: str | None = None
) -> list[TranscriptReport]:
    """Replay each transcript in its provider's wire format (or ``dialect`` for all)."""
    counter = TokenCounter()
    reports = []
    for transcript in progress(transcripts, lambda t: t.name):
        data = transcript.transcript()
        check_transcript(data, transcript.name)
        reports.append(
            replay_data(transcript.name, data, settings, counter, dialect or transcript.dialect)
        )
    return reports
