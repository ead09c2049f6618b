"""Statistics of several replicas that share a state backend (``state_url``): each names
itself, publishes a snapshot of its own figures every few seconds (a background task, never
the request path), and ``/stats`` merges every live replica's snapshot into one view.

A snapshot is this process's ``/stats`` figures with each session's recent requests (as
``RequestRecord.row``s: ``recent_rows``), as JSON, compressed. Merging sums the figures
(numbers summed, nested figures merged the same way), counts a session once however many
replicas served it, and puts a session's recent requests of every replica in one list,
oldest first, each naming its replica.
"""

from __future__ import annotations

import socket
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from proxy.options import Option, parse_optional_str
from proxy.sessions import RECENT_REQUESTS, RequestRecord, Tally

if TYPE_CHECKING:
    from proxy.config import Settings

OPTIONS: tuple[Option, ...] = (
    Option(
        "replica_name",
        parse_optional_str,
        None,
        "This replica's name in /health, /stats and the dashboard, and on each request it "
        "served. Replicas sharing a state_url publish their statistics under their names, so "
        "each needs its own. Unset: HOSTNAME:PORT.",
        "NAME",
    ),
)

PUBLISH_SECONDS = 5.0  # how often each replica publishes its snapshot
TTL_SECONDS = 20  # a replica that stopped publishing leaves the cluster view after this
TALLY_KEYS = frozenset(Tally().as_dict())  # the figures of a session that add up
RECENT = "recent_requests"
ROWS = "recent_rows"  # a published session's recent requests, compact


def replica_name(settings: Settings) -> str:
    return settings.replica_name or f"{socket.gethostname()}:{settings.port}"


def encode(snapshot: Mapping[str, Any]) -> bytes:
    return zlib.compress(orjson.dumps(snapshot), 1)


def decode(raw: bytes) -> dict[str, Any]:
    """A published snapshot; ``ValueError`` when it is not one."""
    try:
        snapshot = orjson.loads(zlib.decompress(raw))
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise ValueError(f"not a statistics snapshot: {exc}") from exc
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("totals"), dict):
        raise ValueError("not a statistics snapshot: no totals")
    return snapshot


_NUMBERS = (int, float)  # exactly: a bool is no figure


def summed(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Numbers summed key by key, nested dicts merged the same way; any other value is the
    first part's. (Exact types, not ABCs: this runs over every figure of every session.)"""
    out: dict[str, Any] = {}
    for part in parts:
        _add(out, part)
    return out


def _add(into: dict[str, Any], part: Mapping[str, Any]) -> None:
    for key, value in part.items():
        if key not in into:
            into[key] = summed([value]) if type(value) is dict else value
            continue
        mine = into[key]
        if type(value) is dict and type(mine) is dict:
            _add(mine, value)
        elif type(value) in _NUMBERS and type(mine) in _NUMBERS:
            total = mine + value
            into[key] = round(total, 6) if type(total) is float else total


def merge_session(parts: Sequence[Mapping[str, Any]], recent: bool = True) -> dict[str, Any]:
    """One session as several replicas saw it: its figures summed, first seen the earliest,
    last seen the latest, the rest from the replica that saw it last (the last usage from the
    one that read it last), and the recent requests of all of them, oldest first."""
    latest = max(parts, key=lambda part: part["last_seen"])
    by_recency = [latest, *(part for part in parts if part is not latest)]
    merged: dict[str, Any] = {}
    for key in latest:
        if key in (RECENT, ROWS):
            continue
        merged[key] = next(
            (part[key] for part in by_recency if part.get(key) is not None), latest[key]
        )
    merged.update(summed({k: v for k, v in part.items() if k in TALLY_KEYS} for part in parts))
    merged["first_seen"] = min(part["first_seen"] for part in parts)
    merged["last_seen"] = latest["last_seen"]
    usage = max(parts, key=lambda part: part.get("last_usage_at") or 0.0)
    merged["last_usage"] = usage.get("last_usage")
    merged["last_usage_at"] = usage.get("last_usage_at")
    if recent and any(RECENT in part for part in parts):
        records = [record for part in parts for record in part.get(RECENT, ())]
        records.sort(key=lambda record: record["at"])
        merged[RECENT] = records[-RECENT_REQUESTS:]
    return merged


def merge_sessions(lists: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Sessions of every replica merged by id (without their recent requests), the most
    recently seen first."""
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for sessions in lists:
        for session in sessions:
            by_id.setdefault(session["session_id"], []).append(session)
    merged = [merge_session(parts, recent=False) for parts in by_id.values()]
    merged.sort(key=lambda session: session["last_seen"], reverse=True)
    return merged


def replica_entry(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """What ``/stats`` lists of a replica."""
    totals = snapshot["totals"]
    return {
        "name": snapshot.get("replica"),
        "version": snapshot.get("version"),
        "started_at": snapshot.get("started_at"),
        "published_at": snapshot.get("published_at"),
        "requests": totals.get("requests", 0),
        "sessions": totals.get("sessions", 0),
    }


def cluster_view(snapshots: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The totals and sessions of every replica's snapshot, merged (sessions without their
    recent requests), and the replicas."""
    sessions = merge_sessions(snapshot.get("sessions", ()) for snapshot in snapshots)
    totals = summed(snapshot["totals"] for snapshot in snapshots)
    totals["sessions"] = len(sessions)
    return {
        "totals": totals,
        "sessions": sessions,
        "replicas": sorted(
            (replica_entry(snapshot) for snapshot in snapshots), key=lambda r: str(r["name"])
        ),
    }


def session_detail(
    snapshots: Sequence[Mapping[str, Any]], session_id: str
) -> dict[str, Any] | None:
    """The session as every replica saw it, with the recent requests of all (a published
    snapshot's rows read back, each naming the replica); None if none did."""
    parts = []
    for snapshot in snapshots:
        for session in snapshot.get("sessions", ()):
            if session.get("session_id") != session_id:
                continue
            part = {key: value for key, value in session.items() if key != ROWS}
            if ROWS in session:
                replica = str(snapshot.get("replica"))
                part[RECENT] = [
                    RequestRecord.from_row(row, replica).as_dict() for row in session[ROWS]
                ]
            parts.append(part)
    return merge_session(parts) if parts else None
