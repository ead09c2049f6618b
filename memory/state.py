"""The one error every state store raises when its backend fails.

Originals (CCR), compression decisions and injection memos translate their backend's own
errors (``sqlite3.Error`` for the embedded database) into ``StateUnavailable``, so the proxy
catches one type whatever the backend.
"""

from __future__ import annotations


class StateUnavailable(Exception):
    """The durable state cannot be read or written now: locked by another process, disk
    full, read-only, corrupt or missing. The message says what was being done and why it
    failed."""


class StateConflict(StateUnavailable):
    """Another writer changed a session's state since this process loaded it. The request
    that found out is decided again on the other writer's state (``proxy.pipeline``)."""
