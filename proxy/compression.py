"""The compression addon of the request path: memo in, compress, originals and memo out."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compressors.changes import Change
from compressors.pipeline import (
    CompressionKey,
    CompressionResult,
    CompressionSettings,
    Precomputed,
    compress,
    precompute,
)
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

log = logging.getLogger("deepmem.compression")

if TYPE_CHECKING:
    from proxy.config import Settings

STATE_WRITES = "state_db_writes"  # the /health component for failed originals and memo writes
SKIPPED_KINDS = frozenset({RequestKind.TITLE, RequestKind.COMPACTION})
# The compressors' own defaults are the options' defaults: each is written once, there.
_DEFAULTS = CompressionSettings()
# Compressions computed ahead, kept for the next requests: a bound on the replacement text
# they hold (characters) and on their number, whichever comes first. Each is wanted by its
# session's next request, so the bound only has to cover the sessions active at once (a
# step's outputs compress to some ten thousand characters).
AHEAD_CHARS = 8_000_000
AHEAD_ENTRIES = 4_096
AHEAD_ENTRY_CHARS = 200  # what an entry costs besides its text: key, object, list node


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


class AheadCache:
    """Compressions computed after an answer has been relayed, for the request that will need
    them (``compressors.pipeline.precompute``): least recently used out first, bounded by
    ``max_chars`` and ``max_entries``. Shared by every session's worker thread."""

    def __init__(self, max_chars: int = AHEAD_CHARS, max_entries: int = AHEAD_ENTRIES) -> None:
        self.max_chars, self.max_entries = max_chars, max_entries
        self._entries: OrderedDict[CompressionKey, Precomputed] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: CompressionKey) -> Precomputed | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put_many(self, entries: Iterable[tuple[CompressionKey, Precomputed]]) -> None:
        with self._lock:
            for key, value in entries:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._chars -= _entry_chars(old)
                self._entries[key] = value
                self._chars += _entry_chars(value)
            while self._entries and (
                len(self._entries) > self.max_entries or self._chars > self.max_chars
            ):
                _, gone = self._entries.popitem(last=False)
                self._chars -= _entry_chars(gone)

    @property
    def chars(self) -> int:
        return self._chars


def _entry_chars(entry: Precomputed) -> int:
    return AHEAD_ENTRY_CHARS + len(entry.text or "")


@dataclass
class CompressionStage:
    """An addon: compresses agent requests, keeps originals in CCR, persists decisions.

    Once a request's answer has been relayed, it compresses the outputs that request sent in
    full, as the next request will (``AheadCache``): the next request finds them done."""

    settings: CompressionSettings
    memos: DecisionMemos
    originals: Originals
    cache_ttl: float = 300.0
    health: Health | None = None
    ahead: AheadCache = field(default_factory=AheadCache)
    # Around the request's durable writes: one transaction for originals and decisions.
    transaction: Callable[[], AbstractContextManager[object]] = nullcontext

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        if flow.kind in SKIPPED_KINDS:
            return False
        try:
            memo = self.memos.load(flow.session_id)
            cold = flow.idle_seconds is not None and flow.idle_seconds > self.cache_ttl
            result: CompressionResult = compress(
                conversation, memo, self.settings, cache_cold=cold, ahead=self.ahead, seen=flow.seen
            )
            # Originals first: a marker may go upstream only once its original is committed;
            # the decisions commit with them. Without a new original, they wait for the memo
            # store's flush, once the answer is out: nothing sent depends on them.
            new = result.new_originals()
            if new:
                with self.transaction():  # begins only if one of them writes
                    stored = self.originals.put_many(new)
                    if result.decisions or result.event:
                        save = self.memos.save if stored else self.memos.save_later
                        save(flow.session_id, memo, result.decisions)
            elif result.decisions or result.event:
                self.memos.save_later(flow.session_id, memo, result.decisions)
            if result.handed_over:  # kept already: they are only kept alive, once it is out
                flow.defer(lambda: self.keep_alive(result.originals))
            # Also what an earlier request's flush left waiting, when this one cancelled it.
            flow.defer(self.flush_decisions)
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
        if result.kept_in_full:
            level = memo.level
            flow.defer(lambda: self.compress_ahead(result, level))
        return result.changed

    def flush_decisions(self) -> None:
        """Deferred work: write the decisions that wait (``DecisionMemos.save_later``). A
        failure is reported in /health; they wait on, for the next flush or save."""
        try:
            self.memos.flush()
        except StateUnavailable as exc:
            if self.health is not None:
                self.health.report(STATE_WRITES, str(exc))
            log.warning("decisions not written yet, they wait for the next flush: %s", exc)

    def keep_alive(self, originals: dict[str, str]) -> None:
        """Deferred work: refresh the originals a request's markers name, as each request
        does (``Originals.put_many``); a failure is reported, the next request tries again."""
        try:
            self.originals.put_many(originals)
        except StateUnavailable as exc:
            if self.health is not None:
                self.health.report(STATE_WRITES, str(exc))
            log.warning("originals not refreshed yet, the next request will: %s", exc)

    def compress_ahead(self, result: CompressionResult, level: int) -> None:
        """Deferred work: compress what a request sent in full, at the level it will get, and
        store the originals those compressions leave out, so that the request that sends
        them commits nothing for them before it goes upstream (a failure leaves that to it)."""
        ahead = precompute(result, level, self.settings, self.ahead)
        self.ahead.put_many(ahead.compressions)
        if ahead.originals:
            try:
                self.originals.put_many(ahead.originals)
            except StateUnavailable as exc:
                if self.health is not None:
                    self.health.report(STATE_WRITES, str(exc))
                log.warning("originals not kept ahead, the request that sends them will: %s", exc)
