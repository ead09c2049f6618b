"""Captures: user text that asks to be remembered ("remember", "important:", "记住", ...) is
kept in the project's notes.md. It adds nothing to the request.

A capture is written when its message is decided; should that decision fail to be stored,
the next request decides again and the same text is refused as a duplicate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from memory.files import LockTimeout
from memory.signals import capture
from memory.store import MemoryStoreError
from proxy.health import Health
from proxy.injections.base import Moment, Piece
from proxy.options import Option, parse_bool

log = logging.getLogger("deepmem.memory")


OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_captures",
        parse_bool,
        True,
        "Keep user text that asks to be remembered ('remember', 'important:', '记住', ...) in "
        "the project's notes.md.",
        "BOOL",
    ),
)


@dataclass(slots=True)
class Captures:
    health: Health | None = None

    def decide(self, moment: Moment) -> list[Piece]:
        if not moment.newest:
            return []
        note = capture(moment.text)
        if note is None:
            return []
        store = moment.memory.store
        try:
            added = store.capture_note(moment.flow.session_id, note, datetime.now(UTC))
        except (OSError, LockTimeout, MemoryStoreError) as exc:
            # A capture is a convenience; a read-only project must not break the request.
            moment.report.notes.append(f"capture failed: {exc}")
            log.warning("could not write %s: %s", store.notes_path, exc)
            if self.health is not None:
                self.health.report("memory_writes", f"cannot write {store.notes_path}: {exc}")
            return []
        if self.health is not None:
            self.health.clear("memory_writes")
        moment.report.captured = added
        if added:  # the index takes the note in once the answer is out, not at a next search
            moment.flow.defer(moment.memory.refresh_index)
        return []
