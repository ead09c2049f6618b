"""Threads named in the operating system, so that a thread's CPU can be told from /proc; the
background thread that writes what no request waits for."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from memory.threads import OS_NAME_BYTES, Background, NamedThread


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


def test_background_runs_its_jobs_in_order_on_one_named_thread() -> None:
    background = Background("deepmem-archive")
    ran: list[tuple[int, str]] = []
    futures = [
        background.submit(lambda n=n: ran.append((n, threading.current_thread().name)))
        for n in range(5)
    ]
    assert background.drain(10)
    assert ran == [(n, "deepmem-archive") for n in range(5)]
    assert all(future.done() for future in futures)
    assert background.close(10)


def test_a_failing_job_is_reported_in_its_future_and_the_next_ones_run() -> None:
    background = Background("deepmem-archive")

    def fails() -> None:
        raise OSError(28, "No space left on device")

    failed = background.submit(fails)
    after = background.submit(lambda: 42)
    assert after.result(10) == 42
    assert isinstance(failed.exception(0), OSError)
    background.close(10)


def test_close_waits_for_the_jobs_given_and_takes_no_more() -> None:
    background = Background("deepmem-archive")
    release, done = threading.Event(), []
    background.submit(lambda: (release.wait(10), done.append(1)))
    background.submit(lambda: done.append(2))
    threading.Timer(0.1, release.set).start()
    assert background.close(10)
    assert done == [1, 2]
    with pytest.raises(RuntimeError):
        background.submit(lambda: None)
    assert background.drain(0)  # closed: nothing left to wait for


def test_close_gives_up_after_its_timeout() -> None:
    background = Background("deepmem-archive")
    release = threading.Event()
    background.submit(lambda: release.wait(10))
    assert background.drain(0.05) is False
    assert background.close(0.05) is False
    release.set()


def test_an_unused_background_starts_no_thread() -> None:
    before = threading.active_count()
    background = Background("deepmem-archive")
    assert background.close(0) and threading.active_count() == before
