"""The compression addon of the request path: memo in, compress, originals and memo out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from compressors.changes import Change
from compressors.pipeline import CompressionResult, CompressionSettings, compress
from compressors.registry import DEFAULT_PROTECTED_TOOLS
from compressors.view import Conversation
from memory.interfaces import DecisionMemos, Originals
from memory.state import StateConflict, StateUnavailable
from proxy.flow import Flow
from proxy.health import Health
from proxy.options import (
    Option,
    parse_bool,
    parse_int_list,
    parse_list,
    parse_non_negative_int,
    parse_positive_float,
)
from proxy.sessions import RequestKind, Tally

if TYPE_CHECKING:
    from proxy.config import Settings

STATE_WRITES = "state_db_writes"  # the /health component for failed originals and memo writes
SKIPPED_KINDS = frozenset({RequestKind.TITLE, RequestKind.COMPACTION})
# The compressors' own defaults are the options' defaults: each is written once, there.
_DEFAULTS = CompressionSettings()


OPTIONS: tuple[Option, ...] = (
    Option(
        "tail_tokens",
        parse_non_negative_int,
        _DEFAULTS.tail_tokens,
        "Tokens of older tool output sent in full before they are compressed together in one "
        "rewrite (the latest step's output is always sent in full). 0 compresses each output "
        "as soon as the next step begins.",
        "TOKENS",
    ),
    Option(
        "min_output_tokens",
        parse_non_negative_int,
        _DEFAULTS.min_output_tokens,
        "Tool outputs shorter than this are never compressed.",
        "TOKENS",
    ),
    Option(
        "compress_live_turn",
        parse_bool,
        _DEFAULTS.compress_live_turn,
        "Also compress older tool outputs inside the current user turn (its text, reasoning "
        "and tool calls are never changed).",
        "BOOL",
    ),
    Option(
        "pressure_thresholds",
        parse_int_list,
        list(_DEFAULTS.pressure_thresholds),
        "Request sizes in tokens from which tool outputs are compressed one level deeper "
        "(outputs already sent compressed are not rewritten: that would cost a cache write "
        "of the whole prompt).",
        "TOKENS,...",
    ),
    Option(
        "protected_tools",
        parse_list,
        [],
        "Tools whose results are never compressed, added to the built-in list (edit, write, "
        "patch, todowrite, question, skill, deepmem's own tools, ...).",
        "NAME,...",
    ),
    Option(
        "cache_ttl",
        parse_positive_float,
        300.0,
        "Seconds a provider keeps a prompt cache; a session idle longer is re-compressed "
        "freely because its cache is cold anyway.",
        "SECONDS",
    ),
)


def compression_settings(settings: Settings) -> CompressionSettings:
    return CompressionSettings(
        tail_tokens=settings.tail_tokens,
        min_output_tokens=settings.min_output_tokens,
        pressure_thresholds=tuple(sorted(settings.pressure_thresholds)),
        protected_tools=DEFAULT_PROTECTED_TOOLS
        | frozenset(name.lower() for name in settings.protected_tools),
        compress_live_turn=settings.compress_live_turn,
    )


@dataclass(slots=True)
class CompressionReport:
    result: CompressionResult

    def account(self, tally: Tally) -> None:
        result = self.result
        tally.tool_output_tokens_before += result.tokens_before
        tally.tool_output_tokens_after += result.tokens_after
        tally.outputs_compressed += sum(
            n for name, n in result.counters.items() if name.startswith("compressed:")
        )
        tally.compression_events += result.event is not None

    def changes(self) -> list[Change]:
        return self.result.changes


@dataclass
class CompressionStage:
    """An addon: compresses agent requests, keeps originals in CCR, persists decisions."""

    settings: CompressionSettings
    memos: DecisionMemos
    originals: Originals
    cache_ttl: float = 300.0
    health: Health | None = None

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        if flow.kind in SKIPPED_KINDS:
            return False
        try:
            memo = self.memos.load(flow.session_id)
            cold = flow.idle_seconds is not None and flow.idle_seconds > self.cache_ttl
            result: CompressionResult = compress(conversation, memo, self.settings, cache_cold=cold)
            # Originals first: a marker may go upstream only once its original is committed.
            if result.originals:
                self.originals.put_many(result.originals)
            if result.decisions or result.event:
                self.memos.save(flow.session_id, memo, result.decisions)
        except Exception as exc:
            # The hook forwards the original bytes. The live memo may hold decisions whose
            # originals or rows were not kept: forget it, the next load reads what was saved.
            self.memos.forget_live(flow.session_id)
            # Another replica saving the session first is no fault of the state database.
            broken = isinstance(exc, StateUnavailable) and not isinstance(exc, StateConflict)
            if broken and self.health is not None:
                self.health.report(STATE_WRITES, str(exc))
            raise
        if self.health is not None:
            self.health.clear(STATE_WRITES)
        flow.reports.append(CompressionReport(result))
        return result.changed
