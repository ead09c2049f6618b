"""What runs on the request path, in order: the one list of addons.

Each addon implements ``proxy.flow.Addon`` (one hook, ``request``) and reports what it did as
a ``proxy.flow.Report``. The order matters and is this list's: the project is identified
before anything reads it; compaction sees the request as the client sent it; compression runs
before memory appends anything, so injected text is never compressed. Relay mode (``compress
= false``, or no durable store) is the list without the addons that rewrite: checkpoints and
captures still happen.
"""

from __future__ import annotations

from dataclasses import replace

from proxy.compaction import CompactionStage
from proxy.compression import CompressionStage, compression_settings
from proxy.config import Settings
from proxy.flow import Addon
from proxy.health import Health
from proxy.memory_api import MemoryService
from proxy.memory_stage import build_memory_stage
from proxy.projects import IdentifyProject
from proxy.stores import Stores


def relay_settings(settings: Settings) -> Settings:
    """The settings with everything that rewrites a request switched off."""
    return replace(
        settings,
        compress=False,
        memory_inject=False,
        memory_nudges=False,
        resume=False,
        compaction_compress=False,
        compaction_prompt="off",
    )


def build_addons(
    settings: Settings,
    stores: Stores,
    memory: MemoryService | None = None,
    health: Health | None = None,
) -> list[Addon]:
    """Project, compaction, compression, then memory (project, compaction and memory are
    left out when ``memory`` is None, as in replay)."""
    if not settings.compress or stores.unavailable is not None:
        settings = relay_settings(settings)
    addons: list[Addon] = []
    if memory is not None:
        addons.append(IdentifyProject(memory.projects))
    if memory is not None and (
        settings.checkpoints or settings.compaction_compress or settings.compaction_prompt != "off"
    ):
        addons.append(
            CompactionStage(
                settings,
                memory.catalog,
                stores.originals,
                compression_settings(settings),
                health,
                stores.histories,
            )
        )
    if settings.compress:
        addons.append(
            CompressionStage(
                compression_settings(settings),
                stores.memos,
                stores.originals,
                settings.cache_ttl,
                health,
                transaction=stores.transaction,
            )
        )
    if memory is not None:
        stage = build_memory_stage(settings, memory.catalog, stores.injections, health)
        if stage is not None:
            addons.append(stage)
    return addons
