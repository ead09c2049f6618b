"""The allocator settings (``proxy.malloc``): a body's memory is reused, not mapped afresh."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.malloc import tune_malloc

# Allocate and free a body-sized block the way a request does (written in full, then freed),
# and count the page faults: a block mapped afresh each time faults in every page of it.
_REUSE = textwrap.dedent(
    """
    import resource, sys
    from proxy.malloc import tune_malloc
    tuned = tune_malloc() if sys.argv[1] == "tuned" else True
    size = int(sys.argv[2])
    body = b"x" * size  # the first one may take new pages
    del body
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        body = b"x" * size
        del body
    print(int(tuned), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str, size: int) -> tuple[bool, int]:
    done = subprocess.run(
        [sys.executable, "-c", _REUSE, mode, str(size)],
        capture_output=True,
        text=True,
        check=True,
    )
    tuned, faults = done.stdout.split()
    return tuned == "1", int(faults)


@pytest.mark.parametrize("size", [300_000, 1_000_000, 4_000_000])
def test_a_freed_body_is_reused_not_mapped_again(size: int) -> None:
    tuned, faults = _faults("tuned", size)
    if not tuned:
        pytest.skip("not glibc: the allocator keeps its defaults")
    pages = size // 4096
    assert faults < pages, f"{faults} page faults for 20 blocks of {pages} pages"


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def test_without_the_settings_the_same_blocks_fault_again() -> None:
    """The measure above can fail: glibc's defaults map a block beyond its largest dynamic
    threshold afresh each time."""
    if not tune_malloc():
        pytest.skip("not glibc")
    if _huge_pages_always():
        pytest.skip("transparent huge pages fault a fresh mapping in 2 MiB at a time")
    _, faults = _faults("default", 40_000_000)  # beyond glibc's largest dynamic threshold
    assert faults >= 20 * (40_000_000 // 4096) // 2
