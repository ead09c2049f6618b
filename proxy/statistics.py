"""The figures of ``/stats``, and a replica's publishing of its own for the others.

One process answers with its own figures. With a shared state backend (``state_url``), each
replica publishes a snapshot every ``cluster.PUBLISH_SECONDS`` (a background task, never the
request path) and ``/stats`` merges every live replica's (``proxy.cluster``); ``?scope=local``
gives this process's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from memory.interfaces import StatisticsBoard
from memory.state import StateUnavailable
from proxy import __version__, cluster
from proxy.admin import error_response, json_response
from proxy.sessions import STATS_EXPLAIN

if TYPE_CHECKING:
    from proxy.app import ProxyState

log = logging.getLogger("deepmem.proxy")


def health_fields(state: ProxyState) -> dict[str, Any]:
    """How publishing this replica's statistics goes, with a shared state backend (a failure
    is shown here, not as a problem: statistics never make the proxy degraded)."""
    if state.stores.board is None:
        return {}
    return {
        "statistics": {"published_at": state.published_at, "publish_error": state.publish_error}
    }


SCOPES = ("cluster", "local")


async def respond(request: web.Request, state: ProxyState) -> web.Response:
    """Totals and every session; ``?session=ID``: that session with its recent requests.
    With a shared state backend, every live replica's figures merged (``proxy.cluster``);
    ``?scope=local``: this process's own."""
    scope = request.query.get("scope", "cluster")
    if scope not in SCOPES:
        return error_response(
            400, f"scope must be one of {', '.join(SCOPES)}", "invalid_request", "bad_scope"
        )
    session_id = request.query.get("session")
    view, merged = await _figures(state, scope, session_id)
    if session_id is not None:
        if merged is None:
            return error_response(
                404,
                f"no session {session_id!r} in the statistics (unknown, or evicted: the proxy "
                f"keeps the {state.sessions.capacity} most recently seen)",
                "not_found",
                "unknown_session",
            )
        return json_response(
            {"version": __version__, "explain": STATS_EXPLAIN, **view, "session": merged}
        )
    assert merged is not None  # the totals are always there
    return json_response(
        {
            "version": __version__,
            "started_at": state.started_at,
            "explain": STATS_EXPLAIN,
            **view,
            "replicas": merged["replicas"],
            "totals": merged["totals"],
            "sessions": merged["sessions"],
        }
    )


async def _figures(
    state: ProxyState, scope: str, session_id: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What /stats shows: which figures (``view``) and the figures, every live replica's
    merged when the state is shared (read, decoded and merged on a worker thread), else this
    process's. With ``session_id``, that session (None if no replica knows it)."""
    # The registry counts the requests answered and not yet counted first: not on the loop.
    own = await asyncio.to_thread(_own_figures, state, session_id, _metric_totals(state))
    view: dict[str, Any] = {"replica": state.replica, "scope": "local"}
    board = state.stores.board
    if scope == "cluster" and board is not None:
        try:
            merged, warning = await asyncio.to_thread(
                _cluster_figures, board, state, own, session_id
            )
        except StateUnavailable as exc:
            view["cluster_error"] = f"the cluster view is unavailable, local figures only: {exc}"
        else:
            view["scope"] = "cluster"
            if warning:
                view["cluster_warning"] = warning
            return view, merged
    if session_id is not None:
        return view, cluster.session_detail([own], session_id)
    return view, {**own, "replicas": [cluster.replica_entry(own)]}


def _own_figures(
    state: ProxyState, session_id: str | None, metric_totals: dict[str, int]
) -> dict[str, Any]:
    """This process's figures as ``/stats`` merges them: for one session, only that session
    (with its recent requests). On a worker thread."""
    if session_id is None:
        return _snapshot(state, state.sessions.snapshot(), metric_totals)
    detail = state.sessions.detail(session_id)
    return {"replica": state.replica, "sessions": [detail] if detail is not None else []}


def _metric_totals(state: ProxyState) -> dict[str, int]:
    """The totals the metrics keep (read on the event loop, where they change)."""
    metrics = state.metrics
    return {
        "active_streams": int(sum(metrics.gauges.get("deepmem_active_streams", {}).values())),
        "upstream_errors": int(metrics.counter_total("deepmem_upstream_errors_total")),
        "non_json_bodies": int(metrics.counter_total("deepmem_non_json_bodies_total")),
        "expands": int(metrics.counter_total("deepmem_expands_total")),
    }


def _snapshot(
    state: ProxyState, registry: dict[str, Any], metric_totals: dict[str, int]
) -> dict[str, Any]:
    """This process's statistics as replicas publish them: the registry's snapshot and the
    metrics' totals, named."""
    registry["totals"].update(metric_totals)
    return {
        "replica": state.replica,
        "instance": state.instance,
        "version": __version__,
        "started_at": state.started_at,
        "published_at": time.time(),
        **registry,
    }


def _cluster_figures(
    board: StatisticsBoard, state: ProxyState, own: dict[str, Any], session_id: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Every live replica's figures merged with this one's (``own``, taken fresh), and a
    warning when another process publishes under this one's name. On a worker thread."""
    snapshots, warning = [own], None
    for name, raw in sorted(board.snapshots().items()):
        if raw == state.published:
            continue  # this one's last, taken fresh as ``own``
        try:
            snapshot = cluster.decode(raw)
        except ValueError as exc:
            log.warning("statistics of replica %s left out: %s", name, exc)
            continue
        if name != state.replica:
            snapshots.append(snapshot)
        elif snapshot.get("instance") != state.instance:
            warning = (
                f"another process publishes its statistics as {name!r} too, and only one of "
                "them is counted: give each replica its own replica_name"
            )
    if session_id is not None:
        return cluster.session_detail(snapshots, session_id), warning
    return cluster.cluster_view(snapshots), warning


async def publish_forever(state: ProxyState) -> None:
    """Every ``cluster.PUBLISH_SECONDS``, this replica's statistics for the others' ``/stats``
    (started with a shared state backend only)."""
    while True:
        await publish_once(state)
        await asyncio.sleep(cluster.PUBLISH_SECONDS)


async def publish_once(state: ProxyState) -> None:
    """This replica's statistics, with its sessions' recent requests, published; a failure
    is shown by /health (and logged once), nothing else."""
    board = state.stores.board
    if board is None:
        return
    try:
        state.published_at = await asyncio.to_thread(
            _publish_snapshot, board, state, _metric_totals(state)
        )
        state.publish_error = None
    except Exception as exc:  # statistics never break anything
        if state.publish_error is None:
            log.warning("statistics not published: %s", exc)
        state.publish_error = str(exc) or type(exc).__name__


def _publish_snapshot(
    board: StatisticsBoard, state: ProxyState, metric_totals: dict[str, int]
) -> float:
    """On a worker thread: the snapshot is taken under the registry's lock (the tallies'
    figures are read as they are, each one whole) and sent; when it was taken."""
    snapshot = _snapshot(state, state.sessions.snapshot(rows=True), metric_totals)
    encoded = cluster.encode(snapshot)
    board.publish(state.replica, encoded, cluster.TTL_SECONDS)
    state.published = encoded
    return float(snapshot["published_at"])
