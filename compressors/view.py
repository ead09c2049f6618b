"""The view of a chat request, the same for every wire format.

A view never rebuilds a request. Its wire format (``compressors/wire/``) walks the parsed body
once and yields ``Item``s, each pointing at the exact JSON container and key its text came
from, so an edit is a single assignment into the original structure and every unknown field,
key order and provider extra survives serialisation.

Every edit goes through the ``Conversation`` (``set_text``, ``set_value``, ``writable``, the
appends and ``drop_reasoning``). Messages it was told are shared (``share_messages``: parsed
objects a cache hands to the next request of the session too) are copied before their first
edit, container by container, and the items pointing into them follow the copy; the shared
objects themselves are never changed.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from itertools import chain, compress, islice, repeat, starmap
from operator import add, attrgetter, is_, is_not, ne, or_
from typing import TYPE_CHECKING, Any

from compressors import jsontext

if TYPE_CHECKING:  # the formats build views; a view only calls back into its own format
    from compressors.wire.base import WireFormat

JsonObject = dict[str, Any]


class UnrecognisedBody(ValueError):
    """JSON that is not a chat body of the dialect, or one with a field of a shape the view
    does not understand (a message that is not an object, ``tool_calls`` that is not a list, a
    ``content`` that is neither text nor a list of parts...). The proxy relays such a body
    unchanged and lets the provider answer it."""


class Dialect(StrEnum):
    OPENAI_CHAT = "openai-chat"
    ANTHROPIC = "anthropic"
    OPENAI_RESPONSES = "openai-responses"


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Kind(StrEnum):
    TEXT = "text"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


@dataclass(slots=True)
class Item:
    """One piece of conversation text and the place in the body it lives.

    ``holder[key]`` is the value; ``message`` is the index of the wire message (or input item)
    it belongs to, -1 for a top-level system prompt (Anthropic ``system``, Responses
    ``instructions``).
    """

    kind: Kind
    role: Role
    message: int
    holder: Any
    key: str | int
    call_id: str | None = None
    tool_name: str | None = None

    @property
    def value(self) -> Any:
        return self.holder[self.key]

    @property
    def text(self) -> str:
        """The item's text; tool-call arguments given as objects are serialised."""
        value = self.holder[self.key]
        if isinstance(value, str):
            return value
        if value is None:
            return ""
        return jsontext.dumps(value).decode()


_holder, _message = attrgetter("holder"), attrgetter("message")
_fields = attrgetter("kind", "role", "message", "holder", "key", "call_id", "tool_name")


# The most last messages of a request a client may send again changed in the next one
# (OpenCode moves Anthropic's cache marks to the last two messages on every request): a walk
# notes where it stood before each of them (``WalkPoint``), and a stage's trail leaves them out
# (``Conversation.resent``, ``compressors.pipeline``).
MAX_RESENT = 4


@dataclass(frozen=True, slots=True)
class WalkPoint:
    """Where a walk stood before wire message ``message``: how many items it had found in the
    messages before it, the tool call names they named and the last user message among them."""

    message: int
    fields: int
    call_names: dict[str, str]
    last_user_message: int


@dataclass(frozen=True, slots=True)
class Walked:
    """What a format's walk found in a body's wire messages (``Conversation.walked``): each
    item's fields, in order, and what the walk knew after the last message. The session's next
    body, when it begins with the same message objects, is walked from where this ends
    (``Conversation.begin_walk``): the same items, without reading those messages again. The
    objects are a session's parsed messages, which nobody edits (``share_messages``)."""

    messages: list[Any]
    fields: list[tuple[Any, ...]]
    call_names: dict[str, str]  # tool call id -> tool name, of the calls among the messages
    last_user_message: int
    points: tuple[WalkPoint, ...] = ()  # before each of the last messages, in order
    # Items made from ``fields`` before the next walk needs them (``make_items``); each list
    # is taken by one walk (``take_items``), which changes its items as it likes.
    made: list[list[Item]] = field(default_factory=list, compare=False, repr=False)

    def make_items(self) -> None:
        """Make the items of these messages for the next body's walk now, off its path (work
        a request defers until its answer is out): a cold walk takes 0.3 µs an item to make
        them. Safe beside a walk taking them on another thread."""
        if not self.made:
            self.made.append(list(starmap(Item, self.fields)))

    def take_items(self, count: int) -> Iterable[Item]:
        """Fresh items of the first ``count`` fields, as the walk found them: the ones made
        ahead, or new ones."""
        try:
            made = self.made.pop()
        except IndexError:
            return starmap(Item, islice(self.fields, count))
        return made if count == len(made) else islice(made, count)

    def point_within(self, messages: list[Any]) -> WalkPoint | None:
        """The last point before which ``messages`` repeat these messages object for object,
        when they repeat all but some of the last (``MAX_RESENT``) of them."""
        points, walked = self.points, self.messages
        if (
            not points
            or points[0].message > len(messages)
            or not all(map(is_, islice(walked, points[0].message), messages))
        ):
            return None
        found = points[0]
        for point in points[1:]:
            if point.message > len(messages) or not all(
                map(is_, walked[found.message : point.message], messages[found.message :])
            ):
                break
            found = point
        return found


@dataclass(frozen=True, slots=True)
class Mark:
    """A conversation's wire messages and items as a stage found them (``Conversation.mark``):
    the items from ``first`` to ``last`` (those of the first ``end`` messages) with the
    container and message each pointed at."""

    messages: list[Any]
    items: list[Item]
    first: int
    last: int
    end: int
    holders: list[Any]
    numbers: list[int]
    last_user_message: int


@dataclass(frozen=True, slots=True)
class Moved:
    """The items a stage pointed elsewhere: each one's walk position (ascending), and the
    container and wire message it left the item at."""

    positions: list[int]
    holders: list[Any]
    numbers: list[int]

    def before(self, position: int) -> Moved:
        """Those at walk positions before ``position`` (this very record when they all are:
        its lists are never changed, and a long session's steps add to hundreds of them)."""
        cut = bisect.bisect_left(self.positions, position)
        if cut == len(self.positions):
            return self
        return Moved(self.positions[:cut], self.holders[:cut], self.numbers[:cut])

    def __add__(self, later: Moved) -> Moved:
        if not later.positions:
            return self
        if not self.positions:
            return later
        return Moved(
            self.positions + later.positions,
            self.holders + later.holders,
            self.numbers + later.numbers,
        )

    def apply(self, items: list[Item]) -> None:
        """Point the walk's ``items`` where the stage left them (in C loops: a long session's
        requests move hundreds of items each)."""
        found = list(map(items.__getitem__, self.positions))
        deque(map(setattr, found, repeat("holder"), self.holders), maxlen=0)
        deque(map(setattr, found, repeat("message"), self.numbers), maxlen=0)


@dataclass(frozen=True, slots=True)
class Settled:
    """What a stage made of a conversation's wire messages (``Conversation.settle``): a later
    request of the session that repeats them all, object for object, is given the same result
    (``Conversation.resume``) instead of running the stage on them again."""

    before: list[Any]  # the wire messages as the stage found them
    after: list[Any]  # as it left them (fewer, where the format removed some whole)
    removed: list[int]  # ``Conversation.removed_messages`` after it
    last_user_message: int  # as the walk found it, and after the stage
    last_user_after: int
    items: int  # how many items the walk found in them
    moved: Moved  # the items it pointed elsewhere
    kept: list[bool] | None  # which walked items are still in the view (None: all)
    dropped: int  # how many are not
    unfollowed: int  # how many wire messages after them the stage did not follow


@dataclass(slots=True)
class Conversation:
    """A parsed chat request body and the items found in it, in wire order."""

    wire: WireFormat
    body: JsonObject
    items: list[Item] = field(default_factory=list)
    last_user_message: int = -1
    # Indices, as the client sent them, of the wire messages removed whole (Responses
    # reasoning items), ascending: the messages after them are renumbered.
    removed_messages: list[int] = field(default_factory=list)
    _shared: bool = False  # the messages' containers are shared: copy before editing
    _owned: set[int] = field(default_factory=set)  # ids of the containers copied since
    _messages: list[Any] = field(default_factory=list)  # the body's message list, when shared
    _message_of_item: list[int] | None = None  # item.message of each item, for bisection

    _edits: EditMemo | None = None  # the session's edits of shared containers
    keep_walk: bool = False  # keep what the walk finds (``walked``) for the session's next body
    walked: Walked | None = None  # what the walk found in the wire messages (``end_walk``)
    _walk_head: int = 0  # items before the wire messages' (a top-level system prompt's)
    _walk_known: Walked | None = None  # what ``begin_walk`` was given and took
    _walk_taken: int = 0  # how many of its fields it took
    _walk_first: int = 0  # the first message walked
    _walk_points: list[WalkPoint] = field(default_factory=list)

    def begin_walk(self, messages: list[Any], known: Walked | None) -> tuple[int, dict[str, str]]:
        """Where a format's walk of the wire ``messages`` begins, once the items before them
        are in: the index of the first message to read and the tool call names known before
        it (the walk adds to them). When this body begins with the message objects ``known``
        describes, or with all but some of its last ones (``WalkPoint``), their items are
        added as that walk found them and the walk goes on after them."""
        self._walk_head = len(self.items)
        self._walk_known, self._walk_taken, self._walk_first = None, 0, 0
        self._walk_points = []
        if known is None:
            return 0, {}
        count, taken = len(known.messages), len(known.fields)
        last_user, call_names = known.last_user_message, known.call_names
        if count > len(messages) or not all(map(is_, known.messages, messages)):
            point = known.point_within(messages)
            if point is None:
                return 0, {}
            count, taken = point.message, point.fields
            last_user, call_names = point.last_user_message, point.call_names
        self._walk_known, self._walk_taken, self._walk_first = known, taken, count
        self.items.extend(known.take_items(taken))
        self.last_user_message = last_user
        return count, dict(call_names)

    def walk_indices(self, first: int, count: int, call_names: dict[str, str]) -> Iterator[int]:
        """The indices of the messages a format's walk reads, from ``first`` to ``count``;
        where the walk stands before each of the last ones is noted for the next body's walk
        (``WalkPoint``), when ``keep_walk`` asks for it."""
        last = max(first, count - MAX_RESENT) if self.keep_walk else count
        yield from range(first, last)
        for index in range(last, count):
            fields = len(self.items) - self._walk_head
            point = WalkPoint(index, fields, dict(call_names), self.last_user_message)
            self._walk_points.append(point)
            yield index

    def end_walk(self, messages: list[Any], call_names: dict[str, str]) -> None:
        """Keep what the walk begun by ``begin_walk`` found (``walked``), for the next body,
        when ``keep_walk`` asks for it."""
        if not self.keep_walk:
            return
        known, taken = self._walk_known, self._walk_taken
        found = list(map(_fields, self.items[self._walk_head + taken :]))
        points = self._walk_points
        if known is not None:
            # Its points before the first message walked stand, where still among the last.
            last = len(messages) - MAX_RESENT
            first = self._walk_first
            points = [p for p in known.points if last <= p.message < first] + points
        self.walked = Walked(
            list(messages),
            known.fields[:taken] + found if known is not None else found,
            call_names,
            self.last_user_message,
            tuple(points),
        )

    def share_messages(self, edits: EditMemo | None = None) -> None:
        """Treat every wire message as shared with other requests: its containers are copied
        (only those on the way to what changes) before an edit. With ``edits`` (the session's,
        kept across its requests), an edit made before to the same shared container gives
        the same result object again instead of a new copy."""
        self._shared = True
        self._messages = self.wire.messages(self.body)
        self._edits = edits
        if edits is not None:
            edits.next_request()

    @property
    def message_count(self) -> int:
        """How many wire messages the body has now."""
        return len(self._messages) if self._shared else len(self.wire.messages(self.body))

    @property
    def shares_edits(self) -> bool:
        """Whether edits go through the session's edit memo (``share_messages`` with one)."""
        return self._shared and self._edits is not None

    def first_item_of(self, message: int, lo: int = 0) -> int:
        """The index of the first item (from ``lo`` on) of wire message ``message`` or a later
        one: the items are in wire order."""
        return bisect.bisect_left(self.items, message, lo=lo, key=_message)

    def mark(self, first: int = 0, end: int | None = None) -> Mark:
        """The messages and items as they are now, to ``settle`` what a stage does to them;
        only items from ``first`` on are followed (the others are known to stay as they are),
        and with ``end``, only those of the first ``end`` wire messages: a stage must leave
        the others' items in the view, and their messages in place."""
        items, messages = self.items, self._messages
        if end is None or end >= len(messages):
            end, last = len(messages), len(items)
        else:
            last = self.first_item_of(end)
        rest = items[first:last]
        return Mark(
            list(messages),
            list(items),
            first,
            last,
            end,
            list(map(_holder, rest)),
            list(map(_message, rest)),
            self.last_user_message,
        )

    def settle(self, mark: Mark, earlier: Settled | None = None) -> Settled:
        """What the stage since ``mark`` made of the messages it follows; ``earlier``: what an
        earlier request made of the messages this one repeats (``resume``d into this one),
        which the stage left as they were before the item ``mark.first``."""
        walked, first, last = mark.items, mark.first, mark.last
        rest = walked[first:last]
        differs = map(
            or_,
            map(is_not, map(_holder, rest), mark.holders),
            map(ne, map(_message, rest), mark.numbers),
        )
        indices = list(compress(range(len(rest)), differs))
        now = list(map(rest.__getitem__, indices))
        moved = Moved(
            list(map(add, indices, repeat(first))),
            list(map(_holder, now)),
            list(map(_message, now)),
        )
        kept: list[bool] | None = None
        gone = len(walked) - len(self.items)
        if earlier is not None and gone == earlier.dropped:  # none since ``resume``
            added = last - earlier.items
            kept = None if earlier.kept is None else earlier.kept + [True] * added
        elif gone:
            present = set(map(id, self.items))
            kept = list(map(present.__contains__, map(id, walked[:last])))
        if earlier is not None:
            # Items from ``first`` on that ``resume`` moved and have not moved since are found
            # again in ``moved``: the earlier ones of them go.
            moved = earlier.moved.before(first) + moved
        unfollowed = len(mark.messages) - mark.end
        return Settled(
            mark.messages[: mark.end] if unfollowed else mark.messages,
            self._messages[: len(self._messages) - unfollowed],
            list(self.removed_messages),
            mark.last_user_message,
            self.last_user_message,
            last,
            moved,
            kept,
            gone,
            unfollowed,
        )

    def resent(self, settled: Settled, limit: int) -> int:
        """How many of the last wire messages ``settled`` describes are other objects here,
        when all before them are the same and they are at most ``limit``: the client sent
        them again changed (OpenCode moves Anthropic's cache marks to the last two messages
        on every request). 0 otherwise."""
        before, messages = settled.before, self._messages
        count = len(before)
        if not self.shares_edits or len(messages) < count:
            return 0
        differ = 0
        while differ < count and before[count - 1 - differ] is not messages[count - 1 - differ]:
            differ += 1
            if differ > limit:
                return 0
        if differ == 0 or differ == count:
            return 0
        return differ if all(map(is_, islice(before, count - differ), messages)) else 0

    def repeats(self, settled: Settled) -> int:
        """How many of this view's items belong to the messages ``settled`` describes, when
        it repeats all of them (object for object, as a stage finds them, nothing removed yet),
        with the same last user message or a later one, and adds some or none (a retry of the
        same body): 0 when it does not."""
        messages, count = self._messages, len(settled.before)
        if (
            not self.shares_edits
            or self.removed_messages
            or len(messages) < count
            or self.last_user_message < settled.last_user_message
            or settled.last_user_message < self.last_user_message < count
            or not all(map(is_, settled.before, messages))
        ):
            return 0
        items, known = self.items, settled.items
        if len(messages) == count:
            return known if len(items) == known else 0
        if len(items) <= known or items[known].message < count:
            return 0
        if known and items[known - 1].message >= count:
            return 0
        return known

    def resume(self, settled: Settled) -> None:
        """Make the messages ``settled`` describes (``repeats`` must hold) what its stage made
        of them, and this view's items of them follow, as if the stage had run again."""
        assert self._edits is not None
        items, count = self.items, len(settled.before)
        settled.moved.apply(items)
        self._messages[:count] = settled.after
        shift = count - len(settled.after)
        if shift:
            for item in items[settled.items :]:
                if item.message >= 0:
                    item.message -= shift
        if settled.kept is not None:
            self.items = list(compress(items, chain(settled.kept, repeat(True))))
        self.removed_messages = list(settled.removed)
        if self.last_user_message < count:
            self.last_user_message = settled.last_user_after
        else:  # a user message among those added
            self.last_user_message -= shift
        self._message_of_item = None
        self._edits.carry()

    def writable(self, index: int, *keys: str | int) -> Any:
        """Wire message ``index`` (of the body as it is now), or the value at ``keys`` inside
        it, with every container on the way safe to change in place."""
        return self._own([index, *keys])

    def replace_message(
        self, index: int, change: tuple[Any, ...], make: Callable[[Any], Any]
    ) -> None:
        """Put ``make(message)`` in place of wire message ``index`` (of the body as it is
        now) and point its items at it; ``make`` returns a changed copy and changes nothing it
        was given. ``change`` names the change (hashable, equal for the same change): a message
        shared with the session's last request that gets the same change again gets the very
        copy it got then (the edit memo), which is the same bytes for the body's writer."""
        messages = self._messages if self._shared else self.wire.messages(self.body)
        old = messages[index]
        if self._edits is not None and self._shared and id(old) not in self._owned:
            new = self._edits.edited(old, change, (), make)
        else:
            new = make(old)
            if self._shared:
                self._owned.add(id(new))
        messages[index] = new
        moved = {id(old): new}
        if isinstance(old, dict) and isinstance(new, dict):
            for key, value in old.items():
                if isinstance(value, dict | list) and new.get(key) is not value:
                    moved[id(value)] = new.get(key)
        for item in self._items_of(index):
            holder = moved.get(id(item.holder))
            if holder is not None:
                item.holder = holder

    def writable_holder(self, item: Item) -> Any:
        """The container the item's value lives in, safe to change in place."""
        if item.message >= 0 and self._shared and id(item.holder) not in self._owned:
            message = self._messages[item.message]
            keys = [] if message is item.holder else _keys_to(message, item.holder)
            if keys is None:  # never write into what another request may read
                raise RuntimeError(f"item of message {item.message} not found in it")
            self._own([item.message, *keys])
        return item.holder

    def set_text(self, item: Item, text: str) -> None:
        self.set_value(item, text)

    def set_value(self, item: Item, value: Any) -> None:
        """Replace the item's value (a tool call's arguments keep their wire shape)."""
        if self._edits is None or not self._shared or item.message < 0:
            self.writable_holder(item)[item.key] = value
        elif id(item.holder) in self._owned:
            item.holder[item.key] = value
        else:
            key = item.key
            self._replace(item, ("set", key, id(value)), (value,), partial(_with, key, value))

    def remove_value(self, item: Item) -> None:
        """Remove the item's key from its holder (a reasoning field dropped whole)."""
        if self._edits is None or not self._shared or item.message < 0:
            self.writable_holder(item).pop(item.key, None)
        elif id(item.holder) in self._owned:
            item.holder.pop(item.key, None)
        else:
            self._replace(item, ("pop", item.key), (), partial(_without_key, item.key))

    def remove_part(self, item: Item, index: int, key: str) -> None:
        """Remove the item's holder from the list at ``key`` of wire message ``index`` (a
        thinking block dropped whole)."""
        parts = self._messages[index][key] if self._shared else None
        if self._edits is None or parts is None or id(parts) in self._owned:
            parts = self.writable(index, key)
            parts[:] = [part for part in parts if part is not item.holder]
            return
        part = item.holder
        new = self._edits.edited(
            parts, ("without", id(part)), (part,), partial(_without_part, part)
        )
        self._replace_path(index, [key], parts, new)

    def _replace(
        self, item: Item, op: tuple[Any, ...], refs: tuple[Any, ...], make: Callable[[Any], Any]
    ) -> None:
        """Apply ``make`` to the item's (shared) holder through the session's edit memo."""
        assert self._edits is not None
        message = self._messages[item.message]
        keys = [] if message is item.holder else _keys_to(message, item.holder)
        if keys is None:  # never write into what another request may read
            raise RuntimeError(f"item of message {item.message} not found in it")
        self._replace_path(
            item.message, keys, item.holder, self._edits.edited(item.holder, op, refs, make)
        )

    def _replace_path(self, index: int, keys: list[Any], old: Any, new: Any) -> None:
        """Put ``new`` where ``old`` is (at ``keys`` in wire message ``index``), replacing each
        shared container above it by its edited version, and point the items at them."""
        assert self._edits is not None
        chain = [self._messages[index]]
        for key in keys[:-1]:
            chain.append(chain[-1][key])
        replaced = {id(old): new}
        for depth in range(len(keys) - 1, -1, -1):
            parent, key = chain[depth], keys[depth]
            if id(parent) in self._owned:  # private: it and everything above are in place
                parent[key] = new
                break
            child = new
            new = self._edits.edited(
                parent, ("child", key, id(child)), (child,), partial(_with, key, child)
            )
            replaced[id(parent)] = new
        else:
            self._messages[index] = new
        for item in self._items_of(index):
            moved = replaced.get(id(item.holder))
            if moved is not None:
                item.holder = moved

    def _own(self, keys: list[Any]) -> Any:
        """Copy every container from the message list down ``keys`` that is still shared,
        point the message's items at the copies, and return the value at the end."""
        if not self._shared:
            current: Any = self.wire.messages(self.body)
            for key in keys:
                current = current[key]
            return current
        current = self._messages
        moved: dict[int, Any] = {}
        for key in keys:
            value = current[key]
            if isinstance(value, dict | list) and id(value) not in self._owned:
                copy = dict(value) if isinstance(value, dict) else list(value)
                current[key] = copy
                self._owned.add(id(copy))
                moved[id(value)] = copy
                value = copy
            current = value
        if moved:
            for item in self._items_of(keys[0]):
                new = moved.get(id(item.holder))
                if new is not None:
                    item.holder = new
        return current

    def _items_of(self, index: int) -> list[Item]:
        """The items of wire message ``index``: a run of the list, which is in wire order."""
        if self._message_of_item is None or len(self._message_of_item) != len(self.items):
            self._message_of_item = [item.message for item in self.items]
        numbers = self._message_of_item
        low = bisect.bisect_left(numbers, index)
        return self.items[low : bisect.bisect_right(numbers, index, lo=low)]

    def arrived_index(self, message: int) -> int:
        """The index wire message ``message`` (of the body as it is now) had as it arrived."""
        for removed in self.removed_messages:
            if removed > message:
                break
            message += 1
        return message

    @property
    def dialect(self) -> Dialect:
        return self.wire.dialect

    @property
    def has_tools(self) -> bool:
        return bool(self.body.get("tools"))

    def texts(self, role: Role, kind: Kind = Kind.TEXT) -> Iterator[str]:
        for item in self.items:
            if item.role is role and item.kind is kind:
                yield item.text

    @property
    def system_text(self) -> str:
        return "\n".join(self.texts(Role.SYSTEM))

    def user_message_texts(self) -> list[str]:
        """The text of each user message that carries text (tool results excluded)."""
        by_message: dict[int, list[str]] = {}
        for item in self.items:
            if item.role is Role.USER and item.kind is Kind.TEXT:
                by_message.setdefault(item.message, []).append(item.text)
        return ["\n".join(parts) for _, parts in sorted(by_message.items())]

    def count(self, kind: Kind) -> int:
        return sum(1 for item in self.items if item.kind is kind)

    def user_messages(self, start: int = 0) -> list[tuple[int, str]]:
        """``(message index, text)`` of each user message that starts a turn, in order; with
        ``start``, of the wire messages from that index on.

        For Anthropic a user message that carries tool results continues the tool loop, so it
        is left out even when the client put text beside the results.
        """
        by_message: dict[int, list[str]] = {}
        carries_results: set[int] = set()
        user, text, result = Role.USER, Kind.TEXT, Kind.TOOL_RESULT
        items = self.items[self.first_item_of(start) :] if start > 0 else self.items
        for item in items:  # one pass: this runs on every request
            if item.kind is result:
                carries_results.add(item.message)
            elif item.role is user and item.kind is text:
                by_message.setdefault(item.message, []).append(item.text)
        return [
            (index, "\n".join(parts))
            for index, parts in sorted(by_message.items())
            if index not in carries_results
        ]

    def append_to_system(self, text: str) -> bool:
        """Add ``text`` after the system prompt; False when the request has none to extend.
        The added text comes after every existing byte of the prompt."""
        return self.wire.append_to_system(self, text)

    def append_to_message(self, index: int, text: str) -> bool:
        """Add ``text`` at the end of wire message ``index`` (a user message)."""
        return self.wire.append_to_message(self, index, text)

    def drop_reasoning(self, items: list[Item]) -> int:
        """Remove these reasoning items whole, where the format allows it, from the body and
        from this view (later stages append by message index); how many went."""
        dropped = self.wire.drop_reasoning(self, items)
        self._message_of_item = None  # items went, and Responses renumbers the rest
        return dropped


class EditMemo:
    """The edits a session's requests made to shared containers (``Conversation.share_messages``),
    kept from one request to the next: re-applying last request's compression to the same
    parsed objects gives last request's result objects, a lookup instead of a copy. Results are
    shared too (never changed in place); each entry holds the objects its key names by id, and
    only the entries the last request used are kept."""

    __slots__ = ("_current", "_previous")

    def __init__(self) -> None:
        self._previous: dict[tuple[int, tuple[Any, ...]], tuple[Any, tuple[Any, ...], Any]] = {}
        self._current: dict[tuple[int, tuple[Any, ...]], tuple[Any, tuple[Any, ...], Any]] = {}

    def __len__(self) -> int:
        return len(self._current)

    def next_request(self) -> None:
        self._previous, self._current = self._current, {}

    def carry(self) -> None:
        """Keep every edit of the last request for the next one too: this request repeats
        them without making them again (``Conversation.resume``): the last request's entries
        become this one's, with the few it made so far added to them, not copied."""
        self._previous.update(self._current)
        self._current = self._previous

    def edited(
        self,
        container: Any,
        op: tuple[Any, ...],
        refs: tuple[Any, ...],
        make: Callable[[Any], Any],
    ) -> Any:
        """``make(container)``, or the result the same edit (``op``, naming ``refs`` by id)
        of the same container gave before."""
        key = (id(container), op)
        entry = self._current.get(key) or self._previous.get(key)
        if entry is None or entry[0] is not container or not all(map(is_, entry[1], refs)):
            entry = (container, refs, make(container))
        self._current[key] = entry
        return entry[2]


def _with(key: Any, value: Any, container: Any) -> Any:
    """A copy of ``container`` with ``value`` at ``key`` (a dict keeps its key order)."""
    if isinstance(container, dict):
        return {**container, key: value}
    copy = list(container)
    copy[key] = value
    return copy


def _without_key(key: Any, container: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in container.items() if name != key}


def _without_part(part: Any, parts: list[Any]) -> list[Any]:
    return [other for other in parts if other is not part]


def _keys_to(root: Any, holder: Any) -> list[Any] | None:
    """The keys (and list indices) that lead from ``root`` to the container ``holder``."""
    if root is holder:
        return []
    pairs = root.items() if isinstance(root, dict) else enumerate(root)
    for key, inner in pairs:
        if isinstance(inner, dict | list):
            found = _keys_to(inner, holder)
            if found is not None:
                return [key, *found]
    return None
