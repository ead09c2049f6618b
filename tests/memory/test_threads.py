"""Threads named in the operating system, so that a thread's CPU can be told from /proc."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from memory.threads import OS_NAME_BYTES, NamedThread


def _os_name() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="no /proc")
@pytest.mark.parametrize(
    ("name", "seen"),
    [("deepmem-books", "deepmem-books"), ("deepmem-rewrite_3", "deepmem-rewrite")],
)
def test_the_kernel_sees_the_thread_s_name_up_to_its_limit(name: str, seen: str) -> None:
    names: list[str] = []
    thread = NamedThread(target=lambda: names.append(_os_name()), name=name)
    thread.start()
    thread.join()
    assert names == [seen]
    assert len(seen.encode()) <= OS_NAME_BYTES
