"""Keep the proxy's resident memory close to what it really holds (glibc; elsewhere a no-op).

Request bodies are large (hundreds of KB to tens of MB) and short-lived, and the rewrite runs
on worker threads. With glibc's defaults each thread gets its own malloc arena and large
blocks are carved out of those arenas once the dynamic mmap threshold has grown: freed bodies
then stay in the process as fragmented free space (a corpus soak held ~100 MB of it and RSS
kept creeping up). A fixed mmap threshold gives every large block its own mapping, returned
to the system when freed, and two arenas are enough for a handful of threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("deepmem.malloc")

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 * 1024
ARENAS = 2


def tune_malloc() -> bool:
    """Apply the settings above; False where the C library does not take them."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_ARENA_MAX, ARENAS)
    )
    if not applied:
        log.debug("mallopt refused the settings; malloc keeps its defaults")
    return applied
