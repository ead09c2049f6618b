"""The previous request body of each session, kept parsed, so that the next one is parsed only
from where it differs.

An agent's request is its previous one plus a few messages. ``BodyCache`` keeps, per session,
the previous body's bytes, where each wire message ends in them, and its parsed message objects,
which nobody edits (the view copies what it changes, and keeps the session's edits from one
request to the next: ``Conversation.share_messages``). When a new body repeats the previous
one's bytes up to the end of message k, those k objects are taken again and orjson parses only
the rest: the bytes before the message list followed by the bytes after message k, a JSON
document of its own. The value is
the one parsing the whole body gives, because a parser reads the same bytes into the same state.

Only bodies whose messages are written as orjson writes them (compact: what OpenCode and most
clients send) are kept: where a message ends is found by serialising it and finding exactly
those bytes in the body. Anything else (another shape, spaces, an integer orjson cannot hold,
a title request of the same session) is parsed whole, as before.

What the view's walk found in the kept messages (``compressors.view.Walked``) is kept with
them, so the next body is walked from where it differs too.

The members after the message list (OpenCode sends its tool schemas there: 20 KB, 40 us to
parse and 30 us to write again on every step) are taken again too, when their bytes repeat
the previous body's and none of them is a member the format edits (``edited_members``): the
rest of a body is only ever read, so those objects stay as parsed.

The rewritten body is written the same way round (``write``): the run of messages it shares
with the session's last forwarded body, object for object (a repeated message, or the result
object the edit memo gives back for a repeated edit), keeps that body's bytes, and only the
messages after it are serialised. Forwarded objects are never changed in place, so the same
object is the same bytes; and orjson writes an object as its members' texts joined by commas,
so the result is the bytes serialising the whole body gives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, compress, count
from operator import is_not
from typing import Any, TypeVar

import orjson

from compressors import jsontext
from compressors.pipeline import SeenTexts
from compressors.view import MAX_RESENT, EditMemo, Walked
from compressors.wire import (
    WireFormat,
    cache_mark_spans,
    without_cache_mark_bytes,
    without_cache_marks,
)

MAX_SESSIONS = 64
MAX_BYTES = 64 * 1024 * 1024  # of kept bodies; their parsed objects take a few times more
_COMMA, _CLOSE = ord(","), ord("]")
B = TypeVar("B", bytes, memoryview)


@dataclass(frozen=True, slots=True)
class Written:
    """A rewritten body a session forwarded: its bytes, its message objects and where each
    ends in the bytes. The objects are never changed in place once forwarded (the view copies
    what it edits), so the same object in the same place is the same bytes."""

    head: bytes  # up to the first message: the members before the list, its key, "["
    messages: list[Any]
    data: bytes
    ends: list[int]  # offset just past each message
    after: list[tuple[str, Any]]  # the members after the list, as written
    closing_size: int  # their bytes' length: from the list's "]" to the body's "}"

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def closing(self) -> memoryview:
        return memoryview(self.data)[len(self.data) - self.closing_size :]


@dataclass(slots=True)
class Parsed:
    """A parsed body and what the cache needs to keep it for the session's next request."""

    body: Any
    exact: bool  # parsed by the stdlib: it holds an integer orjson cannot
    messages: list[Any] = field(default_factory=list)  # as parsed, before anyone edits them
    reused: int = 0  # how many of them came from the previous body
    previous: int = 0  # how many messages the previous body had (0: no previous body)
    start: int = -1  # offset of the first message in the body's bytes; -1: not keepable
    ends: list[int] = field(default_factory=list)  # offset just past each message
    edits: EditMemo = field(default_factory=EditMemo)  # the session's, carried along
    seen: SeenTexts = field(default_factory=SeenTexts)  # and what was derived from its texts
    written: Written | None = None  # the last body forwarded for the session, rewritten
    walked: Walked | None = None  # what the walk found in the messages (first: the last body's)
    # The members after the message list as parsed, when none is one the format edits: never
    # changed, so the next body that repeats their bytes takes them again (None: it parses).
    tail: dict[str, Any] | None = None
    # How many after ``reused`` are the previous body's next ones again but for their cache
    # marks (Anthropic's move to the last messages at every step): nothing new to read in them.
    alike: int = 0
    raw: bytes = b""  # the bytes parsed (where ``ends`` point), when keepable


@dataclass(frozen=True, slots=True)
class Growth:
    """The new messages of a session's body (``BodyCache.growth``): offsets in its bytes."""

    start: int  # just past the last message repeated from the previous body
    end: int  # just past the last message
    resent: int = 0  # bytes the previous body's messages after the repeated ones took

    @property
    def added(self) -> int:
        """The bytes of messages this body adds, those it sends again changed (the previous
        body's last ones, with moved cache marks) not counted."""
        return max(0, self.end - self.start - self.resent)


@dataclass(frozen=True, slots=True)
class _Unmarked:
    """A kept message with cache marks, as its client sends it again without them: where the
    bytes of that (``without_cache_mark_bytes``) lie in the kept body, the runs between its
    marks (offsets, not a copy: a marked message may be a large tool output), and the value
    (``without_cache_marks``)."""

    runs: tuple[tuple[int, int], ...]
    size: int  # the runs' bytes in all
    message: Any

    def sent_at(self, raw: bytes, at: int, kept: memoryview) -> bool:
        """Whether ``raw`` holds these bytes from offset ``at`` on (``kept``: the kept body's)."""
        for begin, end in self.runs:
            if not raw.startswith(kept[begin:end], at):
                return False
            at += end - begin
        return True


@dataclass(frozen=True, slots=True)
class _LastMarks:
    """The cache marks of a kept body's last messages (``_Kept.read_ahead``)."""

    # The last ``MAX_RESENT`` messages without their marks, by index (None: it has none).
    unmarked: dict[int, _Unmarked | None]
    # From which message on the last ones all have marks (the count of messages: the last has
    # none): where the next body likely stops repeating the kept bytes.
    marked_from: int


@dataclass(slots=True)
class _Kept:
    raw: bytes
    start: int
    ends: list[int]
    messages: list[Any]
    edits: EditMemo
    seen: SeenTexts
    written: Written | None
    walked: Walked | None
    tail: dict[str, Any] | None  # ``Parsed.tail``
    size: int  # bytes counted against the cache's limit
    marks: _LastMarks | None = None  # found once the answer is out (``read_ahead``)

    @property
    def closing(self) -> memoryview:
        """The bytes from the message list's "]" on."""
        return memoryview(self.raw)[self.ends[-1] :]

    def read_ahead(self) -> None:
        """Find the last messages' cache marks now, off the next body's path (work a request
        defers until its answer is out): OpenCode moves Anthropic's marks to the last two
        messages at every step, so the next body repeats these bytes only up to the first
        marked one, and sends the marked ones again without their marks. Finding the marks
        and the values without them took 0.1 ms at the median on the corpus's Anthropic
        steps (caches cold). Safe beside a parse on another thread: it only adds."""
        if self.marks is not None:
            return
        count = len(self.ends)
        unmarked = {
            index: _unmark(self, index) for index in range(max(0, count - MAX_RESENT), count)
        }
        marked_from = count
        while marked_from - 1 in unmarked and unmarked[marked_from - 1] is not None:
            marked_from -= 1
        self.marks = _LastMarks(unmarked, marked_from)


def _unmark(kept: _Kept, index: int) -> _Unmarked | None:
    """Kept message ``index`` without its cache marks; None when it has none."""
    begin = _message_start(kept.start, kept.ends, index)
    spans = cache_mark_spans(kept.raw[begin : kept.ends[index]])
    if not spans:
        return None
    cuts = [0, *chain.from_iterable(spans), kept.ends[index] - begin]
    runs = tuple(
        (begin + a, begin + b) for a, b in zip(cuts[::2], cuts[1::2], strict=True) if b > a
    )
    size = sum(end - start for start, end in runs)
    return _Unmarked(runs, size, without_cache_marks(kept.messages[index]))


class BodyCache:
    """Per session (and wire format), the last agent request's body, bytes and parsed messages.

    A session's requests are rewritten one at a time (``RewriteRunner``); different sessions
    use the cache from several threads, so its bookkeeping is locked.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0  # requests parsed from where they differ
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._lock = threading.Lock()
        # The last ``_repeated`` found: a light step's is asked before its parse (``growth``,
        # on the event loop) and again by it; comparing the bytes twice costs ~0.1 ms per MB.
        self._last_repeated: tuple[_Kept, bytes, int] | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def parse(self, key: tuple[str, str] | None, wire: WireFormat, raw: bytes) -> Parsed:
        """``raw`` parsed (raises ``ValueError`` for what is not JSON, as ``jsontext.loads``)."""
        kept = self._kept.get(key) if key is not None else None
        if kept is not None:
            parsed = _parse_after(kept, wire, raw, self._repeated(kept, raw))
            if parsed is not None:
                with self._lock:
                    self.hits += 1
                return parsed
        body, exact = jsontext.loads(raw)
        parsed = Parsed(body, exact, raw=raw)
        if key is not None and not exact and isinstance(body, dict):
            messages = body.get(wire.messages_key)
            if isinstance(messages, list) and messages:
                parsed.messages = list(messages)
                parsed.start = _messages_start(raw, wire.messages_key, messages[0])
                if parsed.start >= 0:
                    _locate(parsed, raw, parsed.start, 0)
                if parsed.start >= 0 and not _rest_matches(parsed, raw, wire.messages_key):
                    parsed.start = -1
                parsed.tail = _tail(body, wire)
        return parsed

    def basis(self, key: tuple[str, str]) -> object:
        """What the session's next body is parsed against, compared by identity: it changes
        whenever a request of the session is remembered or forgotten."""
        return self._kept.get(key)

    def growth(self, key: tuple[str, str] | None, raw: bytes) -> Growth | None:
        """Where the messages ``raw`` adds to the session's previous body lie in it, when it
        repeats all of that body's messages but at most the last two (None otherwise). The
        rest of the body is taken to be as long as before: a hint, found without parsing."""
        kept = self._kept.get(key) if key is not None else None
        if kept is None:
            return None
        reused = self._repeated(kept, raw)
        if reused == 0 or reused < len(kept.ends) - 2:
            return None
        after_messages = len(kept.raw) - kept.ends[-1]
        start = kept.ends[reused - 1]
        return Growth(start, len(raw) - after_messages, kept.ends[-1] - start)

    def _repeated(self, kept: _Kept, raw: bytes) -> int:
        last = self._last_repeated
        if last is not None and last[0] is kept and last[1] is raw:
            return last[2]
        reused = _repeated(kept, raw)
        self._last_repeated = (kept, raw, reused)
        return reused

    def remember(
        self, key: tuple[str, str], raw: bytes, parsed: Parsed
    ) -> Callable[[], None] | None:
        """Keep ``raw`` as the session's body to parse the next request against. Returns what
        may be done for that parse once the answer is out (``_Kept.read_ahead``), if kept."""
        if parsed.start < 0 or len(parsed.ends) != len(parsed.messages):
            self.forget(key)
            return None
        size = len(raw) + (parsed.written.size if parsed.written is not None else 0)
        kept = _Kept(
            raw,
            parsed.start,
            parsed.ends,
            parsed.messages,
            parsed.edits,
            parsed.seen,
            parsed.written,
            parsed.walked,
            parsed.tail,
            size,
        )
        with self._lock:
            self._drop(key)
            if size > self.max_bytes:
                return None
            self._kept[key] = kept
            self.bytes += size
            while len(self._kept) > self.max_sessions or self.bytes > self.max_bytes:
                self._drop(next(iter(self._kept)))
        return kept.read_ahead

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept.size


def _parse_after(kept: _Kept, wire: WireFormat, raw: bytes, reused: int) -> Parsed | None:
    """``raw`` parsed with the ``reused`` messages it repeats from ``kept`` taken as they are;
    None when it repeats none of them (or its rest is not a body this cache can keep)."""
    if reused == 0:
        return None
    unmarked = _unmarked(kept, raw, reused)
    end = unmarked[-1][1] if unmarked else kept.ends[reused - 1]
    after = end + 1 if raw[end] == _COMMA else end  # the next message, or the closing bracket
    try:
        body, exact, members = _parse_rest(kept, wire, raw, after)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    tail = body.get(wire.messages_key) if isinstance(body, dict) else None
    if exact or not isinstance(tail, list):
        return None
    messages = kept.messages[:reused] + [message for message, _ in unmarked] + tail
    body[wire.messages_key] = list(messages)
    parsed = Parsed(
        body,
        False,
        messages,
        reused,
        len(kept.ends),
        kept.start,
        kept.ends[:reused] + [end for _, end in unmarked],
        kept.edits,
        kept.seen,
        kept.written,
        kept.walked,
        raw=raw,
    )
    first = reused + len(unmarked)  # the first message parsed
    _locate(parsed, raw, after, first)
    parsed.alike = len(unmarked) + (_alike(kept, raw, parsed, first) if parsed.start >= 0 else 0)
    parsed.tail = members
    return parsed


def _unmarked(kept: _Kept, raw: bytes, reused: int) -> list[tuple[Any, int]]:
    """The kept messages after the ``reused`` ones that ``raw`` sends next again with their
    cache marks taken out (OpenCode moves Anthropic's marks to the last two messages at every
    step), each as its kept object without them (``without_cache_marks``: the value parsing
    those bytes gives, sharing the kept object's strings and unmarked parts) and where it ends
    in ``raw``. They are found by their bytes, not parsed: the kept message's bytes without
    their marks (``without_cache_mark_bytes``) are what orjson writes of that value."""
    found: list[tuple[Any, int]] = []
    end = kept.ends[reused - 1]
    ahead = kept.marks.unmarked if kept.marks is not None else {}
    previous = memoryview(kept.raw)
    for index in range(reused, len(kept.ends)):
        if raw[end] != _COMMA:
            break
        unmarked = ahead[index] if index in ahead else _unmark(kept, index)
        if unmarked is None:  # no mark in it: the same bytes would have been repeated
            break
        start = end + 1
        end = start + unmarked.size
        if not (
            len(raw) > end
            and raw[end] in (_COMMA, _CLOSE)
            and unmarked.sent_at(raw, start, previous)
        ):
            break
        found.append((unmarked.message, end))
    return found


def _parse_rest(
    kept: _Kept, wire: WireFormat, raw: bytes, after: int
) -> tuple[Any, bool, dict[str, Any] | None]:
    """``raw`` without the messages before ``after`` (those it repeats from ``kept``), parsed,
    whether exactly, and its members after the message list (``Parsed.tail``). When those
    members' bytes are the kept body's, only the members before the list and the new messages
    are parsed, and the kept members are taken again: the bytes between the list's opening and
    closing brackets are the same elements either way, so the value is the one a whole parse
    gives."""
    members, closing = kept.tail, kept.closing
    if members is not None and len(raw) - len(closing) >= after and raw.endswith(closing):
        rest = raw[: kept.start] + raw[after : len(raw) - len(closing)] + b"]}"
        body, exact = jsontext.loads(rest)
        if isinstance(body, dict) and members.keys().isdisjoint(body):
            body.update(members)
            return body, exact, members
    body, exact = jsontext.loads(raw[: kept.start] + raw[after:])
    return body, exact, _tail(body, wire) if isinstance(body, dict) else None


def _tail(body: dict[str, Any], wire: WireFormat) -> dict[str, Any] | None:
    """The body's members after its message list, when none is one the format edits."""
    names = list(body)
    try:
        members = names[names.index(wire.messages_key) + 1 :]
    except ValueError:
        return None
    if not wire.edited_members.isdisjoint(members):
        return None
    return {name: body[name] for name in members}


def _alike(kept: _Kept, raw: bytes, parsed: Parsed, first: int) -> int:
    """How many of ``parsed``'s messages from ``first`` on are ``kept``'s again but for their
    cache marks (``cache_control``, on the message or its content blocks: moved, not only taken
    out), compared by their bytes: both bodies' messages are written as orjson writes them."""
    alike = 0
    for index in range(first, min(len(kept.ends), len(parsed.ends))):
        old = _message_bytes(kept.raw, kept.start, kept.ends, index)
        new = _message_bytes(raw, parsed.start, parsed.ends, index)
        if old != new and without_cache_mark_bytes(old) != without_cache_mark_bytes(new):
            break
        alike += 1
    return alike


def _message_bytes(raw: B, start: int, ends: list[int], index: int) -> B:
    return raw[_message_start(start, ends, index) : ends[index]]


def _message_start(start: int, ends: list[int], index: int) -> int:
    """Where message ``index`` begins: after the comma that ends the one before it."""
    return ends[index - 1] + 1 if index else start


def write(parsed: Parsed, wire: WireFormat) -> bytes | None:
    """The bytes of ``parsed.body`` as it is now (its messages rewritten): what
    ``jsontext.dumps`` gives, with the run of messages that starts the session's last forwarded
    body taken from its bytes, not serialised again, and so are the members after the list
    when they are the very objects written last time (never edited: ``Parsed.tail``). Kept for
    the next request (``written``). None when the body cannot be written this way (not a body
    the cache keeps, or it holds an integer orjson cannot write): the caller serialises it
    whole."""
    body = parsed.body
    key = wire.messages_key
    if parsed.start < 0 or not isinstance(body, dict):
        return None
    messages = body.get(key)
    if not isinstance(messages, list):
        return None
    try:
        before: list[bytes] = []
        after: list[tuple[str, Any]] = []
        listed = False
        for name, value in body.items():
            if name == key:
                listed = True
            elif listed:
                after.append((name, value))
            else:
                before.append(orjson.dumps(name) + b":" + orjson.dumps(value))
        head = b"{" + b"".join(member + b"," for member in before) + orjson.dumps(key) + b":["
        last = parsed.written
        same = 0
        if last is not None and last.head == head:
            same = same_objects(messages, last.messages)
        ends = last.ends[:same] if last is not None and same else []
        chunks: list[bytes | memoryview] = [
            memoryview(last.data)[: ends[-1]] if last is not None and same else head
        ]
        position = ends[-1] if ends else len(head)
        received = _received(parsed, len(messages) - same)
        came = memoryview(parsed.raw)
        for message in messages[same:]:
            index = received.get(id(message))
            text: bytes | memoryview = (
                orjson.dumps(message)
                if index is None
                else _message_bytes(came, parsed.start, parsed.ends, index)
            )
            if ends:
                chunks.append(b",")
                position += 1
            chunks.append(text)
            position += len(text)
            ends.append(position)
        closing = _closing(after, last, wire.edited_members)
    except TypeError:  # an integer beyond 64 bits
        return None
    chunks.append(closing)
    data = b"".join(chunks)
    parsed.written = Written(head, list(messages), data, ends, after, len(closing))
    return data


def _received(parsed: Parsed, count: int) -> dict[int, int]:
    """The last ``count`` messages this body brought, by id, with their index: those ``write``
    may find after the run it takes from the last forwarded body (the ``count`` after it).
    Nobody edits a parsed message in place (the view copies what it changes), so one still in
    the body is the bytes it came as, which ``_locate`` found to be what orjson writes of it.
    Where the format removed messages whole (Responses reasoning items) they are before the
    last ``count`` as a rule; one that is not found here is serialised (the same bytes), so the
    index never covers the removed ones a long session accumulates."""
    messages = parsed.messages
    if not parsed.raw or len(parsed.ends) != len(messages):
        return {}
    first = max(len(messages) - count, 0)
    return {id(message): index for index, message in enumerate(messages[first:], first)}


def _closing(
    after: list[tuple[str, Any]], last: Written | None, edited: frozenset[str]
) -> bytes | memoryview:
    """The bytes from the message list's "]" on: the last forwarded body's, when the members
    after the list are the same objects and none is one the format edits in place."""
    if (
        last is not None
        and len(last.after) == len(after)
        and all(
            name == was and value is value_was and name not in edited
            for (name, value), (was, value_was) in zip(after, last.after, strict=True)
        )
    ):
        return last.closing
    return (
        b"]"
        + b"".join(b"," + orjson.dumps(name) + b":" + orjson.dumps(v) for name, v in after)
        + b"}"
    )


def same_objects(messages: list[Any], previous: list[Any]) -> int:
    """How many of ``messages`` are ``previous``'s, object for object, from the first on (a
    scan in C: a long session's body holds a thousand messages)."""
    limit = min(len(messages), len(previous))
    return next(compress(count(), map(is_not, messages, previous)), limit)


def _repeated(kept: _Kept, raw: bytes) -> int:
    """How many of the kept messages ``raw`` repeats byte for byte, from its first byte on.

    The first guess is all of them (an agent's next body), or those before the last marked
    ones (``_LastMarks.marked_from``: Anthropic's moved cache marks). Past a count known to
    repeat, only the bytes after it are compared: the difference of a body that sends its
    last messages again changed is near its end, where every comparison of the whole prefix
    would reach."""
    previous, ends = memoryview(kept.raw), kept.ends

    def repeats(known: int, count: int) -> bool:
        """Whether ``raw`` repeats the first ``count`` messages, given it repeats ``known``."""
        begin, end = ends[known - 1] if known else 0, ends[count - 1]
        return (
            len(raw) > end
            and raw[end] in (_COMMA, _CLOSE)
            and raw.startswith(previous[begin:end], begin)
        )

    guess = len(ends) if kept.marks is None else max(1, kept.marks.marked_from)
    # repeats(low) holds (0 trivially); repeats(high + 1) fails, or high is every message.
    low, high = (guess, len(ends)) if repeats(0, guess) else (0, guess - 1)
    while low < high:
        middle = (low + high + 1) // 2
        if repeats(low, middle):
            low = middle
        else:
            high = middle - 1
    return low


def _messages_start(raw: bytes, key: str, first: Any) -> int:
    """Where the first message seems to begin in ``raw`` (``_rest_matches`` makes sure)."""
    opening = jsontext.dumps(key) + b":["
    start = raw.find(opening + jsontext.dumps(first))
    return start + len(opening) if start >= 0 else -1


def _rest_matches(parsed: Parsed, raw: bytes, key: str) -> bool:
    """Whether the bytes before the located message list and after it parse to this very body
    without its messages: the list found is the body's, not a look-alike inside another value."""
    try:
        rest, _ = jsontext.loads(raw[: parsed.start] + raw[parsed.ends[-1] :])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    body = parsed.body
    return isinstance(rest, dict) and rest == {k: [] if k == key else v for k, v in body.items()}


def _locate(parsed: Parsed, raw: bytes, position: int, first: int) -> None:
    """Find where messages ``first`` on end in ``raw``, from ``position``; when a message is not
    written exactly as orjson writes it, the body is marked not keepable."""
    ends = parsed.ends
    messages = parsed.messages
    for index in range(first, len(messages)):
        data = jsontext.dumps(messages[index])
        if not raw.startswith(data, position):
            parsed.start = -1
            return
        position += len(data)
        ends.append(position)
        if position >= len(raw) or raw[position] != (
            _COMMA if index < len(messages) - 1 else _CLOSE
        ):
            parsed.start = -1
            return
        position += 1
