"""The compression stage of the request path: memo in, compress, originals and memo out."""

from __future__ import annotations

from dataclasses import dataclass

from compressors.pipeline import CompressionResult, CompressionSettings, compress
from compressors.registry import DEFAULT_PROTECTED_TOOLS
from compressors.view import Conversation
from memory.ccr import OriginalStore
from memory.memo import MemoStore
from memory.state import StateUnavailable
from proxy.config import Settings
from proxy.health import Health
from proxy.pipeline import RequestContext
from proxy.sessions import RequestKind

REPORT = "compression"
STATE_WRITES = "state_db_writes"  # the /health component for failed originals and memo writes
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
        try:
            memo = self.memos.load(context.session_id)
            cold = context.idle_seconds is not None and context.idle_seconds > self.cache_ttl
            result: CompressionResult = compress(conversation, memo, self.settings, cache_cold=cold)
            # Originals first: a marker may go upstream only once its original is committed.
            if result.originals:
                self.originals.put_many(result.originals)
            if result.decisions or result.event:
                self.memos.save(context.session_id, memo, result.decisions)
        except Exception as exc:
            # The hook forwards the original bytes. The live memo may hold decisions whose
            # originals or rows were not kept: forget it, the next load reads what was saved.
            self.memos.forget_live(context.session_id)
            if isinstance(exc, StateUnavailable) and self.health is not None:
                self.health.report(STATE_WRITES, str(exc))
            raise
        if self.health is not None:
            self.health.clear(STATE_WRITES)
        context.reports[REPORT] = result
        return result.changed
