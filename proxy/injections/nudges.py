"""Nudges: reminders to store what matters with the ``memory_store`` tool.

Given beside a new user message, only when the request offers that tool: after a turn that
settled a decision, stated a constraint or fixed an error ("memory"), and when the request is
large enough that a compaction is near ("pressure"). Each kind waits ``cooldown_turns`` user
turns before it is given again.
"""

from __future__ import annotations

from dataclasses import dataclass

from compressors.tokens import estimate_bytes_tokens, estimate_tokens
from compressors.view import Conversation, Kind, Role
from memory.injection import RECALL_KIND, defang
from memory.signals import nudge_reasons
from proxy.flow import Flow
from proxy.injections.base import Moment, Piece
from proxy.options import Option, parse_bool, parse_non_negative_int

MEMORY_STORE_TOOL = "memory_store"


OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_nudges",
        parse_bool,
        True,
        "Remind the model to call memory_store after a turn that settled a decision, stated a "
        "constraint or fixed an error, and to store what matters when the context grows large. "
        "Only when the request offers a memory_store tool.",
        "BOOL",
    ),
    Option(
        "nudge_cooldown_turns",
        parse_non_negative_int,
        5,
        "User turns after a nudge before the same kind of nudge may be given again.",
        "TURNS",
    ),
    Option(
        "pressure_nudge_tokens",
        parse_non_negative_int,
        150_000,
        "Request size in tokens at which the model is nudged to store what matters before the "
        "context is compacted (0: never).",
        "TOKENS",
    ),
)


@dataclass(slots=True)
class Nudges:
    cooldown_turns: int
    pressure_tokens: int  # 0: no pressure nudge

    def decide(self, moment: Moment) -> list[Piece]:
        if not moment.newest:
            return []
        conversation = moment.conversation
        tool = next(
            (
                name
                for name in conversation.wire.tool_names(conversation.body)
                if name.endswith(MEMORY_STORE_TOOL)
            ),
            None,
        )
        if tool is None:
            return []
        turn = moment.memo.turns

        def cooled(kind: str) -> bool:
            last = moment.memo.last_turn_tagged(kind)
            return last is None or turn - last > self.cooldown_turns

        nudges: list[Piece] = []
        if cooled("memory"):
            signals = nudge_reasons(_previous_turn_texts(conversation, moment.users))
            if signals:
                found = "; ".join(f'{s.kind}: "{s.excerpt}"' for s in signals)
                sections = ", ".join(dict.fromkeys(s.section for s in signals))
                text = (
                    f"Reminder from deepmem: the recent turns look worth remembering "
                    f"({found}). If it should outlive this session, save a one-line entry "
                    f"with the {tool} tool (section: {sections})."
                )
                nudges.append(Piece(RECALL_KIND, defang(text), "memory"))
        if self.pressure_tokens and cooled("pressure"):
            size = _request_tokens(conversation, moment.flow)
            if size >= self.pressure_tokens:
                text = (
                    f"Reminder from deepmem: this conversation is about {size:,} tokens "
                    "long and will be compacted soon. Before that, store the decisions, "
                    f"constraints and gotchas worth keeping with the {tool} tool."
                )
                nudges.append(Piece(RECALL_KIND, defang(text), "pressure"))
        moment.report.nudges = tuple(piece.tag for piece in nudges)
        return nudges


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


def _request_tokens(conversation: Conversation, flow: Flow) -> int:
    """The request's size as the client sent it (DESIGN.md section 7 counts the serialized
    request), estimated at C speed."""
    if flow.raw:
        return estimate_bytes_tokens(flow.raw)
    return sum(estimate_tokens(item.text) for item in conversation.items)
