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


def test_a_copy_is_measured_once_each_time_it_is_kept() -> None:
    """A memo's size walks all its decisions: the cache used to measure it twice per save."""
    measured: list[list[int]] = []

    def size(copy: list[int]) -> int:
        measured.append(copy)
        return len(copy)

    live: LiveCopies[list[int]] = LiveCopies(10, size)
    live.keep("a", [1, 2, 3])
    live.keep("b", [1, 2])
    live.keep("a", [1])
    assert len(measured) == 3 and live.bytes == 3
