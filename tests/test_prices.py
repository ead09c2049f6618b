"""Model list prices (proxy/prices.py): matching model ids to entries, the dollar arithmetic,
the ``prices`` setting, and /stats showing money for a priced model and token units for an
unknown one."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import ConfigError, load_settings
from proxy.costs import ANTHROPIC, OPENAI, StreamTokens
from proxy.prices import DEFAULT, ModelPrice, MoneyTally, Prices, model_key, parse_prices
from tests.test_proxy_compression import TOOLS, session_messages


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("anthropic/claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku"),
        ("claude-sonnet-4@20250514", "claude-sonnet-4"),
        ("openrouter/openai/gpt-4.1-mini", "gpt-4-1-mini"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-5-chat-latest", "gpt-5-chat"),
        ("GLM-4.6", "glm-4-6"),
    ],
)
def test_model_key_strips_provider_prefixes_and_date_suffixes(model: str, key: str) -> None:
    assert model_key(model) == key


@pytest.mark.parametrize(
    ("model", "pattern", "input_price"),
    [
        ("anthropic/claude-sonnet-4-5-20250929", "claude-sonnet-4*", 3.0),
        ("claude-sonnet-4-20250514", "claude-sonnet-4*", 3.0),
        ("claude-opus-4-5-20251101", "claude-opus-4-5*", 5.0),  # not the 4 / 4.1 price
        ("claude-opus-4-1-20250805", "claude-opus-4-1", 15.0),
        ("claude-haiku-4-5", "claude-haiku-4*", 1.0),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet*", 3.0),
        ("openai/gpt-4o", "gpt-4o", 2.5),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", 0.15),  # its own entry, not gpt-4o's
        ("gpt-4.1", "gpt-4-1", 2.0),
        ("gpt-5", "gpt-5", 1.25),
        ("gpt-5-mini", "gpt-5-mini", 0.25),
        ("o4-mini", "o4-mini", 1.10),
        ("deepseek/deepseek-chat", "deepseek-chat", 0.28),
    ],
)
def test_builtin_prices_match_common_model_ids(model: str, pattern: str, input_price: float):
    price = DEFAULT.lookup(model)
    assert price is not None and price.pattern == pattern and price.input == input_price


EXACT = sorted(p.pattern for p in DEFAULT.builtin if "*" not in p.pattern)


@given(
    key=st.sampled_from(EXACT),
    prefix=st.sampled_from(["", "anthropic/", "openai/", "openrouter/openai/", "Azure/"]),
    day=st.dates(min_value=date(2020, 1, 1), max_value=date(2099, 12, 31)),
    dashed=st.booleans(),
    upper=st.booleans(),
)
def test_an_exact_entry_matches_whatever_prefix_and_date_suffix(
    key: str, prefix: str, day: date, dashed: bool, upper: bool
) -> None:
    suffix = day.strftime("-%Y-%m-%d" if dashed else "-%Y%m%d")
    model = prefix + (key.upper() if upper else key) + suffix
    price = DEFAULT.lookup(model)
    assert price is not None and price.pattern == key
    assert model_key(model_key(model)) == model_key(model) == key


@pytest.mark.parametrize("model", ["fake-model", "gpt-5-turbo-x", "claude-opus-4-9", "", None])
def test_unknown_models_have_no_price(model: str | None) -> None:
    # An exact key matches one model: gpt-5 does not price a gpt-5 variant it does not name.
    assert DEFAULT.lookup(model) is None


def test_anthropic_prices_cache_writes_openai_discounts_reads() -> None:
    sonnet = DEFAULT.lookup("claude-sonnet-4-5")
    gpt = DEFAULT.lookup("gpt-4o")
    assert sonnet is not None and gpt is not None
    # 1M tokens of which 800k read from the cache: 0.8 * 0.30 + 0.2 * 3.75 (written)
    assert sonnet.input_cost(1_000_000, 800_000) == pytest.approx(0.24 + 0.75)
    # OpenAI charges no writes: the uncached 200k cost the input price
    assert gpt.input_cost(1_000_000, 800_000) == pytest.approx(0.8 * 1.25 + 0.2 * 2.5)
    assert sonnet.output_cost(2_000) == pytest.approx(2_000 * 15 / 1e6)
    # The token units are the same shape: Anthropic 0.1 / 1.25, OpenAI 0.5 / 1.0 of input
    assert sonnet.input_cost(1_000_000, 800_000) == pytest.approx(
        ANTHROPIC.cost(1_000_000, 800_000) * 3.0 / 1e6
    )
    assert gpt.input_cost(1_000_000, 800_000) == pytest.approx(
        OPENAI.cost(1_000_000, 800_000) * 2.5 / 1e6
    )
    bare = ModelPrice("bare", input=2.0)  # no cache prices: every token at the input price
    assert bare.input_cost(1_000, 600) == pytest.approx(2_000 / 1e6)
    assert bare.output_cost(1_000) == 0.0


def test_money_tally_prices_known_and_counts_unknown_in_units() -> None:
    price = ModelPrice("m", input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
    money = MoneyTally()
    tokens = StreamTokens(tokens_in=10_000, cached_in=8_000, tokens_out=6_000, cached_out=5_000)
    money.add(price, tokens)
    money.add(price, tokens)
    money.add(None, tokens)
    shown = money.as_dict()
    original = 2 * (8_000 * 0.3 + 2_000 * 3.75) / 1e6
    forwarded = 2 * (5_000 * 0.3 + 1_000 * 3.75) / 1e6
    assert shown["requests"] == 2 and shown["unpriced_requests"] == 1
    assert shown["original"] == pytest.approx(original)
    assert shown["forwarded"] == pytest.approx(forwarded)
    assert shown["saved"] == pytest.approx(original - forwarded)
    assert shown["unpriced"]["cost"] == tokens.costs()


def test_configured_prices_add_and_override_builtin_ones(tmp_path: Path) -> None:
    config = tmp_path / "deepmem.toml"
    config.write_text(
        '[prices."my-model"]\ninput = 1.5\noutput = 6\ncache_read = 0.15\n\n'
        '[prices."claude-sonnet-4-5"]\ninput = 2.0\noutput = 10\ncache_write = 2.5\n'
        'cache_read = 0.2\n\n[prices."acme-*"]\ninput = 0.5\n'
    )
    prices = load_settings({"config": str(config)}, environ={}).prices
    mine = prices.lookup("local/my-model")
    assert mine is not None and (mine.input, mine.output, mine.cache_read) == (1.5, 6.0, 0.15)
    overridden = prices.lookup("anthropic/claude-sonnet-4-5-20250929")
    assert overridden is not None and overridden.input == 2.0  # the configured entry first
    still = prices.lookup("claude-sonnet-4")
    assert still is not None and still.input == 3.0  # the built-in entry for the others
    acme = prices.lookup("acme-coder-7b")
    assert acme is not None and acme.pattern == "acme-*"
    inline = load_settings(
        {}, environ={"DEEP_MEMORY_PRICES": '"my-model" = {input = 4, output = 8}'}
    ).prices.lookup("my-model")
    assert inline is not None and inline.input == 4.0


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('"m" = {output = 1}', "needs an input price"),
        ('"m" = {input = -1}', "0 or more"),
        ('"m" = {input = "cheap"}', "number of dollars"),
        ('"m" = {input = 1, cache_wirte = 2}', "unknown key(s) cache_wirte"),
        ('"m" = 3', "must be a table"),
        ("not toml", "expected TOML"),
    ],
)
def test_bad_prices_are_config_errors(table: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"DEEP_MEMORY_PRICES.*" + re.escape(problem)):
        load_settings({}, environ={"DEEP_MEMORY_PRICES": table})
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_prices(table)


def test_default_setting_is_the_builtin_table() -> None:
    settings = load_settings({}, environ={})
    assert settings.prices == DEFAULT == Prices()
    assert len(settings.prices.table()) == len(DEFAULT.builtin) > 30


# --- /stats on a real socket ---------------------------------------------------------------


async def _post(client, proxy, messages: list[dict], session: str, model: str) -> None:
    body = orjson.dumps({"model": model, "stream": True, "messages": messages, "tools": TOOLS})
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
    ) as response:
        assert response.status == 200
        await response.read()


async def test_stats_show_money_for_a_priced_model_and_units_for_an_unknown_one(
    proxy, upstream, client
):
    messages = session_messages(14)
    for size in range(4, 31, 2):
        await _post(client, proxy, messages[:size], "ses_priced", "claude-sonnet-4-5-20250929")
        await _post(client, proxy, messages[:size], "ses_unknown", "fake-model")
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    sessions = {s["session_id"]: s for s in stats["sessions"]}
    priced, unknown = sessions["ses_priced"], sessions["ses_unknown"]
    price = DEFAULT.lookup("claude-sonnet-4-5")
    assert price is not None
    assert priced["model"] == "claude-sonnet-4-5-20250929"
    assert priced["priced_as"] == "claude-sonnet-4*"
    tokens = priced["request_tokens"]
    money = priced["money"]
    assert money["currency"] == "USD" and money["requests"] == 14
    assert money["unpriced_requests"] == 0
    assert money["original"] == pytest.approx(
        price.input_cost(tokens["tokens_before"], tokens["cached_before"]), abs=1e-6
    )
    assert money["forwarded"] == pytest.approx(
        price.input_cost(tokens["tokens_after"], tokens["cached_after"]), abs=1e-6
    )
    # Sonnet's prices are 3 dollars per million times the Anthropic-like units
    units = tokens["cost"]["anthropic"]
    assert money["saved"] == pytest.approx(units["saved"] * 3 / 1e6, abs=1e-5)
    assert money["saved"] != 0
    # the fake upstream reports 7 output tokens per answer
    assert money["output"] == pytest.approx(14 * 7 * 15 / 1e6, abs=1e-6)

    assert unknown["model"] == "fake-model" and unknown["priced_as"] is None
    assert unknown["money"]["requests"] == 0 and unknown["money"]["unpriced_requests"] == 14
    assert unknown["money"]["original"] == 0 and unknown["money"]["output"] == 0
    assert unknown["money"]["unpriced"]["cost"] == unknown["request_tokens"]["cost"]

    totals = stats["totals"]["money"]
    assert totals["requests"] == 14 and totals["unpriced_requests"] == 14
    assert totals["saved"] == pytest.approx(money["saved"], abs=1e-6)
    assert "money" in stats["explain"]

    async with client.get(proxy.url + "/stats", params={"session": "ses_priced"}) as response:
        detail = (await response.json())["session"]
    recent = detail["recent_requests"]
    assert all("money" in r for r in recent)
    assert sum(r["money"]["saved"] for r in recent) == pytest.approx(money["saved"], abs=1e-5)
    async with client.get(proxy.url + "/stats", params={"session": "ses_unknown"}) as response:
        assert all("money" not in r for r in (await response.json())["session"]["recent_requests"])


def test_a_lookup_does_not_hash_the_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16: the request's price is looked up on every chat request; remembering the
    answer under a key that holds the whole table hashed every entry each time."""
    prices = parse_prices('"my-model*" = {input = 3, output = 15}')
    expected = prices.lookup("my-model-2")
    hashed: list[ModelPrice] = []
    unhashed = ModelPrice.__hash__

    def counting(price: ModelPrice) -> int:
        hashed.append(price)
        return unhashed(price)

    monkeypatch.setattr(ModelPrice, "__hash__", counting)
    assert prices.lookup("my-model-2") is expected is not None
    assert prices.lookup("My-Model-2") == expected
    assert prices.lookup("gpt-4o") is not None and prices.lookup("no-such-model") is None
    assert hashed == []
