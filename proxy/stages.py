"""What runs on the request path, in order, and the state database it keeps."""

from __future__ import annotations

from dataclasses import dataclass, replace

from memory.ccr import OriginalStore
from memory.db import DB_NAME, open_database
from memory.injection_memo import InjectionMemo
from memory.memo import MemoStore
from proxy.compaction import CompactionStage
from proxy.compression import CompressionStage, compression_settings
from proxy.config import Settings
from proxy.health import Health
from proxy.memory_api import MemoryService
from proxy.memory_stage import build_memory_stage
from proxy.pipeline import Transform


@dataclass
class Stores:
    """What the proxy keeps in its state database."""

    originals: OriginalStore
    memos: MemoStore
    injections: InjectionMemo


def open_stores(settings: Settings, *, in_memory: bool = False) -> Stores:
    db = open_database(None if in_memory else settings.data_dir / DB_NAME)
    originals = OriginalStore(db, retention_days=settings.retention_days)
    originals.purge_expired()
    return Stores(originals, MemoStore(db), InjectionMemo(db))


def build_transforms(
    settings: Settings,
    stores: Stores,
    memory: MemoryService | None = None,
    health: Health | None = None,
) -> list[Transform]:
    """Compaction, compression, then memory (compaction and memory are left out when
    ``memory`` is None, as in replay)."""
    transforms: list[Transform] = []
    if not settings.compress:
        # A pure relay: nothing in a request changes; captures and checkpoints still happen.
        settings = replace(
            settings,
            memory_inject=False,
            memory_nudges=False,
            resume=False,
            compaction_compress=False,
            compaction_prompt="off",
        )
    if memory is not None and (
        settings.checkpoints or settings.compaction_compress or settings.compaction_prompt != "off"
    ):
        transforms.append(
            CompactionStage(
                settings,
                memory.catalog,
                memory.projects,
                stores.originals,
                compression_settings(settings),
                health,
            )
        )
    if settings.compress:
        transforms.append(
            CompressionStage(
                compression_settings(settings),
                stores.memos,
                stores.originals,
                settings.cache_ttl,
                health,
            )
        )
    if memory is not None:
        stage = build_memory_stage(
            settings, memory.catalog, memory.projects, stores.injections, health
        )
        if stage is not None:
            transforms.append(stage)
    return transforms
