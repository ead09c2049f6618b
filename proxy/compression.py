"""The compression stage of the request path: memo in, compress, originals and memo out."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from compressors.pipeline import CompressionResult, CompressionSettings, compress
from compressors.registry import DEFAULT_PROTECTED_TOOLS
from compressors.view import Conversation
from memory.ccr import OriginalStore
from memory.memo import MemoStore
from proxy.config import Settings
from proxy.health import Health
from proxy.pipeline import RequestContext
from proxy.sessions import RequestKind

REPORT = "compression"
SKIPPED_KINDS = frozenset({RequestKind.TITLE, RequestKind.COMPACTION})


def compression_settings(settings: Settings) -> CompressionSettings:
    return CompressionSettings(
        tail_tokens=settings.tail_tokens,
        min_output_tokens=settings.min_output_tokens,
        pressure_thresholds=tuple(sorted(settings.pressure_thresholds)),
        protected_tools=DEFAULT_PROTECTED_TOOLS
        | frozenset(name.lower() for name in settings.protected_tools),
        compress_live_turn=settings.compress_live_turn,
    )


@dataclass
class CompressionStage:
    """A transform: compresses agent requests, keeps originals in CCR, persists decisions."""

    settings: CompressionSettings
    memos: MemoStore
    originals: OriginalStore
    cache_ttl: float = 300.0
    health: Health | None = None

    def __call__(self, conversation: Conversation, context: RequestContext) -> bool:
        if context.kind in SKIPPED_KINDS:
            return False
        memo = self.memos.load(context.session_id)
        cold = context.idle_seconds is not None and context.idle_seconds > self.cache_ttl
        result: CompressionResult = compress(conversation, memo, self.settings, cache_cold=cold)
        try:
            if result.originals:
                self.originals.put_many(result.originals)
            if result.decisions or result.event:
                self.memos.save(context.session_id, memo, result.decisions)
        except (sqlite3.Error, OSError) as exc:
            # Nothing may point at an original that was not kept: forget this request's
            # decisions (the memo reloads from disk) and let the hook forward the original.
            self.memos.forget_live(context.session_id)
            if self.health is not None:
                self.health.report("state_db_writes", f"cannot write the state database: {exc}")
            raise
        if self.health is not None:
            self.health.clear("state_db_writes")
        context.reports[REPORT] = result
        return result.changed
