"""The request-rewrite hook: parse once, identify and classify, run the addons, fail open.

The addons (``proxy.addons.build_addons`` makes the list) each get the parsed view and the
request's ``Flow`` and return True when they changed the body. When none did, the exact bytes
the client sent are forwarded; when one raises, they are forwarded too and the failure is
counted. When another process saved the session's state first (``StateConflict``), the
request is parsed again and the addons run once more on that state.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from compressors import jsontext
from compressors.pipeline import CompressionSettings
from compressors.tokens import estimate_tokens
from compressors.view import Conversation, Dialect, Kind, UnrecognisedBody
from compressors.wire import FORMATS, WireFormat, parse_conversation
from memory.interfaces import RequestClock
from memory.state import StateConflict, StateUnavailable
from proxy.bodies import BodyCache, Parsed, write
from proxy.flow import BEGUN_WAIT_SECONDS, Addon, Flow
from proxy.opt_out import OptOut
from proxy.sessions import RequestKind, classify, given_session_id, session_id_for
from proxy.workers import Priority, Workers

log = logging.getLogger("deepmem.pipeline")

T = TypeVar("T")
# A step rewritten on the event loop adds at most this many bytes of messages, to a body of
# at most LIGHT_BODY_BYTES. It reads, walks and compresses only what it adds; what grows with
# the body (comparing and writing its bytes, the session's trail) took in process 0.5 ms at
# p50 and 1.7 ms at most on the corpus's chat bodies of 0.5-1 MB (0.45 and 3.6 ms under
# 100 KB), about 0.4 ms more per MB.
LIGHT_STEP_BYTES = 32 * 1024
LIGHT_BODY_BYTES = 2 * 1024 * 1024
# A new tool output this large may be compressed on arrival (milliseconds): not on the loop.
LIGHT_OUTPUT_TOKENS = CompressionSettings().arrival_tokens
# Requests of a session that the next one does not extend: they do not replace its body.
ONE_OFF_KINDS = frozenset({RequestKind.TITLE, RequestKind.COMPACTION})
REWRITE_WORKERS = 4
# How long a step waits for its session's deferred work a worker has begun (it takes a few ms;
# one stuck on a busy database must not hold the step): then the step goes to a worker.
DEFERRED_WAIT_SECONDS = 0.25
# Sessions whose finished deferred work is remembered before it is looked through.
DEFERRED_PRUNE_SESSIONS = 256
# How long a thread that wants the GIL waits before the running one must hand it over
# (Python's default is 5 ms). With rewrites running Python code on worker threads, the event
# loop needs the GIL back for every chunk it relays; at 5 ms, a few busy workers delayed a
# stream's chunks by hundreds of milliseconds on a loaded machine, and at 1 ms a 3 MB
# compaction still stalled another session's stream by 150-300 ms in most runs of
# tests/test_no_stall.py on two cores (0 of 6 at 0.2 ms).
GIL_SWITCH_SECONDS = 0.0002


def _exact_bytes(data: bytes) -> bytes:
    """orjson's bytes keep the whole capacity of its growing buffer (a 400 KB body held 4 MB);
    a copy holds just the bytes, for as long as the body is forwarded and remembered."""
    return bytes(memoryview(data))


def _forwarded(body: Any, parsed: Parsed, wire: WireFormat) -> bytes:
    """The rewritten body's bytes: the part that repeats the session's last forwarded body
    reused (``bodies.write``) when it is the body ``parsed`` holds (not one parsed again to
    decide again)."""
    data = write(parsed, wire) if body is parsed.body else None
    return data if data is not None else _exact_bytes(jsontext.dumps(body))


class Outcome:
    FORWARDED = "forwarded"  # parsed; nothing changed, original bytes go upstream
    REWRITTEN = "rewritten"
    NOT_JSON = "not_json"  # relayed untouched, the provider answers it
    NOT_CHAT = "not_chat"  # JSON, but not a conversation of this dialect (UnrecognisedBody)
    FAILED_OPEN = "failed_open"  # our code raised; original bytes go upstream
    OPTED_OUT = "opted_out"  # the user asked for it to go untouched (proxy.opt_out)


@dataclass(slots=True)
class Rewrite:
    body: bytes
    outcome: str
    session_id: str
    kind: RequestKind
    conversation: Conversation | None = None
    error: str | None = None
    flow: Flow | None = None  # None when the body was not parsed
    relay_reason: str | None = None  # why it went untouched unread, or by the user's choice

    @property
    def changed(self) -> bool:
        return self.outcome == Outcome.REWRITTEN


@dataclass(slots=True)
class Read:
    """A request ``rewrite_light_step`` parsed and walked but did not rewrite (it was not a
    light step after all): ``rewrite_request`` goes on from here instead of reading it again,
    unless the session's kept body changed meanwhile (another of its requests was rewritten:
    ``BodyCache.basis``)."""

    parsed: Parsed
    conversation: Conversation
    session_id: str
    kind: RequestKind
    basis: object


def rewrite_request(
    raw: bytes,
    dialect: Dialect,
    headers: Any,
    addons: Sequence[Addon] = (),
    clock: RequestClock | None = None,
    opt_out: OptOut | None = None,
    bodies: BodyCache | None = None,
    read: Read | None = None,
) -> Rewrite:
    """Never raises: every failure path returns the original bytes, and so does a request
    ``opt_out`` names (before any addon runs). With ``bodies``, a request of a session that
    names itself is parsed only from where it differs from the session's previous one;
    ``read`` is what ``rewrite_light_step`` made of these very bytes."""
    rewrite = _rewrite(
        raw, dialect, headers, addons, clock, opt_out, bodies, light_only=False, read=read
    )
    assert isinstance(rewrite, Rewrite)
    return rewrite


def rewrite_light_step(
    raw: bytes,
    dialect: Dialect,
    headers: Any,
    addons: Sequence[Addon],
    clock: RequestClock | None,
    opt_out: OptOut | None,
    bodies: BodyCache,
) -> Rewrite | Read | None:
    """``rewrite_request`` for a step that is cheap to rewrite. When it is not, no addon ran:
    what was read of it is returned, for ``rewrite_request`` to go on from (None when the
    request names no session to keep it under). A light step is a session's next one: it
    adds at most ``LIGHT_STEP_BYTES`` of messages to its previous request, holds at most
    ``LIGHT_BODY_BYTES`` of them, and begins no user turn (a new turn's memory recall and
    rewrites are the expensive work) nor brings a tool output large enough to be compressed
    on arrival. Messages it sends again changed only in their cache marks (Anthropic's, which
    OpenCode moves to the last messages at every step) count as repeated, not as new. The
    proxy runs light steps on its event loop."""
    return _rewrite(raw, dialect, headers, addons, clock, opt_out, bodies, light_only=True)


def may_be_light_step(
    bodies: BodyCache, key: tuple[str, str], dialect: Dialect, raw: bytes
) -> bool:
    """Whether ``raw`` may be a light step, judged from its bytes before any parse: it repeats
    its session's previous body, adds few bytes of messages to a small enough list, and those
    bytes hold no user message where the format can tell one by its bytes. ``_light`` decides,
    after the parse; a request this lets through may still go to a worker."""
    if len(raw) > LIGHT_BODY_BYTES + LIGHT_STEP_BYTES:  # not worth finding out
        return False
    growth = bodies.growth(key, raw)
    if growth is None or growth.added > LIGHT_STEP_BYTES or growth.end > LIGHT_BODY_BYTES:
        return False
    user = FORMATS[dialect].user_message_bytes
    return user is None or raw.find(user, growth.start, growth.end) < 0


def _light(parsed: Parsed, conversation: Conversation, kind: RequestKind) -> bool:
    """What ``rewrite_light_step`` says, of a parsed body: the messages after those it repeats
    (and those it sends again but for their cache marks) begin no user turn, hold no output
    to compress on arrival and are few bytes."""
    new = parsed.reused + parsed.alike
    return (
        kind not in ONE_OFF_KINDS
        and parsed.reused > 0
        and parsed.ends[-1] <= LIGHT_BODY_BYTES
        and conversation.last_user_message < new
        and not any(
            item.kind is Kind.TOOL_RESULT
            and item.message >= new
            and isinstance(item.value, str)
            and estimate_tokens(item.value) >= LIGHT_OUTPUT_TOKENS
            for item in conversation.items[conversation.first_item_of(new) :]
        )
        and parsed.ends[-1] - parsed.ends[new - 1] <= LIGHT_STEP_BYTES
    )


def _read(
    raw: bytes,
    dialect: Dialect,
    headers: Any,
    addons: Sequence[Addon],
    opt_out: OptOut | None,
    bodies: BodyCache | None,
    key: tuple[str, str] | None,
) -> Rewrite | Read:
    """``raw`` parsed, walked, its session named and its kind told, for the addons to go on
    from; or the request's end when there is nothing for them to do (not JSON, not a body of
    ``dialect``, opted out by the user, no addons)."""
    session_id, kind = session_id_for(headers, None), RequestKind.OTHER
    basis = bodies.basis(key) if bodies is not None and key is not None else None
    try:
        parsed = (
            Parsed(*jsontext.loads(raw))
            if bodies is None
            else bodies.parse(key, FORMATS[dialect], raw)
        )
    except (ValueError, UnicodeDecodeError, RecursionError):  # JSONDecodeError is a ValueError
        return Rewrite(raw, Outcome.NOT_JSON, session_id, kind, relay_reason=Outcome.NOT_JSON)
    body = parsed.body
    try:
        # What the walk finds is kept only where the body is: the session's next body is
        # walked from where it differs.
        conversation = parse_conversation(dialect, body, parsed.walked, keep=key is not None)
        parsed.walked = conversation.walked
    except UnrecognisedBody as exc:  # the client's or provider's business, not a bug of ours
        log.info("%s body of a shape deepmem does not read, relayed unchanged: %s", dialect, exc)
        return Rewrite(
            raw, Outcome.NOT_CHAT, session_id, kind, error=str(exc), relay_reason=Outcome.NOT_CHAT
        )
    session_id = session_id_for(headers, conversation)
    kind = classify(conversation)
    reason = opt_out.reason(headers, body) if opt_out is not None else None
    if reason is not None:
        if bodies is not None and key is not None and kind not in ONE_OFF_KINDS:
            bodies.remember(key, raw, parsed)  # untouched: the next is parsed after it
        return Rewrite(raw, Outcome.OPTED_OUT, session_id, kind, conversation, relay_reason=reason)
    if not addons:
        return Rewrite(raw, Outcome.FORWARDED, session_id, kind, conversation)
    return Read(parsed, conversation, session_id, kind, basis)


def _rewrite(
    raw: bytes,
    dialect: Dialect,
    headers: Any,
    addons: Sequence[Addon],
    clock: RequestClock | None,
    opt_out: OptOut | None,
    bodies: BodyCache | None,
    *,
    light_only: bool,
    read: Read | None = None,
) -> Rewrite | Read | None:
    session_id, kind = session_id_for(headers, None), RequestKind.OTHER
    given = given_session_id(headers)
    key = (given, dialect.value) if bodies is not None and given is not None else None
    wire = FORMATS[dialect]
    if read is not None and (bodies is None or key is None or bodies.basis(key) is not read.basis):
        read = None  # another request of the session was rewritten since: read it again
    flow: Flow | None = None
    try:
        if read is None:
            found = _read(raw, dialect, headers, addons, opt_out, bodies, key)
            if isinstance(found, Rewrite):
                return found
            read = found
        parsed, conversation = read.parsed, read.conversation
        session_id, kind, body = read.session_id, read.kind, parsed.body
        if light_only and not (parsed.start >= 0 and _light(parsed, conversation, kind)):
            return read if key is not None else None
        if key is not None and parsed.start >= 0:
            conversation.share_messages(parsed.edits)  # objects of the previous and next request
        idle = _idle_seconds(clock, session_id)
        flow = Flow(dialect, session_id, kind, idle, headers, raw, seen=parsed.seen)
        try:
            changed = _run(addons, conversation, flow)
        except StateConflict as exc:
            # Another process (a replica) saved this session's state since it was read here:
            # decide again on what it saved, from the client's bytes, so that both forward
            # the same bytes. A second conflict in a row fails open.
            log.info("%s; deciding again on the other writer's state", exc)
            body, _ = jsontext.loads(raw)
            conversation = parse_conversation(dialect, body)
            flow = Flow(dialect, session_id, kind, idle, headers, raw)
            changed = _run(addons, conversation, flow)
        outcome, out = (
            (Outcome.REWRITTEN, _forwarded(body, parsed, wire))
            if changed
            else (Outcome.FORWARDED, raw)
        )
        if bodies is not None and key is not None and kind not in ONE_OFF_KINDS:
            read_ahead = bodies.remember(key, raw, parsed)
            # First of the deferred work, in the order the next request's parse and walk
            # need it: that request may come soon after.
            if parsed.start >= 0 and parsed.walked is not None:
                flow.after.insert(0, parsed.walked.make_items)
            if read_ahead is not None:
                flow.after.insert(0, read_ahead)
        flow.start_begun()
        return Rewrite(out, outcome, session_id, kind, conversation, flow=flow)
    except StateUnavailable as exc:  # the addon reported it in /health; no traceback needed
        log.warning("%s; forwarding the original request (session %s)", exc, session_id)
        _forget(bodies, key)
        begun = _begun_only(flow)
        return Rewrite(raw, Outcome.FAILED_OPEN, session_id, kind, error=str(exc), flow=begun)
    except Exception as exc:
        log.exception("rewrite failed; forwarding the original request (session %s)", session_id)
        _forget(bodies, key)
        error = f"{type(exc).__name__}: {exc}"
        begun = _begun_only(flow)
        return Rewrite(raw, Outcome.FAILED_OPEN, session_id, kind, error=error, flow=begun)


def _begun_only(flow: Flow | None) -> Flow | None:
    """What the addons began before one of them failed (a compaction's checkpoint) is done all
    the same, and waited for as it would have been (``Flow.begin``); nothing else they did
    counts: the original bytes go upstream."""
    if flow is None:
        return None
    flow.start_begun()
    if not flow.begun:
        return None
    return Flow(
        flow.dialect, flow.session_id, flow.kind, begun=flow.begun, answer_waits=flow.answer_waits
    )


def _forget(bodies: BodyCache | None, key: tuple[str, str] | None) -> None:
    if bodies is not None and key is not None:
        bodies.forget(key)


def _idle_seconds(clock: RequestClock | None, session_id: str) -> float | None:
    """Seconds since the session's previous chat request (recording this one), if known."""
    if clock is None:
        return None
    now = time.time()
    try:
        previous = clock.seen(session_id, now)
    except StateUnavailable:  # unknown; the addons that need the state find out themselves
        return None
    return None if previous is None else now - previous


def _run(addons: Sequence[Addon], conversation: Conversation, flow: Flow) -> bool:
    changed = False
    for addon in addons:
        changed = addon.request(conversation, flow) or changed
    return changed


class RewriteRunner:
    """Runs request rewrites on a few worker threads, so the event loop only relays bytes.

    The addons touch SQLite, memory files (and their locks), search indexes and checkpoint
    extraction; none of that may stall another session's stream. Requests of one session
    are rewritten one at a time, in the order they reached the runner (an addon keeps
    per-session state); different sessions run in parallel. Deferred work (``run_after``)
    waits for a free worker that no request wants (``proxy.workers``).
    """

    def __init__(self, workers: int = REWRITE_WORKERS) -> None:
        self._workers = Workers(workers, "deepmem-rewrite")
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, requests holding/waiting
        # Per session, its deferred work: taken by its next request (``_take_turn``); what
        # has finished meanwhile stays until then, or until ``_prune``.
        self._deferred: dict[str, set[Future[None]]] = {}
        self._prune_at = DEFERRED_PRUNE_SESSIONS
        # Per session, the work its requests began in the background (``Flow.begin``), which
        # its next request waits for: never cancelled, and forgotten once done.
        self._begun: dict[str, list[Future[Any]]] = {}

    async def run(self, session_key: str | None, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, after the session's earlier requests.

        When the caller is cancelled (the client went away) the work still finishes, and the
        session's next request waits for it: a half-run rewrite must not overlap the next.
        """
        work = functools.partial(fn, *args)
        if session_key is None:
            return await asyncio.wrap_future(self._workers.submit(work, Priority.REQUEST))
        lock = await self._take_turn(session_key)
        try:
            future = asyncio.wrap_future(self._workers.submit(work, Priority.REQUEST))
        except BaseException:
            self._release(session_key, lock)
            raise
        future.add_done_callback(lambda _: self._release(session_key, lock))
        return await asyncio.shield(future)

    async def _take_turn(self, key: str) -> asyncio.Lock:
        """Wait for the session's earlier requests; the caller must ``_release`` the lock."""
        self._cancel_deferred(key)
        lock = self._join(key)
        try:
            await lock.acquire()
        except BaseException:
            self._leave(key)
            raise
        return lock

    def _cancel_deferred(self, key: str) -> None:
        """Cancel the session's deferred work that has not started: it was done ahead for the
        request taking its turn, which does it itself now."""
        for deferred in self._deferred.pop(key, ()):
            deferred.cancel()  # a job already running goes on; nobody waits for it

    def _join(self, key: str) -> asyncio.Lock:
        lock, users = self._turns.get(key) or (asyncio.Lock(), 0)
        self._turns[key] = (lock, users + 1)
        return lock

    def _leave(self, key: str) -> None:
        lock, users = self._turns[key]
        if users <= 1:
            del self._turns[key]
        else:
            self._turns[key] = (lock, users - 1)

    def _release(self, key: str, lock: asyncio.Lock) -> None:
        lock.release()
        self._leave(key)

    async def run_here(self, session_key: str | None, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the event loop itself, after the session's earlier requests: for
        rewrites that cost less than handing them to a thread."""
        if session_key is None:
            return fn(*args)
        if session_key not in self._turns:
            # No request of the session holds or awaits its turn, and none can take it while
            # ``fn`` runs: nothing else runs on the loop meanwhile.
            self._cancel_deferred(session_key)
            return fn(*args)
        lock = await self._take_turn(session_key)
        try:
            return fn(*args)
        finally:
            self._release(session_key, lock)

    def run_after(self, session_key: str | None, work: Sequence[Callable[[], None]]) -> None:
        """Start ``work`` (a flow's deferred jobs) in order on a worker thread once no
        request's rewrite waits for one; nobody waits for it, and a failure is logged. The
        jobs only fill caches for the session's next request, so they need not hold its turn:
        if that request comes first, jobs not yet started are cancelled (``_take_turn``)."""
        if not work:
            return

        def jobs() -> None:
            for job in work:
                try:
                    job()
                except Exception:
                    log.exception("deferred work failed (session %s)", session_key)

        try:
            submitted = self._workers.submit(jobs, Priority.DEFERRED)
        except RuntimeError:  # closed: the proxy is stopping, and the work was only ahead
            return
        if session_key is None:
            return
        # Cancelled directly (at once, so a worker can no longer take it). Nothing is called
        # back on the event loop when it is done: that was a wake-up of the loop and two
        # callbacks on it for every request.
        self._deferred.setdefault(session_key, set()).add(submitted)
        if len(self._deferred) > self._prune_at:
            self._prune()

    def _prune(self) -> None:
        """Forget the sessions whose deferred work has all finished (sessions that sent no
        request since); at most as often as the sessions remembered double."""
        self._deferred = {
            key: futures
            for key, futures in self._deferred.items()
            if not all(future.done() for future in futures)
        }
        self._prune_at = max(DEFERRED_PRUNE_SESSIONS, 2 * len(self._deferred))

    def finish_started(self, session_key: str | None) -> Awaitable[object] | None:
        """What to await (the event loop free meanwhile) for the session's deferred work that
        a worker has begun, or that a free worker is about to, or None when there is none: it
        makes what the session's next request needs, which would otherwise make it itself
        beside it. Work that waits for a busy worker is left to be cancelled (``_take_turn``).
        At most ``DEFERRED_WAIT_SECONDS``: work still running then makes the step a worker's
        (``deferring``)."""
        if session_key is None or session_key not in self._deferred:
            return None
        deferred = self._deferred[session_key]
        if all(future.done() for future in deferred):
            del self._deferred[session_key]  # nothing to wait for, nor to cancel
            return None
        workers = self._workers
        started = [
            asyncio.wrap_future(future)
            for future in deferred
            if future.running() or (not future.done() and workers.starts_soon(future))
        ]
        return asyncio.wait(started, timeout=DEFERRED_WAIT_SECONDS) if started else None

    def began(self, session_key: str | None, work: Sequence[Future[Any]]) -> None:
        """The session's request began ``work`` in the background (``Flow.begin``): the
        session's next request waits for it (``finish_begun``)."""
        if session_key is None or not work:
            return
        pending = [future for future in self._begun.get(session_key, ()) if not future.done()]
        self._begun[session_key] = pending + list(work)
        if len(self._begun) > DEFERRED_PRUNE_SESSIONS:
            self._begun = {
                key: futures
                for key, futures in self._begun.items()
                if not all(future.done() for future in futures)
            }

    def finish_begun(self, session_key: str | None) -> Awaitable[object] | None:
        """What to await (the event loop free meanwhile) for the work the session's earlier
        requests began in the background and that is not done, or None: at most
        ``BEGUN_WAIT_SECONDS`` (a checkpoint the session's next request may read)."""
        if session_key is None or session_key not in self._begun:
            return None
        pending = [future for future in self._begun.pop(session_key) if not future.done()]
        if not pending:
            return None
        waited = [asyncio.wrap_future(future) for future in pending]
        return asyncio.wait(waited, timeout=BEGUN_WAIT_SECONDS)

    def deferring(self, session_key: str | None) -> bool:
        """Whether work the session's last request deferred (``run_after``) has not all
        finished: what it makes ahead (compressions, their originals) may not be there yet
        for the session's next request, which may then have to make it itself."""
        if session_key is None:
            return False
        return any(not future.done() for future in self._deferred.get(session_key, ()))

    @property
    def sessions_waiting(self) -> int:
        """Sessions with a rewrite running or queued (the per-session locks alive)."""
        return len(self._turns)

    def close(self) -> None:
        self._workers.close()
