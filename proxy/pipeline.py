"""The request-rewrite hook: parse once, identify and classify, run the transforms, fail open.

Transforms are callables (``proxy.compression.build_transforms`` makes the list); each receives
the parsed view and the request context and returns True when it changed the body. When none
did, the exact bytes the client sent are forwarded; when one raises, they are forwarded too and
the failure is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressors import jsontext
from compressors.view import Conversation, Dialect, UnrecognisedBody, parse_conversation
from memory.state import StateUnavailable
from proxy.sessions import RequestKind, classify, session_id_for

log = logging.getLogger("deepmem.pipeline")


@dataclass(slots=True)
class RequestContext:
    dialect: Dialect
    session_id: str
    kind: RequestKind
    idle_seconds: float | None = None  # since the session's previous request, when known
    headers: Any = None  # the client's request headers
    raw: bytes = b""  # the body exactly as the client sent it
    reports: dict[str, Any] = field(default_factory=dict)  # what each transform did


Transform = Callable[[Conversation, RequestContext], bool]
IdleLookup = Callable[[str], float | None]


class Outcome:
    FORWARDED = "forwarded"  # parsed; nothing changed, original bytes go upstream
    REWRITTEN = "rewritten"
    NOT_JSON = "not_json"  # relayed untouched, the provider answers it
    NOT_CHAT = "not_chat"  # JSON, but not a conversation of this dialect (UnrecognisedBody)
    FAILED_OPEN = "failed_open"  # our code raised; original bytes go upstream


@dataclass(slots=True)
class Rewrite:
    body: bytes
    outcome: str
    session_id: str
    kind: RequestKind
    conversation: Conversation | None = None
    error: str | None = None
    context: RequestContext | None = None

    @property
    def changed(self) -> bool:
        return self.outcome == Outcome.REWRITTEN


def rewrite_request(
    raw: bytes,
    dialect: Dialect,
    headers: Any,
    transforms: Sequence[Transform] = (),
    idle_seconds: IdleLookup | None = None,
) -> Rewrite:
    """Never raises: every failure path returns the original bytes."""
    session_id, kind = session_id_for(headers, None), RequestKind.OTHER
    try:
        body, _ = jsontext.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # JSONDecodeError is a ValueError
        return Rewrite(raw, Outcome.NOT_JSON, session_id, kind)
    try:
        try:
            conversation = parse_conversation(dialect, body)
        except UnrecognisedBody as exc:  # the client's or provider's business, not a bug of ours
            log.info(
                "%s body of a shape deepmem does not read, relayed unchanged: %s", dialect, exc
            )
            return Rewrite(raw, Outcome.NOT_CHAT, session_id, kind, error=str(exc))
        session_id = session_id_for(headers, conversation)
        kind = classify(conversation)
        if not transforms:
            return Rewrite(raw, Outcome.FORWARDED, session_id, kind, conversation)
        idle = idle_seconds(session_id) if idle_seconds is not None else None
        context = RequestContext(dialect, session_id, kind, idle, headers, raw)
        changed = False
        for transform in transforms:
            changed = transform(conversation, context) or changed
        outcome, out = (
            (Outcome.REWRITTEN, jsontext.dumps(body)) if changed else (Outcome.FORWARDED, raw)
        )
        return Rewrite(out, outcome, session_id, kind, conversation, context=context)
    except StateUnavailable as exc:  # the stage reported it in /health; no traceback needed
        log.warning("%s; forwarding the original request (session %s)", exc, session_id)
        return Rewrite(raw, Outcome.FAILED_OPEN, session_id, kind, error=str(exc))
    except Exception as exc:
        log.exception("rewrite failed; forwarding the original request (session %s)", session_id)
        return Rewrite(
            raw, Outcome.FAILED_OPEN, session_id, kind, error=f"{type(exc).__name__}: {exc}"
        )
