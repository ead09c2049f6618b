"""Keep the cyclic garbage collector's pauses short (they stop every thread, the event loop too).

The proxy keeps a large, long-lived heap of parsed request bodies and what was derived from
them (``proxy.bodies``), and each request allocates thousands of short-lived containers. With
CPython's default thresholds (a young collection every 700 net allocations) that heap is
promoted and then traversed by a full collection every few hundred requests: 75-130 ms, in
process on the public corpus, on whichever thread allocated at the time (often the event loop,
which stalls every stream). Two changes:

- what start-up built (modules, the tokenizer, the settings) is moved out of the collector's
  sight (``gc.freeze``): it lives as long as the process and holds no garbage;
- a young collection every ``YOUNG_THRESHOLD`` net allocations: the per-request garbage dies
  young either way (reference counting frees everything that is not in a cycle), and far
  fewer objects are promoted towards the full collections.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000  # CPython's default is 700
OLDER_THRESHOLDS = (10, 10)  # collections of the younger generation before an older one


def tune_garbage_collector() -> None:
    """Freeze what exists now and set the thresholds; call once start-up is done."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
