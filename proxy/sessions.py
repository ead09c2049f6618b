"""Which session a request belongs to, what kind of request it is, and what each session saw."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import xxhash

from compressors.transcript_grammar import conversation_span
from compressors.view import Conversation, Kind, Role
from compressors.wire import Usage
from memory.threads import NamedThread
from proxy.costs import PrefixTracker, StreamTokens
from proxy.prices import ModelPrice, MoneyTally

log = logging.getLogger("deepmem.proxy")

SESSION_HEADER = "x-session-id"
PARENT_SESSION_HEADER = "x-parent-session-id"
MAX_SESSION_ID_LENGTH = 200
RECENT_REQUESTS = 200  # chat requests remembered per session, for the dashboard
# And at most this many over all sessions (a few hundred bytes each): past it, the least
# recently seen sessions are forgotten, so the statistics cannot grow to max_sessions full ones.
MAX_RECORDS = 10_000
# How long the bookkeeping thread lets settled books gather once one is ready: it counts them
# together, and a request's answer no longer wakes a thread of its own as it goes out.
BOOKS_BATCH_SECONDS = 0.05
# How long it goes on looking every BOOKS_BATCH_SECONDS after the last book it counted, before
# it sleeps until a book wakes it: while requests keep coming, none of them wakes it.
BOOKS_LINGER_SECONDS = 2.0
# A request whose answer takes longer is shown meanwhile (``SessionRegistry.show_meanwhile``),
# pending or streaming on the dashboard; a quick answer is counted once, after it.
PENDING_SHOWN_AFTER = 0.1


class RequestKind(StrEnum):
    AGENT = "agent"
    TITLE = "title"
    COMPACTION = "compaction"
    OTHER = "other"


def given_session_id(headers: Any) -> str | None:
    """The session a request names itself (OpenCode's ``x-session-id``), as every per-session
    table keys it: stripped and bounded. None when it names none."""
    given = headers.get(SESSION_HEADER, "").strip()
    return given[:MAX_SESSION_ID_LENGTH] or None


def session_id_for(headers: Any, conversation: Conversation | None) -> str:
    """OpenCode's ``x-session-id``, else a stable fingerprint of how the conversation began."""
    given = given_session_id(headers)
    if given is not None:
        return given
    if conversation is None:
        return "unknown"
    users = conversation.user_message_texts()
    seed = conversation.system_text + "\x00" + (users[0] if users else "")
    return "fp_" + xxhash.xxh3_64_hexdigest(seed.encode("utf-8", "surrogatepass"))


def classify(conversation: Conversation) -> RequestKind:
    """Classify by structure, not wording, so new OpenCode releases keep being recognised.

    A compaction carries no tools and hands the transcript over as text inside a
    ``<conversation>`` block of its last user message; a title request carries no tools, no
    assistant turns and a system prompt about a title.
    """
    if conversation.has_tools:
        return RequestKind.AGENT
    if any(
        item.role is Role.ASSISTANT or item.kind is Kind.TOOL_RESULT for item in conversation.items
    ):
        return RequestKind.OTHER
    users = conversation.user_message_texts()
    last = users[-1] if users else ""
    if conversation_span(last) is not None:
        return RequestKind.COMPACTION
    if "title" in conversation.system_text.lower():
        return RequestKind.TITLE
    return RequestKind.OTHER


TITLE_WORDS = 10
TITLE_CHARS = 80


def session_title(conversation: Conversation) -> str | None:
    """What the dashboard names a session by: the first words of its first user message.

    (OpenCode's own title is the answer to its title request, which streams back untouched
    and unparsed; the user's opening words are what that title summarises.)
    """
    users = conversation.user_message_texts()
    first_line = next(
        (line for line in (users[0] if users else "").splitlines() if line.strip()), ""
    )
    words = first_line.split()
    if not words:
        return None
    title = " ".join(words[:TITLE_WORDS])
    cut = len(words) > TITLE_WORDS
    if len(title) > TITLE_CHARS:
        title, cut = title[:TITLE_CHARS].rstrip(), True
    return title + ("…" if cut else "")


# What each figure of /stats means, served with it (the dashboard shows the same words).
STATS_EXPLAIN: dict[str, str] = {
    "request_tokens.tokens_before": "Estimated tokens of the chat request bodies as the client "
    "sent them (every kind: agent, title, compaction): what the provider would have read "
    "without deepmem.",
    "request_tokens.tokens_after": "Estimated tokens of the same requests as forwarded: "
    "tokens_before minus what compression removed, plus what memory added.",
    "request_tokens.cached_before": "Of tokens_before, the prefix each request shares with the "
    "previous request of its session (a prompt cache would hold it); cached_after likewise.",
    "relayed": "Chat requests forwarded byte for byte, unread by the addons, by reason: "
    "header (x-deep-memory: off), relay_models or relay_sessions (the settings' globs), "
    "not_json or not_chat (a body deepmem does not read).",
    "request_tokens.cost": "Cache-aware input cost in uncached-token units, as sent "
    "(original) and as forwarded; saved = original - forwarded, so it nets compression "
    "against memory added (Anthropic-like 0.1 cached / 1.25 uncached, OpenAI-like 0.5 / 1.0).",
    "money": "Dollars at the model's list price (proxy/prices.toml, or the prices setting), "
    "for requests whose model has a price: their input as sent (original) and as forwarded, "
    "cache-aware (cache reads at the cache-read price, the rest at the cache-write price where "
    "the provider charges writes, else the input price); saved = original - forwarded; output: "
    "the output tokens the answers reported, at the output price (the same either way). "
    "Requests of models without a price are counted in unpriced, in token units.",
    "compression.tool_output_tokens_before": "Estimated tokens of the tool outputs in agent "
    "requests as the client sent them: only the part of tokens_before that compression works "
    "on, so it is smaller than request_tokens.tokens_before.",
    "compression.tool_output_tokens_after": "The same tool outputs as forwarded (markers, "
    "compressed views and pointers included).",
    "compression.tokens_removed": "tool_output_tokens_before - tool_output_tokens_after: "
    "what compression took out, never counting what memory added.",
    "memory.tokens_injected": "Estimated tokens that memory blocks (project memory, recall, "
    "reminders, resume) added to the forwarded requests, counted in every request that "
    "carries them.",
}


@dataclass(slots=True)
class Tally:
    """What the proxy counted, for one session or for all of them."""

    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    streams: int = 0
    errors: int = 0
    fail_opens: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    relayed: Counter[str] = field(default_factory=Counter)  # chat requests sent untouched, why
    usage: Usage = field(default_factory=Usage)
    usage_responses: int = 0
    tool_output_tokens_before: int = 0  # estimated, of agent requests, as the client sent them
    tool_output_tokens_after: int = 0  # the same outputs as forwarded
    outputs_compressed: int = 0
    compression_events: int = 0
    memory_turns: int = 0  # new user messages the memory stage saw
    memory_hits: int = 0  # remembered lines added beside them
    memory_nudges: int = 0
    memory_captures: int = 0
    tokens_injected: int = 0  # estimated tokens the memory blocks added to forwarded requests
    checkpoints: int = 0  # compactions whose checkpoint was written
    request_tokens: StreamTokens = field(default_factory=StreamTokens)  # whole bodies, estimated
    money: MoneyTally = field(default_factory=MoneyTally)  # the same, at the model's price

    def add_usage(self, usage: Usage) -> None:
        self.usage_responses += 1
        self.usage.input_tokens += usage.input_tokens
        self.usage.output_tokens += usage.output_tokens
        self.usage.cache_read_tokens += usage.cache_read_tokens
        self.usage.cache_write_tokens += usage.cache_write_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "streams": self.streams,
            "errors": self.errors,
            "fail_opens": self.fail_opens,
            "kinds": dict(self.kinds),
            "relayed": dict(self.relayed),
            "compression": {
                "tool_output_tokens_before": self.tool_output_tokens_before,
                "tool_output_tokens_after": self.tool_output_tokens_after,
                "tokens_removed": self.tool_output_tokens_before - self.tool_output_tokens_after,
                "outputs_compressed": self.outputs_compressed,
                "events": self.compression_events,
            },
            "memory": {
                "turns": self.memory_turns,
                "hits": self.memory_hits,
                "nudges": self.memory_nudges,
                "captures": self.memory_captures,
                "tokens_injected": self.tokens_injected,
                "checkpoints": self.checkpoints,
            },
            "usage_seen": {"responses": self.usage_responses, **self.usage.as_dict()},
            # Chat request bodies in estimated tokens, and their cache-aware cost (proxy.costs).
            "request_tokens": self.request_tokens.as_dict(),
            "money": self.money.as_dict(),
        }


@dataclass(slots=True)
class RequestRecord:
    """One chat request of a session: its size before and after, and how it was answered."""

    at: float
    kind: str
    tokens: StreamTokens
    replica: str = ""  # the replica that served it (``proxy.cluster``)
    status: int = 0  # the upstream's status; 0 while it is being answered
    tokens_removed: int = 0  # by compression, of its tool outputs (estimated)
    tokens_injected: int = 0  # by memory blocks (estimated)
    price: ModelPrice | None = None  # of the model it named (this replica's records only)
    rewrite_id: str | None = None  # its record in the replica's ``proxy.rewrites.RewriteLog``

    def as_dict(self) -> dict[str, Any]:
        shown = {
            "at": self.at,
            "kind": self.kind,
            "replica": self.replica,
            "status": self.status,
            **self.tokens.as_dict(),
            "tokens_removed": self.tokens_removed,
            "tokens_injected": self.tokens_injected,
            "rewrite_id": self.rewrite_id,
        }
        if self.price is not None:
            money = MoneyTally()
            money.add(self.price, self.tokens)
            shown["money"] = {key: money.as_dict()[key] for key in ("original", "saved")}
        return shown

    def row(self) -> list[Any]:
        """The record in few bytes, without its replica (``from_row`` reads it back)."""
        tokens = self.tokens
        return [
            self.at,
            self.kind,
            self.status,
            tokens.tokens_in,
            tokens.cached_in,
            tokens.tokens_out,
            tokens.cached_out,
            self.tokens_removed,
            self.tokens_injected,
            self.rewrite_id,
        ]

    @classmethod
    def from_row(cls, row: Sequence[Any], replica: str) -> RequestRecord:
        """A row of ``row``, or of an older version's (without the rewrite id)."""
        at, kind, status, tokens_in, cached_in, tokens_out, cached_out, removed, injected = row[:9]
        tokens = StreamTokens(tokens_in, cached_in, tokens_out, cached_out)
        rewrite_id = row[9] if len(row) > 9 and isinstance(row[9], str) else None
        return cls(at, kind, tokens, replica, status, removed, injected, rewrite_id=rewrite_id)


@dataclass(slots=True)
class Session:
    session_id: str
    first_seen: float
    last_seen: float
    parent_id: str | None = None
    upstream: str | None = None
    project: str | None = None
    title: str | None = None  # the first words of the session's first user message
    model: str | None = None  # as its latest chat request named it
    priced_as: str | None = None  # the price entry that model matched
    tally: Tally = field(default_factory=Tally)
    last_usage: Usage | None = None
    last_usage_at: float | None = None
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=RECENT_REQUESTS))

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "parent_id": self.parent_id,
            "upstream": self.upstream,
            "project": self.project,
            "title": self.title,
            "model": self.model,
            "priced_as": self.priced_as,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "last_usage": self.last_usage.as_dict() if self.last_usage else None,
            "last_usage_at": self.last_usage_at,
            **self.tally.as_dict(),
        }

    def detail(self) -> dict[str, Any]:
        """``as_dict`` and the recent requests, oldest first."""
        return {**self.as_dict(), "recent_requests": [r.as_dict() for r in self.recent]}


@dataclass(slots=True, eq=False)
class ChatFigures:
    """What a chat request's record is made of: its bodies, priced against the previous
    request of its stream (``PrefixTracker``), and the model's price."""

    kind: str
    original: bytes
    forwarded: bytes
    cache_ttl: float
    model: str | None = None
    price: ModelPrice | None = None
    tokens: StreamTokens | None = None  # once priced


BookHook = Callable[["Book"], None]


@dataclass(slots=True, eq=False)
class Book:
    """One request's statistics, from its arrival until they are counted, after its answer
    has been relayed (``SessionRegistry.enter`` and ``settle``)."""

    at: float = field(default_factory=time.time)  # when the session was seen
    session_id: str | None = None
    upstream: str = ""
    parent_id: str | None = None
    chat: ChatFigures | None = None  # a chat request's figures (None: a relayed call)
    prepare: BookHook | None = None  # the caller's work before counting, off the lock
    meanwhile: BookHook | None = None  # what to count if the answer is long in coming
    commits: list[BookHook] = field(default_factory=list)  # the caller's counting, under it
    session: Session | None = None  # once counted: the registry's session
    record: RequestRecord | None = None  # and the chat request's record
    entered: bool = False
    prepared: bool = False
    ready: bool = False  # commits wait to be counted
    done: bool = False  # the last of them is among them
    counted: bool = False  # the registry's part is


def _price_stream(session_id: str | None, chat: ChatFigures) -> tuple[str, str] | None:
    """The requests a chat request is priced against (``PrefixTracker``): its session's of
    its kind."""
    return (session_id, chat.kind) if session_id else None


def _stream(book: Book) -> tuple[str, str] | None:
    return _price_stream(book.session_id, book.chat) if book.chat is not None else None


class SessionRegistry:
    """Sessions by id, the least recently seen evicted past ``capacity`` sessions or
    ``max_records`` recent requests over all of them, plus the totals.

    What a request adds waits until its answer has been relayed (issue 16): the request path
    enters a ``Book`` (in the order of the session's requests) and settles it when the answer
    is out; one worker thread then prices the books (the prefix comparison, in the order they
    were entered) and counts every settled one, several under one acquisition of the lock.
    Every reader first counts what is settled (``flush``), so it never sees a request half
    counted, nor one whose answer has been relayed left out.
    """

    def __init__(self, capacity: int, max_records: int = MAX_RECORDS, replica: str = "") -> None:
        self.capacity = capacity
        self.replica = replica  # the name each record carries
        self.max_records = max_records
        self.records = 0  # recent requests kept, over all sessions
        self.totals = Tally()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.prefixes = PrefixTracker()  # used under ``_pricing`` only
        self._lock = threading.Lock()  # the sessions and tallies
        self._queue_lock = threading.Lock()  # the books entered and not yet counted
        self._pricing = threading.Lock()  # one counting pass at a time, books in their order
        self._entered: dict[Book, None] = {}  # in the order they were entered
        self._wake = threading.Event()  # books are ready (cheaper to set than a job to submit)
        self._worker: threading.Thread | None = None  # started with the first ready book
        self._looking = False  # the worker looks for books by itself: no need to wake it
        self._stopped = False
        self.wakes = 0  # how often a ready book woke the worker

    def touch(self, session_id: str, upstream: str, parent_id: str | None = None) -> Session:
        with self._lock:
            return self._touch(session_id, upstream, parent_id, time.time())

    def _touch(self, session_id: str, upstream: str, parent_id: str | None, now: float) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(session_id, now, now, parent_id=parent_id, upstream=upstream)
            self._sessions[session_id] = session
            self._evict()
        else:
            session.last_seen = max(session.last_seen, now)
            self._sessions.move_to_end(session_id)
        return session

    def record_request(
        self,
        session: Session | None,
        kind: str,
        original: bytes,
        forwarded: bytes,
        cache_ttl: float,
        model: str | None = None,
        price: ModelPrice | None = None,
    ) -> RequestRecord:
        """Count one chat request's estimated tokens and cached prefix, before and after,
        and their money at ``price`` (the price of ``model``, the model it named), now."""
        now = time.time()
        chat = ChatFigures(kind, original, forwarded, cache_ttl, model, price)
        with self._pricing:
            self._price(session.session_id if session is not None else None, chat, now)
        with self._lock:
            return self._count_chat(session, chat, now)

    def enter(
        self, book: Book, prepare: BookHook | None = None, commit: BookHook | None = None
    ) -> None:
        """Queue a request's book, in its session's order (the prefix comparison prices a
        request against the one entered before it). ``prepare(book)`` runs first, off the
        lock (before the answer, maybe); ``commit(book)`` counts the caller's part, under the
        lock, after the registry's, once the book is settled."""
        with self._queue_lock:
            book.prepare = prepare
            if commit is not None:
                book.commits.insert(0, commit)
            book.entered = True
            self._entered[book] = None
            if book.ready:
                self._schedule()

    def settle(self, book: Book, commit: BookHook | None = None, *, last: bool = True) -> None:
        """Count the book soon, in the background, ``commit(book)`` after what it holds:
        ``last``, the request's answer has been relayed; else a part to show meanwhile (a
        long answer), the rest settled later. A book never entered (the request ended before
        its rewrite ran) is forgotten."""
        with self._queue_lock:
            if book.done:
                return
            if commit is not None:
                book.commits.append(commit)
            book.ready, book.done = True, last
            if book.entered:
                self._schedule()

    def show_meanwhile(self, book: Book, commit: BookHook) -> None:
        """Have ``commit(book)`` counted as a part of the book (``settle`` with ``last``
        false) once the request has waited ``PENDING_SHOWN_AFTER`` since it arrived without
        being settled: the worker looks for such books while any wait. Nothing is armed on
        the event loop for it (a timer made and cancelled for every request)."""
        book.meanwhile = commit
        if not self._looking:
            with self._queue_lock:
                self._schedule()

    def _take_long_waits(self) -> None:
        """Settle in part (under ``_queue_lock``) the books waiting long for their answer."""
        due = time.time() - PENDING_SHOWN_AFTER
        for book in self._entered:
            if book.meanwhile is not None and not book.done and book.at <= due:
                book.commits.append(book.meanwhile)
                book.meanwhile, book.ready = None, True

    def _waiting(self) -> bool:
        """Whether an entered book may yet be shown meanwhile (under ``_queue_lock``)."""
        return any(book.meanwhile is not None and not book.done for book in self._entered)

    def flush(self) -> None:
        """Count every settled book now (a reader is asking)."""
        with self._pricing:
            if self._entered:
                self._count_books()

    def _schedule(self) -> None:
        """Wake the worker unless it is looking by itself (under ``_queue_lock``); after
        ``shutdown``, the next reader counts."""
        if self._looking or self._stopped:
            return
        if self._worker is None:
            self._worker = NamedThread(target=self._work, name="deepmem-books", daemon=True)
            self._worker.start()
        if not self._wake.is_set():
            self.wakes += 1
            self._wake.set()

    def _work(self) -> None:
        """Once woken, count what is settled every ``BOOKS_BATCH_SECONDS`` (a reader meanwhile
        counts it itself) and what has waited long for its answer (``show_meanwhile``), until
        ``BOOKS_LINGER_SECONDS`` pass without a book and none waits; then sleep until one
        wakes it."""
        while True:
            self._wake.wait()
            with self._queue_lock:
                self._wake.clear()
                self._looking = True
            counted = time.monotonic()
            while not self._stopped:
                time.sleep(BOOKS_BATCH_SECONDS)
                if self._count():
                    counted = time.monotonic()
                elif time.monotonic() - counted >= BOOKS_LINGER_SECONDS:
                    with self._queue_lock:
                        if not self._waiting():
                            break
            with self._queue_lock:
                self._looking = False
                if self._stopped:
                    return
                # Readied, or waiting, as it stopped looking.
                if self._waiting() or any(book.ready for book in self._entered):
                    self._wake.set()

    @property
    def looking(self) -> bool:
        """Whether the worker looks for settled books by itself now (none wakes it)."""
        return self._looking

    def _count(self) -> bool:
        """``flush``: whether there was anything to count."""
        with self._queue_lock:
            self._take_long_waits()
            ready = any(book.ready for book in self._entered)
        if ready:
            try:
                self.flush()
            except Exception:  # statistics never stop counting
                log.exception("bookkeeping failed")
        return ready

    def _count_books(self) -> None:
        with self._queue_lock:
            self._take_long_waits()
            batch = list(self._entered)
            ready: list[tuple[Book, list[BookHook]]] = []
            for book in batch:
                if book.ready:
                    ready.append((book, book.commits))
                    book.commits, book.ready = [], False
                    if book.done:
                        del self._entered[book]
        # A request still being answered is priced only when a later one of its stream is
        # ready (it is priced against it): no other request's answer waits for its work.
        streams = {_stream(book) for book, _ in ready} - {None}
        ready_books = {book for book, _ in ready}
        for book in batch:
            if not book.prepared and (book in ready_books or _stream(book) in streams):
                book.prepared = True
                self._prepare(book)
        if ready:
            with self._lock:
                for book, commits in ready:
                    self._commit(book, commits)

    def _prepare(self, book: Book) -> None:
        try:
            if book.prepare is not None:
                book.prepare(book)
        except Exception:  # statistics never break a request
            log.exception("bookkeeping failed (session %s)", book.session_id)
        try:
            if book.chat is not None:
                self._price(book.session_id, book.chat, book.at)
        except Exception:
            log.exception("request not priced (session %s)", book.session_id)

    def _price(self, session_id: str | None, chat: ChatFigures, now: float) -> None:
        stream = _price_stream(session_id, chat)
        chat.tokens = self.prefixes.observe(
            stream, chat.original, chat.forwarded, chat.cache_ttl, now
        )

    def _commit(self, book: Book, commits: list[BookHook]) -> None:
        try:
            if not book.counted:
                book.counted = True
                self._count_arrival(book)
        except Exception:
            log.exception("request not counted (session %s)", book.session_id)
        for commit in commits:
            try:
                commit(book)
            except Exception:
                log.exception("bookkeeping failed (session %s)", book.session_id)

    def _count_arrival(self, book: Book) -> None:
        if book.session_id:
            book.session = self._touch(book.session_id, book.upstream, book.parent_id, book.at)
        if book.chat is not None and book.chat.tokens is not None:
            book.record = self._count_chat(book.session, book.chat, book.at)

    def _count_chat(self, session: Session | None, chat: ChatFigures, now: float) -> RequestRecord:
        tokens, price, kind, model = (
            chat.tokens or StreamTokens(),
            chat.price,
            chat.kind,
            chat.model,
        )
        record = RequestRecord(now, kind, tokens, self.replica, price=price)
        self.totals.request_tokens.add(tokens)
        self.totals.money.add(price, tokens)
        if session is not None:
            session.tally.request_tokens.add(tokens)
            session.tally.money.add(price, tokens)
            if model and (kind == RequestKind.AGENT or session.model is None):
                session.model, session.priced_as = model, price.pattern if price else None
            if self._sessions.get(session.session_id) is session:  # not evicted meanwhile
                self.records += len(session.recent) < RECENT_REQUESTS
            recent = session.recent
            recent.append(record)
            if len(recent) > 1 and recent[-2].at > now:  # counted after a later request
                ordered = sorted(recent, key=lambda shown: shown.at)
                recent.clear()
                recent.extend(ordered)
            self._evict()
        return record

    def _evict(self) -> None:
        """Forget the least recently seen sessions past ``capacity`` or ``max_records``."""
        while len(self._sessions) > self.capacity or (
            self.records > self.max_records and len(self._sessions) > 1
        ):
            _, oldest = self._sessions.popitem(last=False)
            self.records -= len(oldest.recent)

    def get(self, session_id: str) -> Session | None:
        self.flush()
        with self._lock:
            return self._sessions.get(session_id)

    def detail(self, session_id: str) -> dict[str, Any] | None:
        """The session with its recent requests (``Session.detail``), or None if unknown."""
        self.flush()
        with self._lock:
            session = self._sessions.get(session_id)
            return None if session is None else session.detail()

    def __len__(self) -> int:
        self.flush()
        return len(self._sessions)

    def snapshot(self, rows: bool = False) -> dict[str, Any]:
        """The totals and every session, the most recently seen first (``rows``: each with
        its recent requests as ``recent_rows``, in ``RequestRecord.row`` form)."""
        self.flush()
        with self._lock:  # the worker counts under it: every figure of one moment
            sessions = sorted(self._sessions.values(), key=lambda s: s.last_seen, reverse=True)
            recent = [list(session.recent) for session in sessions] if rows else []
            listed = [session.as_dict() for session in sessions]
            totals = self.totals.as_dict()
        for shown, records in zip(listed, recent, strict=False):
            shown["recent_rows"] = [record.row() for record in records]
        return {"totals": {"sessions": len(sessions), **totals}, "sessions": listed}

    def shutdown(self) -> None:
        """Count what is settled and stop the worker."""
        self.flush()
        with self._queue_lock:
            self._stopped = True
            self._wake.set()
