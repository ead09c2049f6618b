"""One request's compression: zones, layer 1 (old reasoning, reminders), layer 2 (dedup and
per-tool compression), under a cache-safe policy.

Cache safety. Providers cache prompt prefixes, so once a tool output has been sent in some
form, later requests send it in the same form. ``SessionMemo`` holds every decision by
fingerprint (tool, arguments, text); a decision changes only in a counted *event*:

- ``batch``: outputs sent in full that have left the protected tail and the recent window
  add up to more than ``tail_tokens``; all of them are compressed in one rewrite;
- ``pressure``: the request crossed an absolute threshold (50 K, 150 K tokens): outputs
  compressed from then on are cut one level deeper; with ``recompress_on_pressure`` every
  compressible output is also re-compressed at once (a rewrite of nearly the whole prompt,
  which pays for itself only when the context must shrink, not to save cache reads);
  otherwise older outputs reach the deeper level at the next ``cold`` event;
- ``cold``: the provider's cache has expired anyway, so a rewrite costs nothing extra: every
  output below the session's level is re-compressed at it too;
- ``turn``: a new user turn began; older turns lose their reasoning, so their outputs are
  compressed in the same rewrite.

Outputs the memo has never seen outside the protected tail (a proxy that joined a session
late) are compressed on sight. The result is a pure function of the request and the memo.

Zones: the head (system prompt up to the first user message) is never changed; the live turn
(from the last real user message on) keeps its text, reasoning and tool calls byte for byte;
the latest step's tool results are never changed; the newest tool output up to
``recent_tokens`` (smaller at each pressure level: large contexts cut deeper) stays as it
arrived, since that is what an agent comes back to most; older tool results, in earlier turns
and earlier in the live turn, are compressible. The window only moves forward: it is counted
from the newest output back, and shrinks, never grows, with the pressure level.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Container
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from typing import Any, Protocol, TypeVar, cast

import xxhash

from compressors import jsontext
from compressors.calls import MIN_ARGUMENTS_CHARS, cut_call
from compressors.changes import Change, ChangeKind
from compressors.focus import task_terms
from compressors.markers import MARKER_START, ccr_key, marker, marker_keys, utf8
from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.registry import (
    DEFAULT_PROTECTED_TOOLS,
    compress_on_arrival,
    compress_output,
    is_protected,
    is_subagent_report,
)
from compressors.tokens import estimate_tokens
from compressors.view import MAX_RESENT, Conversation, Item, Kind, Role, Settled

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class CompressionSettings:
    tail_tokens: int = 0
    # Newest tool output kept as it arrived, per pressure level (deeper levels keep less).
    # Off by default: measured on the public corpus, a window makes every batch rewrite reach
    # back past it, and under Anthropic-like prices (a cache write costs 12.5 reads) that
    # costs more than the reads it saves; compressing one step back keeps rewrites shallow.
    recent_tokens: tuple[int, ...] = ()
    min_output_tokens: int = 250
    whole_report_tokens: int = 4_000  # a subagent's report up to this size is never cut
    min_saving_tokens: int = 100
    min_saving_ratio: float = 0.25
    # Chosen by replaying the public corpus (see README, "What compression costs and saves").
    level_ratios: tuple[float, ...] = (0.2, 0.12, 0.08)
    file_view_share: float = 2.0  # file views get this multiple of the ratio
    level_floor_chars: tuple[int, ...] = (500, 400, 300)
    pressure_thresholds: tuple[int, ...] = (50_000, 150_000)
    recompress_on_pressure: bool = False
    protected_tools: frozenset[str] = DEFAULT_PROTECTED_TOOLS
    compress_live_turn: bool = True
    arrival_tokens: int = 2_000
    max_work_chars: int = 80_000  # output text compressed per request; the rest next request
    arrival_kinds: frozenset[str] = frozenset({"listing", "shell"})
    strip_reasoning: bool = True
    cut_old_calls: bool = True  # long strings in earlier turns' tool-call arguments
    drop_system_reminders: bool = True

    def pays_off(self, tokens_before: int, tokens_after: int) -> bool:
        """Whether a compression saves enough to be worth a marker: both an absolute floor
        and a share of what the output held (DESIGN.md section 3, invariant 8)."""
        saved = tokens_before - tokens_after
        return saved >= self.min_saving_tokens and saved >= self.min_saving_ratio * tokens_before

    def recent_window(self, level: int) -> int:
        if not self.recent_tokens:
            return 0
        return self.recent_tokens[min(level, len(self.recent_tokens)) - 1]

    def budget(self, text: str, level: int) -> Budget:
        index = min(level, len(self.level_ratios)) - 1
        ratio, floor = self.level_ratios[index], self.level_floor_chars[index]
        return Budget(
            max_chars=max(floor, int(len(text) * ratio)),
            level=level,
            file_view_chars=max(floor, int(len(text) * min(ratio * self.file_view_share, 0.6))),
        )


@dataclass(slots=True)
class Decision:
    """How an output is sent. ``level`` 0: in full so far; >= 1: compressed at that depth,
    ``text`` the replacement (None when compressing did not pay off at that depth).
    ``final``: never compressed (small, protected, or nothing to gain at any depth)."""

    level: int = 0
    text: str | None = None
    final: bool = False


# What one output's compression depends on: its content (tool, arguments, text), the task's
# focus terms, the level and the settings.
CompressionKey = tuple[str, frozenset[str], int, CompressionSettings]


@dataclass(frozen=True, slots=True)
class Precomputed:
    """One output's compression at one level, computed ahead (``precompute``): the decision
    ``_compress_one`` makes and the counter it adds (``compressed:<name>``), if any."""

    level: int
    text: str | None
    final: bool
    counter: str | None = None


class Compressions(Protocol):
    """Where ``compress`` finds compressions computed ahead, by ``compression_key``."""

    def get(self, key: CompressionKey) -> Precomputed | None: ...


@dataclass(slots=True)
class SessionMemo:
    decisions: dict[str, Decision] = field(default_factory=dict)
    level: int = 1
    thresholds_crossed: int = 0
    turn: str | None = None  # fingerprint of the last real user message seen
    events: int = 0
    focus: tuple[int, frozenset[str]] | None = None  # (hash of the task, its terms); derived
    sent_as: dict[str, str] = field(default_factory=dict)  # marker key -> content; derived
    # fingerprint -> CCR key of its original: each original is hashed once per process
    original_keys: dict[str, str] = field(default_factory=dict)  # derived
    version: int = 0  # the saves of this session its state store had made when it was read

    def content_of_marker(self, key: str) -> str | None:
        """Which output a marker this session sent stands for (a client may echo it back)."""
        if not self.sent_as and self.decisions:
            for fp, decision in self.decisions.items():
                if decision.text is not None and decision.text.startswith(MARKER_START):
                    for found in marker_keys(decision.text[: len(MARKER_START) + 200])[:1]:
                        self.sent_as[found] = fp.partition("#")[0]
        return self.sent_as.get(key)


class SeenTexts:
    """Token counts, fingerprints and other facts of the texts a session's requests carried, by
    identity.

    A session's repeated messages arrive as the same string objects (``proxy.bodies`` parses
    them once), so what is derived from a text is computed once too. Each entry holds its text,
    so an id cannot stand for another object while the entry lives; after each request only
    the entries that request used are kept. The proxy keeps one per session beside its parsed
    body (and forgets both together), and with it what ``compress`` made of the last request
    (``trail``).
    """

    __slots__ = ("_current", "_derived", "_derived_before", "_previous", "carried", "trail")

    def __init__(self) -> None:
        self._previous: dict[int, tuple[Any, ...]] = {}
        self._current: dict[int, tuple[Any, ...]] = {}
        self._derived: dict[tuple[int, str], tuple[str, Any]] = {}
        self._derived_before: dict[tuple[int, str], tuple[str, Any]] = {}
        self.trail: Trail | None = None
        # What a stage derived from the session's last request as a whole, under the stage's
        # own name; the stage checks what of it the next request still repeats.
        self.carried: dict[str, Any] = {}

    def next_request(self) -> None:
        self._previous, self._current = self._current, {}
        self._derived_before, self._derived = self._derived, {}

    def carry(self) -> None:
        """Keep what the last request used for the next one too: this one repeats those
        texts without looking them up (``compress`` resumed the last request's messages).
        The last request's entries become this one's, with what it found so far (few: the
        new messages' texts) added to them, not copied."""
        self._previous.update(self._current)
        self._derived_before.update(self._derived)
        self._current, self._derived = self._previous, self._derived_before

    def derive(self, text: str, tag: str, compute: Callable[[str], R]) -> R:
        """``compute(text)``, computed once per text object (and ``tag``: what is derived)."""
        key = (id(text), tag)
        entry = self._derived.get(key)
        if entry is None:
            entry = self._derived_before.get(key)
            if entry is None or entry[0] is not text:
                entry = (text, compute(text))
            self._derived[key] = entry
        return cast(R, entry[1])

    def tokens(self, text: str) -> int:
        entry = self._lookup(text)
        if entry is None or len(entry) != 2:
            entry = self._current[id(text)] = (text, estimate_tokens(text))
        return int(entry[1])

    def fingerprint(self, output: ToolOutput) -> tuple[str, int]:
        """The output's fingerprint and its text's token count."""
        text = output.text
        entry = self._lookup(text)
        if (
            entry is None
            or len(entry) != 5
            or entry[1] != output.tool
            or entry[2] != output.arguments
        ):
            entry = (
                text,
                output.tool,
                output.arguments,
                fingerprint(output),
                estimate_tokens(text),
            )
            self._current[id(text)] = entry
        return entry[3], entry[4]

    def _lookup(self, text: str) -> tuple[Any, ...] | None:
        key = id(text)
        entry = self._current.get(key)
        if entry is None:
            entry = self._previous.get(key)
            if entry is None or entry[0] is not text:
                return None
            self._current[key] = entry
        return entry


@dataclass(slots=True)
class CompressionResult:
    changed: bool = False
    originals: dict[str, str] = field(default_factory=dict)  # every one its markers name
    # How many of ``originals`` (its first entries) an earlier request of the session handed
    # over: kept already (``new_originals`` are the others).
    handed_over: int = 0
    decisions: dict[str, Decision] = field(default_factory=dict)  # new or changed entries
    counters: Counter[str] = field(default_factory=Counter)
    event: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    changes: list[Change] = field(default_factory=list)  # what was changed, item by item
    # Outputs sent in full that a later request will compress (``precompute``), in order.
    kept_in_full: list[_Candidate] = field(default_factory=list)

    def new_originals(self) -> dict[str, str]:
        """The originals no earlier request of the session handed over: those that must be
        kept durably before this request goes upstream."""
        if not self.handed_over:
            return self.originals
        return dict(islice(self.originals.items(), self.handed_over, None))


CALL_PREFIX = "call:"  # decisions about tool-call arguments, beside those about outputs
THINK_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>\s*", re.DOTALL)
SYSTEM_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
MIN_REMINDER_CHARS = 400
DUPLICATE_POINTER = "identical to an earlier"  # how a dedup pointer's marker begins


def fingerprint(output: ToolOutput) -> str:
    data = utf8(output.tool) + b"\x00" + utf8(output.arguments) + b"\x00" + utf8(output.text)
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(slots=True, eq=False)
class _Candidate:
    item: Item
    output: ToolOutput
    content: str  # fingerprint of tool, arguments and text: equal for duplicates
    fp: str  # the decision key: ``content`` and which copy this is, in history order
    tokens: int
    position: int  # of its item among the items the walk found


@dataclass(frozen=True, slots=True)
class _Step:
    """Where a conversation's latest step is, from its items (in wire order)."""

    calls: set[str | None]  # call ids of the last run of tool calls not interrupted by a result
    running: set[str | None]  # call ids after the last tool result
    last_call: int  # the wire message of the last tool call, -1 if none
    last_result: int  # the wire message of the last tool result, -1 if none

    @classmethod
    def of(cls, items: list[Item], before: _Step | None = None) -> _Step:
        """The step of ``items``; with ``before``, the step of the items before them
        followed by ``items``."""
        calls: set[str | None] = set()
        running: set[str | None] | None = None
        step: set[str | None] | None = None
        for item in reversed(items):
            if item.kind is Kind.TOOL_CALL:
                calls.add(item.call_id or "")
            elif item.kind is Kind.TOOL_RESULT:
                if running is None:
                    running = set(calls)
                if calls:
                    step = calls
                    break
        last_call = last_result = -1
        for item in items:  # in wire order: the last of each kind is the latest
            if item.kind is Kind.TOOL_CALL:
                last_call = item.message
            elif item.kind is Kind.TOOL_RESULT:
                last_result = item.message
        if before is None:
            return cls(
                calls if step is None else step,
                calls if running is None else running,
                last_call,
                last_result,
            )
        if step is None:  # the run goes on into the items before, or begins there
            step = calls | before.running if calls else before.calls
        if running is None:
            running = calls | before.running
        return cls(
            step,
            running,
            max(last_call, before.last_call),
            max(last_result, before.last_result),
        )


def _first_user_message(conversation: Conversation) -> int:
    for item in conversation.items:
        if item.role is Role.USER and item.kind is Kind.TEXT:
            return item.message
    return -1


def compress(
    conversation: Conversation,
    memo: SessionMemo,
    settings: CompressionSettings,
    *,
    cache_cold: bool = False,
    ahead: Compressions | None = None,
    seen: SeenTexts | None = None,
) -> CompressionResult:
    """Compress ``conversation`` in place; update ``memo``; never touch protected zones.
    ``ahead`` holds compressions computed beforehand (``precompute``), ``seen`` what the
    session's earlier requests derived from the texts this one repeats and what the last one
    made of its messages (``Trail``): the result is the same with or without them, only
    sooner."""
    seen = SeenTexts() if seen is None else seen
    seen.next_request()
    trail, seen.trail = seen.trail, None
    resent = 0
    if trail is not None:
        resumed = _resume(conversation, memo, settings, trail, seen, cache_cold, ahead)
        if resumed is not None:
            return resumed
        # The last messages that came again changed: those this finds among the ones the
        # trail settled, and all those after them (which it left out, as it was told to).
        differ = conversation.resent(trail.settled, MAX_RESENT)
        resent = differ + trail.settled.unfollowed if differ else trail.resent
    return _compress(conversation, memo, settings, seen, cache_cold, ahead, resent)


def _compress(
    conversation: Conversation,
    memo: SessionMemo,
    settings: CompressionSettings,
    seen: SeenTexts,
    cache_cold: bool,
    ahead: Compressions | None,
    resent: int = 0,
) -> CompressionResult:
    """``compress`` of the whole conversation; the trail it leaves for the next request
    leaves out its last ``resent`` messages (``_settled_end``)."""
    result = CompressionResult()
    items = conversation.items
    head_end = _first_user_message(conversation)
    live_start = conversation.last_user_message
    mark = (
        conversation.mark(0, _settled_end(conversation, resent))
        if conversation.shares_edits
        else None
    )
    cut = len(items) if mark is None else mark.last  # the items the trail settles: before it
    turn = _turn_fingerprint(conversation)
    new_turn = memo.turn is not None and turn != memo.turn
    memo.turn = turn

    focus = _focus(conversation, head_end, memo)
    call_arguments = _call_arguments(items)
    copies: dict[str, int] = {}
    settled_items, unsettled = (items, []) if cut == len(items) else (items[:cut], items[cut:])
    candidates, settled, settled_copies = _candidates_at_cut(
        settled_items, unsettled, 0, cut, head_end, focus, memo, seen, call_arguments, copies
    )
    settled_step = _Step.of(settled_items)
    step = _Step.of(unsettled, settled_step) if unsettled else settled_step
    in_tail = _tail_flags(candidates, step, live_start, settings, memo.level)
    compressible, fresh, pending = _sort(
        conversation, candidates, in_tail, live_start, memo, settings, result
    )
    settled_other = _other_tokens(settled_items, candidates[:settled], seen)
    other_tokens = settled_other + _other_tokens(unsettled, candidates[settled:], seen)
    pressure = other_tokens + _candidate_tokens(candidates, memo)
    event = _event(memo, settings, pressure, pending, cache_cold, new_turn)
    # Outputs compressed at a shallower level than the session's (after a pressure event, or
    # left over by the work cap) are due too, in the same or the next event.
    stale = [
        c
        for c in compressible
        if (d := memo.decisions.get(c.fp)) is not None and 0 < d.level < memo.level and not d.final
    ]
    # A deeper re-compression rewrites most of the prompt: only when the cache is cold anyway,
    # or when asked to on pressure.
    if event is None and stale and (cache_cold or settings.recompress_on_pressure):
        event = "cold" if cache_cold else "pressure"
    due = fresh if event is None else [*fresh, *pending]
    if event is not None and (cache_cold or settings.recompress_on_pressure):
        due += stale
    if event is not None:
        memo.events += 1
        result.event = event
        result.counters[f"event:{event}"] += 1

    result.tokens_before = sum(c.tokens for c in candidates)
    _compress_due(conversation, compressible, due, memo, settings, result, ahead)
    result.tokens_after = sum(estimate_tokens(c.item.value) for c in candidates)
    result.kept_in_full = [c for c in candidates if _kept_in_full(c, memo)]

    recurring: Counter[str] = Counter()
    stripped = False
    if live_start > head_end:
        end = conversation.message_count if mark is None else mark.end
        stripped, recurring, rest = _old_turns(
            conversation, head_end, 0, end, memo, settings, seen, result
        )
        if (stripped or rest) and result.event is None and new_turn:
            _turn_event(memo, result)
    if mark is not None:
        seen.trail = _trail(
            memo,
            settings,
            result,
            head_end,
            conversation.settle(mark),
            settled_copies,
            call_arguments,
            candidates,
            settled,
            settled_other,
            recurring,
            settled_step,
            resent,
            stripped,
        )
    return result


def _old_turns(
    conversation: Conversation,
    head_end: int,
    start: int,
    end: int,
    memo: SessionMemo,
    settings: CompressionSettings,
    seen: SeenTexts,
    result: CompressionResult,
) -> tuple[bool, Counter[str], bool]:
    """Layer 1 for the turns before the live one, from wire message ``start`` on (as the view
    numbers them now): reasoning and long reminders out, long call arguments cut. Whether it
    changed anything in the messages before ``end`` (those a trail settles) and what it
    counted there that every later request counts again (``Trail.recurring``); and whether
    it changed anything in the old turns' messages after them (a later request does those
    again)."""
    live = conversation.last_user_message
    before = Counter(result.counters)
    removed = len(conversation.removed_messages)
    settled = _layer_one(
        conversation, head_end, start, min(end, live), memo, settings, seen, result
    )
    recurring = result.counters - before
    del recurring["calls_cut"]  # counted when decided, not each time a call is sent cut
    rest = False
    if end < live:
        # Messages before ``end`` may have gone whole (Responses reasoning items).
        end -= len(conversation.removed_messages) - removed
        stop = conversation.last_user_message
        rest = _layer_one(
            conversation, head_end, max(start, end), stop, memo, settings, seen, result
        )
    return settled, recurring, rest


def _layer_one(
    conversation: Conversation,
    head_end: int,
    start: int,
    stop: int,
    memo: SessionMemo,
    settings: CompressionSettings,
    seen: SeenTexts,
    result: CompressionResult,
) -> bool:
    """``_old_turns`` of the wire messages from ``start`` to ``stop``: whether it changed
    anything."""
    removed = len(conversation.removed_messages)
    changed = _strip_old_turns(conversation, head_end, start, stop, settings, seen, result)
    if settings.cut_old_calls:
        # Messages before ``stop`` may have gone whole (Responses reasoning items).
        stop -= len(conversation.removed_messages) - removed
        changed = _cut_old_calls(conversation, head_end, start, stop, memo, seen, result) or changed
    return changed


def _turn_event(memo: SessionMemo, result: CompressionResult) -> None:
    memo.events += 1
    result.event = "turn"
    result.counters["event:turn"] += 1


def _resume(
    conversation: Conversation,
    memo: SessionMemo,
    settings: CompressionSettings,
    trail: Trail,
    seen: SeenTexts,
    cache_cold: bool,
    ahead: Compressions | None,
) -> CompressionResult | None:
    """``compress`` of a request that repeats every message of the session's last request and
    adds some. The repeated messages are sent as last time (their decisions stand, the turns
    before the live one were old already), but for the outputs they sent in full that an
    event compresses now and, when a user turn begins, the turn that was live: it is old now.
    Only those and the new messages are compressed. None (nothing changed) when the whole
    conversation must be compressed."""
    if (
        memo is not trail.memo
        or _marks(memo) != trail.marks
        or (settings is not trail.settings and settings != trail.settings)
        or cache_cold
        or settings.recompress_on_pressure
        or settings.recent_tokens
        or not settings.compress_live_turn
    ):
        return None
    known = conversation.repeats(trail.settled)
    if not known or _first_user_message(conversation) != trail.head_end:
        return None
    items = conversation.items
    added = items[known:]
    turn = memo.turn
    if any(item.role is Role.USER and item.kind is Kind.TEXT for item in added):
        turn = _turn_fingerprint(conversation)
    new_turn = memo.turn is not None and turn != memo.turn
    count = len(trail.settled.before)
    end = max(_settled_end(conversation, trail.resent), count)
    cut = conversation.first_item_of(end, lo=known)
    settled_items, unsettled = (added, []) if cut == len(items) else (items[known:cut], items[cut:])
    settled_step = _Step.of(settled_items, trail.step)
    step = _Step.of(unsettled, settled_step) if unsettled else settled_step
    # The repeated outputs sent in full so far: those in this step's protected tail stay so;
    # the others are due at an event.
    kept: list[_Candidate] = []
    open_ = trail.pending
    if trail.step.last_result > step.last_call or not step.calls.isdisjoint(trail.result_calls):
        open_ = []
        for earlier in trail.pending:
            item = items[earlier.position]
            tail = item.call_id in step.calls or item.message > step.last_call
            (kept if tail else open_).append(earlier)
    assert memo.focus is not None  # set by the request that left the trail
    # The trail is this request's alone (``compress`` took it): what it holds is added to.
    call_arguments = trail.call_arguments
    call_arguments.update(_call_arguments(added))
    candidates, settled, settled_copies = _candidates_at_cut(
        settled_items,
        unsettled,
        known,
        cut,
        trail.head_end,
        memo.focus[1],
        memo,
        seen,
        call_arguments,
        trail.copies,
    )
    in_tail = _tail_flags(candidates, step, conversation.last_user_message, settings, memo.level)
    pending_tokens = trail.pending_tokens - sum(c.tokens for c in kept)
    for candidate, tail in zip(candidates, in_tail, strict=True):
        decision = memo.decisions.get(candidate.fp)
        if not tail and decision is not None and decision.level == 0 and not decision.final:
            pending_tokens += candidate.tokens
    # An event is due when a user turn begins, or when the outputs sent in full outgrow the
    # tail (a batch): then those of the repeated messages are compressed too, and followed
    # from the first one's message on.
    batch = pending_tokens > settings.tail_tokens
    repeated_due: list[_Candidate] = []
    if batch or new_turn:
        for earlier in open_:
            item = items[earlier.position]
            if item.kind is not Kind.TOOL_RESULT or item.value is not earlier.output.text:
                return None  # not the output it was: never expected, never guessed at
            repeated_due.append(replace(earlier, item=item))
    first = known
    if repeated_due:
        # An edit copies its message, and every item of it then points into the copy.
        first = conversation.first_item_of(repeated_due[0].item.message)
    # Layer 1 applies to the messages of old turns the trail does not hold as such: the turn
    # that was live, once a later user message begins one, and the messages it left out.
    # They are followed from the first of them on (as the client numbers them).
    live_before = trail.settled.last_user_message
    old_from = min(live_before, count) if conversation.last_user_message > live_before else count
    layer_one = old_from < conversation.last_user_message
    if layer_one:
        first = min(first, conversation.first_item_of(old_from))

    memo.turn = turn
    mark = conversation.mark(first, end)
    conversation.resume(trail.settled)
    seen.carry()
    result = CompressionResult(
        changed=trail.changed,
        originals=dict(trail.originals),
        handed_over=len(trail.originals),
        counters=Counter(trail.recurring) if trail.recurring else Counter(),
        changes=list(trail.changes),
    )
    compressible, fresh, pending = _sort(
        conversation, candidates, in_tail, conversation.last_user_message, memo, settings, result
    )
    settled_other = trail.other_tokens + _other_tokens(settled_items, candidates[:settled], seen)
    other_tokens = settled_other + _other_tokens(unsettled, candidates[settled:], seen)
    pressure = other_tokens + trail.candidate_tokens + _candidate_tokens(candidates, memo)
    # No other event is due (ruled out above); without a batch or a new turn, this only
    # moves the level when a threshold is crossed.
    due_pending = [*repeated_due, *pending] if batch or new_turn else []
    event = _event(memo, settings, pressure, due_pending, False, new_turn)
    due = fresh
    if event is not None:
        memo.events += 1
        result.event = event
        result.counters[f"event:{event}"] += 1
        due = [*fresh, *due_pending]
        compressible = [*repeated_due, *compressible]  # in history order: they come first
    result.tokens_before = trail.tokens_before + sum(c.tokens for c in candidates)
    _compress_due(conversation, compressible, due, memo, settings, result, ahead)
    tokens_after = trail.tokens_after + sum(estimate_tokens(c.item.value) for c in candidates)
    kept_in_full = trail.kept_in_full
    if event is not None:
        sent = trail.candidate_tokens
        for candidate in repeated_due:
            text = memo.decisions[candidate.fp].text
            if text is not None:  # was sent in full, so counted at its own tokens
                tokens_after += estimate_tokens(text) - candidate.tokens
                sent += estimate_tokens(text) - candidate.tokens
        still = [c for c in repeated_due if _sent_in_full(memo.decisions[c.fp])]
        if kept:
            still = sorted([*still, *kept], key=_position)
        kept_in_full = [c for c in kept_in_full if _kept_in_full(c, memo)]
        trail = replace(
            trail,
            pending=still,
            pending_tokens=sum(c.tokens for c in still),
            candidate_tokens=sent,
        )
    result.tokens_after = tokens_after
    result.kept_in_full = kept_in_full + [c for c in candidates if _kept_in_full(c, memo)]
    stripped, recurring, rest = trail.stripped, trail.recurring, False
    if layer_one:
        # As the view numbers the messages now: the settled ones that went whole (Responses
        # reasoning items) are all before ``old_from``.
        shift = count - len(trail.settled.after)
        now, more, rest = _old_turns(
            conversation,
            trail.head_end,
            old_from - shift,
            end - shift,
            memo,
            settings,
            seen,
            result,
        )
        stripped, recurring = stripped or now, recurring + more
    if (stripped or rest) and result.event is None and new_turn:
        _turn_event(memo, result)
    seen.trail = _trail(
        memo,
        settings,
        result,
        trail.head_end,
        conversation.settle(mark, trail.settled),
        settled_copies,
        call_arguments,
        candidates,
        settled,
        settled_other,
        recurring,
        settled_step,
        trail.resent,
        stripped,
        trail,
    )
    return result


def _position(candidate: _Candidate) -> int:
    return candidate.position


def _settled_end(conversation: Conversation, resent: int) -> int:
    """How many of the wire messages a request's trail settles: all but the last ``resent``,
    which its client sends again changed (``MAX_RESENT``). A later request does layer 1 again
    for those of old turns among them (``_old_turns``)."""
    return max(conversation.message_count - resent, 0)


def _sent_in_full(decision: Decision) -> bool:
    """Whether an output with this decision is sent in full and is due at the next event."""
    return decision.text is None and decision.level == 0 and not decision.final


@dataclass(slots=True, eq=False)
class Trail:
    """What ``compress`` made of a session's last request, for its next one (``_resume``):
    how its messages were left, and the parts of its result they account for."""

    memo: SessionMemo
    settings: CompressionSettings
    marks: tuple[int, int, int, int]  # the memo's, when it was left (``_marks``)
    head_end: int
    settled: Settled
    copies: dict[str, int]  # how many copies of each output so far, less one
    call_arguments: dict[str | None, str]
    result_calls: set[str | None]  # the call ids of the candidates
    pending: list[_Candidate]  # sent in full and not final: due at the next event
    pending_tokens: int
    other_tokens: int  # of the items that are not candidates, as they arrived
    candidate_tokens: int  # of the candidates, as sent
    tokens_before: int
    tokens_after: int
    originals: dict[str, str]
    changes: list[Change]  # as a later request reports them
    named: set[str]  # the keys those changes name
    recurring: Counter[str]  # what every request counts again (reasoning, reminders dropped)
    kept_in_full: list[_Candidate]
    changed: bool
    step: _Step  # as the walk numbered the messages
    resent: int  # the request's last messages it leaves out: they come again changed
    stripped: bool  # whether layer 1 changed anything in the old turns' settled messages


# Changes that are new only in the request that decided them; the others are reported alike
# by every request that makes them (reasoning and reminders of old turns).
_DECIDED = frozenset({ChangeKind.COMPRESSED, ChangeKind.DEDUPED, ChangeKind.CALL_CUT})


def _marks(memo: SessionMemo) -> tuple[int, int, int, int]:
    """What changes whenever a decision of the memo does: only ``compress`` changes them, and
    never without adding an event or a decision."""
    return (memo.events, len(memo.decisions), memo.level, memo.thresholds_crossed)


def _trail(
    memo: SessionMemo,
    settings: CompressionSettings,
    result: CompressionResult,
    head_end: int,
    settled: Settled,
    copies: dict[str, int],
    call_arguments: dict[str | None, str],
    candidates: list[_Candidate],
    settled_count: int,
    other_tokens: int,
    recurring: Counter[str],
    step: _Step,
    resent: int,
    stripped: bool,
    earlier: Trail | None = None,
) -> Trail:
    """The trail ``result`` leaves for the messages ``settled`` describes. ``candidates``: all
    of the request's, or those after ``earlier``'s; the first ``settled_count`` of them are of
    those messages, and what the others add to ``result`` is left out. ``copies``,
    ``other_tokens`` and ``step`` are of those messages."""
    unsettled = candidates[settled_count:]
    candidates = candidates[:settled_count]
    pending: list[_Candidate] = [] if earlier is None else list(earlier.pending)
    pending_tokens = sent_tokens = 0
    decisions = memo.decisions
    for candidate in candidates:
        decision = decisions[candidate.fp]
        if decision.text is not None:
            sent_tokens += estimate_tokens(decision.text)
        else:
            sent_tokens += candidate.tokens
            if _sent_in_full(decision):
                pending.append(candidate)
                pending_tokens += candidate.tokens
    calls = {c.item.call_id for c in candidates}
    # A resumed result's changes begin with the earlier trail's, already as reported later.
    earlier_changes = [] if earlier is None else earlier.changes
    end = len(settled.before)
    added = result.changes[len(earlier_changes) :]
    kept = [
        replace(change, new=False) if change.new and change.kind in _DECIDED else change
        for change in added
        if change.message < end
    ]
    changes = earlier_changes + kept
    # The earlier trail is this request's alone: its set is added to.
    named = set() if earlier is None else earlier.named
    named.update(change.key for change in kept if change.key is not None)
    tokens_before, tokens_after = result.tokens_before, result.tokens_after
    originals, kept_in_full, changed = result.originals, result.kept_in_full, result.changed
    left_out = len(added) - len(kept)
    if unsettled or left_out:
        tokens_before -= sum(c.tokens for c in unsettled)
        tokens_after -= sum(estimate_tokens(c.item.value) for c in unsettled)
        kept_in_full = [c for c in kept_in_full if c.position < settled.items]
        if left_out:
            # Every original comes with a change that names it: those that only the changes
            # left out name go (looked up by the few keys those name, not the session's all).
            gone = {
                change.key
                for change in added
                if change.message >= end and change.key is not None and change.key not in named
            }
            if gone:
                originals = dict(originals)
                for key in gone:
                    originals.pop(key, None)
            changed = bool(changes) or bool(+recurring)
    if earlier is not None:
        pending_tokens += earlier.pending_tokens
        sent_tokens += earlier.candidate_tokens
        calls |= earlier.result_calls
    return Trail(
        memo,
        settings,
        _marks(memo),
        head_end,
        settled,
        copies,
        call_arguments,
        calls,
        pending,
        pending_tokens,
        other_tokens,
        sent_tokens,
        tokens_before,
        tokens_after,
        originals,
        changes,
        named,
        recurring,
        kept_in_full,
        changed,
        step,
        resent,
        stripped,
    )


def _sort(
    conversation: Conversation,
    candidates: list[_Candidate],
    in_tail: list[bool],
    live_start: int,
    memo: SessionMemo,
    settings: CompressionSettings,
    result: CompressionResult,
) -> tuple[list[_Candidate], list[_Candidate], list[_Candidate]]:
    """Decide what needs no event (final outputs, and those of the protected tail, which are
    applied) and sort the rest: (compressible, never decided, sent in full so far)."""
    compressible: list[_Candidate] = []
    fresh: list[_Candidate] = []
    pending: list[_Candidate] = []
    for candidate, tail in zip(candidates, in_tail, strict=True):
        decision = memo.decisions.get(candidate.fp)
        if decision is None and (
            candidate.tokens < settings.min_output_tokens
            or is_protected(candidate.output, settings.protected_tools)
            or (
                is_subagent_report(candidate.output)
                and candidate.tokens <= settings.whole_report_tokens
            )
        ):
            decision = _decide(memo, result, candidate.fp, Decision(final=True))
        if decision is not None and decision.final:
            continue
        if tail:
            if decision is None:
                strict = not settings.compress_live_turn and candidate.item.message > live_start
                new = Decision(level=0) if strict else _on_arrival(candidate, settings, result)
                decision = _decide(memo, result, candidate.fp, new)
            _apply(conversation, candidate, decision, memo, result)
            continue
        compressible.append(candidate)
        if decision is None:
            fresh.append(candidate)
        elif decision.level == 0:
            pending.append(candidate)
    return compressible, fresh, pending


def _compress_due(
    conversation: Conversation,
    compressible: list[_Candidate],
    due: list[_Candidate],
    memo: SessionMemo,
    settings: CompressionSettings,
    result: CompressionResult,
    ahead: Compressions | None,
) -> None:
    """Compress the outputs ``due``, in history order up to the work cap, and apply every
    compressible output's decision."""
    chosen = {id(candidate) for candidate in due}
    work = 0  # characters compressed in this request, capped so no request stalls
    for candidate in compressible:
        if id(candidate) in chosen:
            if work >= settings.max_work_chars:
                result.counters["deferred"] += 1
                if candidate.fp not in memo.decisions:
                    _decide(memo, result, candidate.fp, Decision(level=0))
            else:
                duplicate = not candidate.fp.endswith("#0")
                work += 0 if duplicate else len(candidate.output.text)  # pointers are free
                decision = _compress_one(
                    candidate, duplicate, memo.level, settings, result, ahead=ahead
                )
                _decide(memo, result, candidate.fp, decision)
        _apply(conversation, candidate, memo.decisions[candidate.fp], memo, result)


def _focus(conversation: Conversation, head_end: int, memo: SessionMemo) -> frozenset[str]:
    """The task's terms, from the first user message; derived once per session."""
    task = "\n".join(
        i.text
        for i in conversation.items
        if i.message == head_end and i.role is Role.USER and i.kind is Kind.TEXT
    )
    digest = xxhash.xxh3_64_intdigest(utf8(task))
    if memo.focus is None or memo.focus[0] != digest:
        memo.focus = (digest, task_terms(task))
    return memo.focus[1]


def _call_arguments(items: list[Item]) -> dict[str | None, str]:
    return {item.call_id: item.text for item in items if item.kind is Kind.TOOL_CALL}


def _candidates(
    items: list[Item],
    head_end: int,
    focus: frozenset[str],
    memo: SessionMemo,
    seen: SeenTexts,
    call_arguments: dict[str | None, str],
    copies: dict[str, int],
    start: int = 0,
) -> list[_Candidate]:
    """The tool results among ``items`` (the walk's from ``start`` on) that may be compressed;
    ``copies`` counts the copies of each output seen so far (less one), in history order, and
    is updated."""
    found = []
    for position, item in enumerate(items, start):
        if item.kind is not Kind.TOOL_RESULT or item.message <= head_end:
            continue
        text = item.value
        if not isinstance(text, str):
            continue
        if text.startswith(MARKER_START):  # ours, echoed back: it still counts as its copy
            keys = marker_keys(text[: len(MARKER_START) + 200])
            content = memo.content_of_marker(keys[0]) if keys else None
            if content is not None:
                copies[content] = copies.get(content, -1) + 1
            continue
        output = ToolOutput(text, item.tool_name or "", call_arguments.get(item.call_id, ""), focus)
        content, tokens = seen.fingerprint(output)
        copy = copies[content] = copies.get(content, -1) + 1
        found.append(_Candidate(item, output, content, f"{content}#{copy}", tokens, position))
    return found


def _candidates_at_cut(
    settled_items: list[Item],
    unsettled: list[Item],
    start: int,
    cut: int,
    head_end: int,
    focus: frozenset[str],
    memo: SessionMemo,
    seen: SeenTexts,
    call_arguments: dict[str | None, str],
    copies: dict[str, int],
) -> tuple[list[_Candidate], int, dict[str, int]]:
    """``_candidates`` of the walk's items from ``start`` to ``cut`` (those a trail settles)
    and then of the ``unsettled`` ones after them: all the candidates, how many are settled,
    and the copies counted up to the cut."""
    found = _candidates(settled_items, head_end, focus, memo, seen, call_arguments, copies, start)
    settled = len(found)
    settled_copies = dict(copies) if unsettled else copies
    found += _candidates(unsettled, head_end, focus, memo, seen, call_arguments, copies, cut)
    return found, settled, settled_copies


def _tail_flags(
    candidates: list[_Candidate],
    step: _Step,
    live_start: int,
    settings: CompressionSettings,
    level: int,
) -> list[bool]:
    """Which results are protected: the latest step's, the newest ones within the recent
    window, and with ``compress_live_turn`` off, every result of the live turn."""
    latest_calls, last_call = step.calls, step.last_call
    recent = [False] * len(candidates)
    room = settings.recent_window(level)
    for index in range(len(candidates) - 1, -1, -1):
        room -= candidates[index].tokens
        if room < 0:
            break
        recent[index] = True
    return [
        recent[index]
        or c.item.call_id in latest_calls
        or c.item.message > last_call
        or (not settings.compress_live_turn and c.item.message > live_start)
        for index, c in enumerate(candidates)
    ]


def _other_tokens(items: list[Item], candidates: list[_Candidate], seen: SeenTexts) -> int:
    """The tokens of the items that are not candidates, as they are now."""
    results = {id(c.item) for c in candidates}
    count = seen.tokens
    return sum(count(i.text) for i in items if id(i) not in results)


def _candidate_tokens(candidates: list[_Candidate], memo: SessionMemo) -> int:
    """The candidates' tokens as they would be sent with the decisions made so far."""
    total = 0
    for candidate in candidates:
        decision = memo.decisions.get(candidate.fp)
        if decision is not None and decision.text is not None:
            total += estimate_tokens(decision.text)
        else:
            total += candidate.tokens
    return total


def _turn_fingerprint(conversation: Conversation) -> str:
    """Which user turn this is: how many user messages carry text so far, and the last one's
    text (not its index, which moves when older reasoning items are dropped). Counted in one
    pass over the items (in wire order), and only the last message's texts are read."""
    user, text = Role.USER, Kind.TEXT
    count, last = 0, -2
    for item in conversation.items:
        if item.role is user and item.kind is text and item.message != last:
            count, last = count + 1, item.message
    parts = [
        item.text
        for item in conversation.items[conversation.first_item_of(last) :]
        if item.message == last and item.role is user and item.kind is text
    ]
    last_text = "\n".join(parts)
    return xxhash.xxh3_64_hexdigest(utf8(f"{count}\x00{last_text}"))


def _event(
    memo: SessionMemo,
    settings: CompressionSettings,
    pressure: int,
    pending: list[_Candidate],
    cache_cold: bool,
    new_turn: bool,
) -> str | None:
    crossed = sum(1 for threshold in settings.pressure_thresholds if pressure >= threshold)
    if crossed > memo.thresholds_crossed:
        memo.thresholds_crossed = crossed
        memo.level = 1 + crossed
        if settings.recompress_on_pressure:
            return "pressure"
    if not pending:
        return None
    if cache_cold:
        return "cold"
    if new_turn:
        return "turn"
    if sum(c.tokens for c in pending) > settings.tail_tokens:
        return "batch"
    return None


def _decide(memo: SessionMemo, result: CompressionResult, fp: str, decision: Decision) -> Decision:
    memo.decisions[fp] = decision
    result.decisions[fp] = decision
    if memo.sent_as and decision.text is not None:
        for key in marker_keys(decision.text[: len(MARKER_START) + 200])[:1]:
            memo.sent_as[key] = fp.partition("#")[0]
    return decision


def _on_arrival(
    candidate: _Candidate, settings: CompressionSettings, result: CompressionResult
) -> Decision:
    """A new output is sent in full, unless it is large and of a kind whose compressed form
    keeps what the next step needs (``arrival_kinds``: listings and logs): then it is
    compressed at once, which costs no cache rewrite at all. Its kind is told by its shape
    first: an output of another kind is not compressed on the request path only to be sent
    in full (the request after it compresses it, computed ahead once the answer is out)."""
    if candidate.tokens < settings.arrival_tokens or not settings.arrival_kinds:
        return Decision(level=0)
    decision = _compress_one(candidate, False, 1, settings, result, settings.arrival_kinds)
    return decision if decision.text is not None else Decision(level=0)


def _compress_one(
    candidate: _Candidate,
    duplicate: bool,
    level: int,
    settings: CompressionSettings,
    result: CompressionResult,
    kinds: frozenset[str] | None = None,
    ahead: Compressions | None = None,
) -> Decision:
    text = candidate.output.text
    if duplicate:
        tool = candidate.output.tool or "tool"
        pointer = marker(
            f"{DUPLICATE_POINTER} {tool} output with the same arguments", ccr_key(text)
        )
        result.counters["dedup"] += 1
        return Decision(level=level, text=pointer)
    if ahead is not None:
        found = ahead.get(compression_key(candidate, level, settings))
        if found is not None:
            if found.counter is not None:
                result.counters[found.counter] += 1
            return Decision(found.level, found.text, found.final)
    budget = settings.budget(text, level)
    if is_subagent_report(candidate.output):  # a long report is cut to about the size of a
        report_chars = settings.whole_report_tokens * 4 // level  # whole one, not to a tenth
        budget = replace(budget, max_chars=max(budget.max_chars, report_chars))
    if kinds is None:
        outcome = compress_output(candidate.output, budget)
    else:
        outcome = compress_on_arrival(candidate.output, budget, kinds)
        if outcome is None:
            return Decision(level=level)
    decision, counter = _decision(candidate, level, settings, outcome)
    if counter is not None:
        result.counters[counter] += 1
    return decision


def _decision(
    candidate: _Candidate,
    level: int,
    settings: CompressionSettings,
    outcome: tuple[str, Compressed] | None,
) -> tuple[Decision, str | None]:
    """The decision a per-tool compressor's outcome makes, and the counter it adds."""
    last_level = level >= len(settings.level_ratios)
    if outcome is None:
        return Decision(level=level, final=last_level), None
    name, compressed = outcome
    replacement = (
        marker(compressed.omitted, ccr_key(candidate.output.text)) + "\n" + compressed.text
    )
    if not settings.pays_off(candidate.tokens, estimate_tokens(replacement)):
        return Decision(level=level, final=last_level), None
    return Decision(level=level, text=replacement), f"compressed:{name}"


def compression_key(
    candidate: _Candidate, level: int, settings: CompressionSettings
) -> CompressionKey:
    return (candidate.content, candidate.output.focus, level, settings)


def _kept_in_full(candidate: _Candidate, memo: SessionMemo) -> bool:
    """Sent in full, neither final nor a copy (a copy becomes a pointer): a later request
    compresses it, when it leaves the protected tail or the work cap lets it."""
    decision = memo.decisions.get(candidate.fp)
    return (
        decision is not None
        and decision.level == 0
        and not decision.final
        and candidate.fp.endswith("#0")
    )


@dataclass(slots=True)
class Ahead:
    """What ``precompute`` made: compressions by ``compression_key``, and the originals their
    markers name by CCR key (a store may keep them durably before any marker names them)."""

    compressions: list[tuple[CompressionKey, Precomputed]] = field(default_factory=list)
    originals: dict[str, str] = field(default_factory=dict)


def precompute(
    result: CompressionResult,
    level: int,
    settings: CompressionSettings,
    known: Container[CompressionKey] = (),
) -> Ahead:
    """The compressions a later request will most likely make of the outputs ``result``'s
    request sent in full (``kept_in_full``): at ``level`` (the session's), in history order up
    to the work cap, as ``compress`` makes them; those ``known`` are skipped."""
    ahead = Ahead()
    work = 0
    for candidate in result.kept_in_full:
        if work >= settings.max_work_chars:
            break
        text = candidate.output.text
        work += len(text)
        key = compression_key(candidate, level, settings)
        if key in known:
            continue
        scratch = CompressionResult()
        decision = _compress_one(candidate, False, level, settings, scratch)
        counter = next(iter(scratch.counters), None)
        found = Precomputed(decision.level, decision.text, decision.final, counter)
        ahead.compressions.append((key, found))
        if decision.text is not None:
            ahead.originals[ccr_key(text)] = text
    return ahead


def _original_key(memo: SessionMemo, fp: str, original: str) -> str:
    """The CCR key of the original behind ``fp``, hashed on first use only: every request
    hands every sent original to the store again (to keep it alive), but the hash is the
    same each time."""
    key = memo.original_keys.get(fp)
    if key is None:
        key = memo.original_keys[fp] = ccr_key(original)
    return key


def _apply(
    conversation: Conversation,
    candidate: _Candidate,
    decision: Decision,
    memo: SessionMemo,
    result: CompressionResult,
) -> None:
    if decision.text is None:
        return
    original = candidate.output.text
    key = _original_key(memo, candidate.fp, original)
    result.originals[key] = original
    conversation.set_text(candidate.item, decision.text)
    result.changed = True
    deduped = decision.text.startswith(MARKER_START + DUPLICATE_POINTER)
    result.changes.append(
        Change(
            ChangeKind.DEDUPED if deduped else ChangeKind.COMPRESSED,
            conversation.arrived_index(candidate.item.message),
            len(original),
            len(decision.text),
            decision.text,
            candidate.output.tool or None,
            key,
            tokens_before=candidate.tokens,
            tokens_after=estimate_tokens(decision.text),
            new=candidate.fp in result.decisions,
        )
    )


def _strip_old_turns(
    conversation: Conversation,
    head_end: int,
    start: int,
    live_start: int,
    settings: CompressionSettings,
    seen: SeenTexts,
    result: CompressionResult,
) -> bool:
    """Layer 1 for turns before the live one (the head excepted), from wire message ``start``
    on: reasoning out, whole units; long reminders out. True when something changed."""
    changed_before = result.changed
    result.changed = False
    dropped: list[Item] = []
    items = conversation.items
    for item in islice(items, conversation.first_item_of(start) if start else 0, None):
        if item.message >= live_start or item.message <= head_end:
            continue
        if settings.strip_reasoning and item.role is Role.ASSISTANT:
            if item.kind is Kind.REASONING:
                dropped.append(item)
            elif item.kind is Kind.TEXT and isinstance(item.value, str) and "<think" in item.value:
                without = seen.derive(item.value, "think", _without_think)
                if without != item.value:
                    result.changes.append(
                        Change(
                            ChangeKind.REASONING_DROPPED,
                            conversation.arrived_index(item.message),
                            len(item.value),
                            len(without),
                            without,
                        )
                    )
                    conversation.set_text(item, without)
                    result.counters["reasoning_dropped"] += 1
                    result.changed = True
        elif (
            settings.drop_system_reminders
            and item.role is Role.USER
            and item.kind is Kind.TEXT
            and isinstance(item.value, str)
            and "<system-reminder>" in item.value
        ):
            _drop_reminders(conversation, item, seen, result)
    if dropped:
        _drop_reasoning(conversation, dropped, result)
    stripped = result.changed
    result.changed = changed_before or stripped
    return stripped


def _cut_old_calls(
    conversation: Conversation,
    head_end: int,
    start: int,
    live_start: int,
    memo: SessionMemo,
    seen: SeenTexts,
    result: CompressionResult,
) -> bool:
    """Cut the long strings of tool calls in turns before the live one, from wire message
    ``start`` on; decided once per call (when its turn ends, or on sight), so later requests
    send the same bytes."""
    changed = False
    items = conversation.items
    for item in islice(items, conversation.first_item_of(start) if start else 0, None):
        if item.kind is not Kind.TOOL_CALL or item.message >= live_start:
            continue
        if item.message <= head_end:
            continue
        value = item.value
        if isinstance(value, str) and len(value) < MIN_ARGUMENTS_CHARS:
            continue
        original = item.text
        if len(original) < MIN_ARGUMENTS_CHARS:
            continue
        tool = item.tool_name or ""
        fp = seen.derive(original, CALL_PREFIX + tool, partial(_call_fingerprint, tool))
        decision = memo.decisions.get(fp)
        if decision is None:
            cut = cut_call(value, original, _original_key(memo, fp, original))
            decision = Decision(final=True) if cut is None else Decision(level=1, text=cut)
            result.counters["calls_cut"] += cut is not None
            memo.decisions[fp] = result.decisions[fp] = decision
        if decision.text is None:
            continue
        result.originals[_original_key(memo, fp, original)] = original
        # The arguments keep their wire shape: JSON text, or an object (Anthropic ``input``).
        conversation.set_value(
            item,
            decision.text if isinstance(value, str) else jsontext.loads(utf8(decision.text))[0],
        )
        result.changes.append(
            Change(
                ChangeKind.CALL_CUT,
                conversation.arrived_index(item.message),  # after reasoning items went
                len(original),
                len(decision.text),
                decision.text,
                item.tool_name,
                _original_key(memo, fp, original),
                new=fp in result.decisions,
            )
        )
        changed = True
    if changed:
        result.changed = True
    return changed


def _call_fingerprint(tool: str, arguments: str) -> str:
    return CALL_PREFIX + xxhash.xxh3_128_hexdigest(utf8(tool) + b"\x00" + utf8(arguments))


def _without_think(text: str) -> str:
    return THINK_BLOCK.sub("", text)


def _reminders_dropped(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """The text without its long reminders, and each dropped one: (block, key, pointer)."""
    dropped: list[tuple[str, str, str]] = []

    def replace(match: re.Match[str]) -> str:
        block = match.group(0)
        if len(block) < MIN_REMINDER_CHARS:
            return block
        key = ccr_key(block)
        pointer = marker("system reminder removed from an earlier turn", key)
        dropped.append((block, key, pointer))
        return pointer

    return SYSTEM_REMINDER.sub(replace, text), dropped


def _drop_reminders(
    conversation: Conversation, item: Item, seen: SeenTexts, result: CompressionResult
) -> None:
    text, dropped = seen.derive(item.value, "reminders", _reminders_dropped)
    for block, key, pointer in dropped:
        result.originals[key] = block
        result.counters["reminders_dropped"] += 1
        message = conversation.arrived_index(item.message)
        change = Change(ChangeKind.REMINDER_DROPPED, message, len(block), len(pointer))
        change.text, change.key = pointer, key
        result.changes.append(change)
    if text != item.value:
        conversation.set_text(item, text)
        result.changed = True


def _drop_reasoning(
    conversation: Conversation, dropped: list[Item], result: CompressionResult
) -> None:
    """Remove reasoning whole: the field, the thinking block, or the Responses item."""
    arrived = conversation.arrived_index
    sizes = [(arrived(item.message), _reasoning_chars(item.value)) for item in dropped]  # as yet
    count = conversation.drop_reasoning(dropped)
    if count:
        kept = {id(item) for item in conversation.items}
        result.changes.extend(
            Change(ChangeKind.REASONING_DROPPED, message, chars, 0)
            for item, (message, chars) in zip(dropped, sizes, strict=True)
            if id(item) not in kept
        )
        result.counters["reasoning_dropped"] += count
        result.changed = True


def _reasoning_chars(value: object) -> int:
    """The characters of a reasoning field, read without serialising it: a string, or the
    texts of a list of parts (a Responses summary)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(
            len(part["text"])
            for part in value
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0
