"""Requests a user wants relayed untouched: per request (the ``x-deep-memory: off`` header) or
per model and session (``relay_models`` / ``relay_sessions`` globs).

Such a chat request skips every addon: no compression, no memory, no checkpoint; the exact
bytes the client sent go upstream (the header itself is deepmem's and is never forwarded,
``proxy.relay.upstream_request_headers``). The statistics count it as relayed, with its reason.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.options import Option, parse_list
from proxy.sessions import SESSION_HEADER

if TYPE_CHECKING:
    from proxy.config import Settings

OPT_OUT_HEADER = "x-deep-memory"
OPT_OUT_VALUE = "off"

# The reasons /stats counts opted-out requests under.
BY_HEADER = "header"
BY_MODEL = "relay_models"
BY_SESSION = "relay_sessions"

OPTIONS: tuple[Option, ...] = (
    Option(
        "relay_models",
        parse_list,
        [],
        "Models (fnmatch globs, case-insensitive, e.g. 'gpt-4o-mini' or 'claude-*-haiku*') "
        "whose chat requests are relayed untouched: no compression, memory or checkpoint. "
        f"A single request opts out with the header '{OPT_OUT_HEADER}: {OPT_OUT_VALUE}'.",
        "GLOB,...",
    ),
    Option(
        "relay_sessions",
        parse_list,
        [],
        f"Session ids (the {SESSION_HEADER} header; fnmatch globs, e.g. 'ses_abc*') whose chat "
        "requests are relayed untouched, as for relay_models.",
        "GLOB,...",
    ),
)


def _matches(value: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, glob) for glob in globs)


@dataclass(frozen=True, slots=True)
class OptOut:
    """The configured globs; ``reason`` tells whether a request is to be relayed untouched."""

    models: tuple[str, ...] = ()
    sessions: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> OptOut:
        return cls(
            tuple(glob.lower() for glob in settings.relay_models), tuple(settings.relay_sessions)
        )

    def reason(self, headers: Any, body: object) -> str | None:
        """Why this request is relayed untouched (``BY_*``), or None when it is not.
        ``body`` is the parsed JSON body."""
        if headers.get(OPT_OUT_HEADER, "").strip().lower() == OPT_OUT_VALUE:
            return BY_HEADER
        session = headers.get(SESSION_HEADER, "").strip()
        if session and self.sessions and _matches(session, self.sessions):
            return BY_SESSION
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and self.models and _matches(model.lower(), self.models):
            return BY_MODEL
        return None
