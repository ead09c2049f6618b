"""The kinds of text memory puts in front of the model: one module each, one interface
(``proxy.injections.base.Injection``), one ordered list (``build_injections``: the order of
the list is the order of the blocks).

To add a kind: a module here with a class that has ``decide`` and the ``OPTIONS`` it reads,
and a line each in ``build_injections`` and ``OPTIONS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.health import Health
from proxy.injections import captures, nudges, recall, resume, stable
from proxy.injections.base import Injection, MemoryReader
from proxy.injections.captures import Captures
from proxy.injections.nudges import Nudges
from proxy.injections.recall import Recall
from proxy.injections.resume import Resume
from proxy.injections.stable import StableBlock
from proxy.options import Option, parse_bool

if TYPE_CHECKING:
    from proxy.config import Settings


OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_inject",
        parse_bool,
        True,
        "Put project memory in front of the model: a stable block of constraints and decisions "
        "in the system prompt, and search hits beside each new user message.",
        "BOOL",
    ),
    *stable.OPTIONS,
    *recall.OPTIONS,
    *nudges.OPTIONS,
    *captures.OPTIONS,
    *resume.OPTIONS,
)


def build_injections(settings: Settings, health: Health | None = None) -> list[Injection]:
    """The kinds the settings switch on, in the order their blocks appear."""
    reader = MemoryReader(health)
    injections: list[Injection] = []
    if settings.memory_inject and settings.memory_stable_tokens:
        injections.append(StableBlock(settings.memory_stable_tokens, reader))
    if settings.resume and settings.resume_tokens:
        injections.append(Resume(settings.resume_tokens))
    if settings.memory_inject:
        injections.append(
            Recall(settings.memory_first_recall_tokens, settings.memory_recall_tokens, reader)
        )
    if settings.memory_nudges:
        injections.append(Nudges(settings.nudge_cooldown_turns, settings.pressure_nudge_tokens))
    if settings.memory_captures:
        injections.append(Captures(health))
    return injections
