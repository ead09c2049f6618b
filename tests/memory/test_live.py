"""The live copies a state store keeps: bounded by size, least recently used out first."""

from __future__ import annotations

from memory.live import LiveCopies


def test_copies_are_bounded_by_size_and_a_grown_copy_is_accounted_again() -> None:
    live: LiveCopies[list[int]] = LiveCopies(10, len)
    live.keep("a", [1, 2, 3])
    live.keep("b", [1, 2, 3])
    assert live.bytes == 6 and live.max_bytes == 10
    grown = live.get("a")
    assert grown is not None
    grown.extend([4, 5, 6])  # changed in place by its store, then kept again
    live.keep("a", grown)
    assert live.bytes == 9  # "b" is now the least recently used
    live.keep("c", [1, 2])  # over the limit: the least recently used one goes
    assert live.get("b") is None and live.bytes == 8
    live.keep("huge", list(range(11)))  # larger than the whole cache: not kept
    assert live.get("huge") is None
    live.drop("a")
    assert live.get("a") is None and live.bytes == 2


def measuring() -> tuple[LiveCopies[list[int]], list[list[int]]]:
    """Copies of at most 10 items, and each copy the cache measured, in order."""
    measured: list[list[int]] = []

    def size(copy: list[int]) -> int:
        measured.append(copy)
        return len(copy)

    return LiveCopies(10, size), measured


def test_a_copy_is_measured_once_each_time_it_is_kept() -> None:
    """A memo's size walks all its decisions: the cache used to measure it twice per save."""
    live, measured = measuring()
    live.keep("a", [1, 2, 3])
    live.keep("b", [1, 2])
    live.keep("a", [1])
    assert len(measured) == 3 and live.bytes == 3


def test_a_copy_kept_already_grows_by_what_was_added_without_a_measure() -> None:
    live, measured = measuring()
    copy = [1, 2, 3]
    live.grow("a", copy, 99)  # not kept yet: measured
    assert live.bytes == 3 and len(measured) == 1
    copy.extend([4, 5])
    live.grow("a", copy, 2)
    assert live.bytes == 5 and len(measured) == 1
    live.grow("a", [1], 1)  # another object under the name: measured
    assert live.bytes == 1 and len(measured) == 2
    live.grow("a", live.get("a") or [], 20)  # grown past the whole cache: no longer kept
    assert live.get("a") is None and live.bytes == 0


def test_what_a_save_adds_to_a_memo_is_never_less_than_its_measure_grows() -> None:
    from compressors.markers import ccr_key, marker
    from compressors.pipeline import Decision, SessionMemo
    from memory.memo import decisions_size, memo_size

    memo = SessionMemo()
    before = memo_size(memo)
    added = {}
    for n in range(20):
        fp = f"{ccr_key(str(n))}{ccr_key(str(-n))}#{n % 3}"
        text = marker("400 lines omitted", ccr_key(f"original {n}")) + "x" * n
        added[fp] = memo.decisions[fp] = Decision(level=1, text=text)
        memo.original_keys[fp] = ccr_key(f"original {n}")
    memo.content_of_marker("none")  # fills what the markers name
    assert memo.sent_as
    assert memo_size(memo) - before <= decisions_size(added)
