"""Threads that carry their name into the operating system.

Python names a thread for itself only: ``top -H``, ``/proc/<pid>/task/*/comm`` and
``benchmarks.concurrency`` see every thread of the proxy as ``python``, so which of them burns
the CPU (the rewrite workers, the embedding thread, or a native thread such as OpenBLAS's) can
only be guessed. ``NamedThread`` gives the kernel its name when it starts (Linux; the kernel
keeps 15 bytes of it, so the proxy's thread names fit in 15 bytes but for a worker's number).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

OS_NAME_BYTES = 15  # the kernel's limit, without the terminating NUL
_PR_SET_NAME = 15  # prctl(2): names the calling thread


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_SET_NAME = _prctl()


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the operating system, where it
    can; elsewhere nothing."""
    if _SET_NAME is None:
        return
    data = name.encode("utf-8", "replace")[:OS_NAME_BYTES]
    _SET_NAME(_PR_SET_NAME, ctypes.c_char_p(data), 0, 0, 0)


class NamedThread(threading.Thread):
    """A ``threading.Thread`` whose name the operating system sees too."""

    def run(self) -> None:
        name_os_thread(self.name)
        super().run()
