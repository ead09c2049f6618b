"""Model list prices, and the money a request's tokens cost at them.

``proxy.costs`` counts each request's estimated tokens and how many of them a prompt cache
would hold; a price turns those into US dollars: uncached input at the cache-write price for
providers that charge writes (Anthropic), else at the input price; cached input at the
cache-read price; output tokens, when the answer reported them, at the output price.

The built-in table is ``prices.toml`` beside this module; the ``prices`` setting adds or
replaces entries (``[prices."my-model"] input = 3.0 ...``), which are looked up first. A
model no entry matches has no price: figures then stay in the token units of
``proxy.costs``.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from proxy.costs import StreamTokens
from proxy.options import Option

PER = 1_000_000  # prices are per million tokens
FIELDS = ("input", "output", "cache_read", "cache_write")
_BEDROCK = re.compile(r"^(?:[a-z]{2,4}\.)?(?:anthropic|meta|amazon|mistral|cohere|ai21|deepseek)\.")
_SUFFIXES = (
    re.compile(r"-v\d+(?::\d+)?$"),  # Bedrock's version
    re.compile(r"-(?:20\d{2}-?\d{2}-?\d{2})$"),  # -20250514, -2024-08-06
    re.compile(r"-(?:0[1-9]|1[0-2])\d{2}$"),  # -0613 (mmdd)
    re.compile(r"-latest$"),
)


def model_key(model: str) -> str:
    """The form model ids and table keys are compared in (see ``prices.toml``)."""
    key = model.strip().lower().rsplit("/", 1)[-1]
    key = _BEDROCK.sub("", key).split("@", 1)[0]
    key = key.replace(".", "-").replace("_", "-")
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            trimmed = suffix.sub("", key)
            if trimmed != key and trimmed:
                key, changed = trimmed, True
    return key.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens; ``pattern`` is the table key that matched."""

    pattern: str
    input: float
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None

    def input_cost(self, tokens: int, cached: int) -> float:
        """Dollars for ``tokens`` input tokens of which ``cached`` were read from the cache
        (the rest written to it where the provider charges writes)."""
        read = self.input if self.cache_read is None else self.cache_read
        uncached = self.input if self.cache_write is None else self.cache_write
        return (read * cached + uncached * (tokens - cached)) / PER

    def output_cost(self, tokens: int) -> float:
        return (self.output or 0.0) * tokens / PER

    def as_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            **{name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None},
        }


def _entry(pattern: str, raw: object, source: str) -> ModelPrice:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{source}: prices.{pattern!r} must be a table of input, output, ...")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ValueError(
            f"{source}: prices.{pattern!r}: unknown key(s) {', '.join(unknown)}; "
            f"known: {', '.join(FIELDS)}"
        )
    if "input" not in raw:
        raise ValueError(f"{source}: prices.{pattern!r} needs an input price")
    values: dict[str, float] = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(
                f"{source}: prices.{pattern!r}.{name} must be a number of dollars per million "
                f"tokens, 0 or more, got {value!r}"
            )
        values[name] = float(value)
    return ModelPrice(pattern, **values)


def _entries(table: object, source: str) -> tuple[ModelPrice, ...]:
    if not isinstance(table, Mapping):
        raise ValueError(f"{source}: expected a table of model patterns, got {table!r}")
    return tuple(_entry(model_key(str(key)), value, source) for key, value in table.items())


MAX_REMEMBERED_MODELS = 512


@dataclass(frozen=True, slots=True)
class Prices:
    """The configured entries (looked up first), then the built-in ones."""

    configured: tuple[ModelPrice, ...] = ()
    builtin: tuple[ModelPrice, ...] = field(default_factory=lambda: BUILTIN)
    # What each model id matched (a cache keyed on the table as well would hash all of it
    # on every request).
    _found: dict[str, ModelPrice | None] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def lookup(self, model: str | None) -> ModelPrice | None:
        """The price of ``model``, or None when no entry matches (or no model is named)."""
        if not model:
            return None
        try:
            return self._found[model]
        except KeyError:
            pass
        if len(self._found) >= MAX_REMEMBERED_MODELS:
            self._found.clear()
        found = self._found[model] = _lookup(self.configured, self.builtin, model_key(model))
        return found

    def table(self) -> list[dict[str, Any]]:
        """Every entry, the configured ones first, as ``/stats`` and docs show them."""
        return [price.as_dict() for price in (*self.configured, *self.builtin)]


def _lookup(
    configured: tuple[ModelPrice, ...], builtin: tuple[ModelPrice, ...], key: str
) -> ModelPrice | None:
    for entries in (configured, builtin):
        exact = [price for price in entries if price.pattern == key]
        if exact:
            return exact[-1]  # a later configured entry wins over an earlier one
        globs = [
            price
            for price in entries
            if any(char in price.pattern for char in "*?[")
            and fnmatch.fnmatchcase(key, price.pattern)
        ]
        if globs:
            return max(globs, key=lambda price: len(price.pattern.replace("*", "")))
    return None


def _load_builtin() -> tuple[ModelPrice, ...]:
    text = resources.files("proxy").joinpath("prices.toml").read_text("utf-8")
    return _entries(tomllib.loads(text).get("prices", {}), "prices.toml")


BUILTIN: tuple[ModelPrice, ...] = _load_builtin()
DEFAULT = Prices()


def parse_prices(raw: object) -> Prices:
    """The ``prices`` setting: a TOML table from the config file, or the same table written
    inline (``"my-model" = {input = 3, output = 15}``) in a flag or the environment."""
    if isinstance(raw, Prices):
        return raw
    if isinstance(raw, str):
        try:
            raw = tomllib.loads(raw)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(
                f"expected TOML like '\"my-model\" = {{input = 3.0, output = 15.0}}': {exc}"
            ) from exc
    return Prices(_entries(raw, "prices"))


OPTIONS: tuple[Option, ...] = (
    Option(
        "prices",
        parse_prices,
        DEFAULT,
        "Model prices in USD per million tokens (input, output, cache_read, cache_write), "
        'by model id pattern: in the config file [prices."my-model"] input = 3.0 ..., inline '
        "TOML in the flag and environment. They add to or replace the built-in list prices "
        "(proxy/prices.toml: Claude, GPT, o-series, Gemini, DeepSeek, Grok, Kimi, GLM). "
        "/stats, the dashboard and replay show money saved for a priced model, token units "
        "for any other.",
        "TOML",
    ),
)


# --- money in the statistics -------------------------------------------------------------------


@dataclass(slots=True)
class MoneyTally:
    """Dollars of the requests whose model has a price, and the token figures (in units,
    ``proxy.costs``) of those whose model has none."""

    requests: int = 0  # priced
    original: float = 0.0  # their input as the client sent it
    forwarded: float = 0.0  # and as forwarded
    output: float = 0.0  # output tokens the answers reported, at the output price
    unpriced_requests: int = 0
    unpriced: StreamTokens = field(default_factory=StreamTokens)

    def add(self, price: ModelPrice | None, tokens: StreamTokens) -> None:
        if price is None:
            self.unpriced_requests += 1
            self.unpriced.add(tokens)
            return
        self.requests += 1
        self.original += price.input_cost(tokens.tokens_in, tokens.cached_in)
        self.forwarded += price.input_cost(tokens.tokens_out, tokens.cached_out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "currency": "USD",
            "requests": self.requests,
            "original": round(self.original, 6),
            "forwarded": round(self.forwarded, 6),
            "saved": round(self.original - self.forwarded, 6),
            "output": round(self.output, 6),
            "unpriced_requests": self.unpriced_requests,
            "unpriced": self.unpriced.as_dict(),
        }
