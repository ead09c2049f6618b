"""A setting as an addon or the core declares it, and the parsers its values go through.

The module that uses a setting declares its ``Option`` (``OPTIONS`` beside the code);
``proxy/config.py`` gathers every module's options into the one list that the command line,
the ``DEEP_MEMORY_*`` environment, the TOML file and the documentation derive from, and into
the typed ``Settings``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "DEEP_MEMORY_"


def parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def parse_positive_float(raw: object) -> float:
    value = float(raw)  # type: ignore[arg-type]
    if not value > 0:
        raise ValueError(f"must be greater than 0, got {raw!r}")
    return value


def parse_port(raw: object) -> int:
    value = int(raw)  # type: ignore[call-overload]
    if not 0 <= value <= 65535:
        raise ValueError(f"must be 0..65535, got {raw!r}")
    return value


def parse_positive_int(raw: object) -> int:
    value = int(raw)  # type: ignore[call-overload]
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {raw!r}")
    return value


def parse_non_negative_int(raw: object) -> int:
    value = int(raw)  # type: ignore[call-overload]
    if value < 0:
        raise ValueError(f"must be 0 or more, got {raw!r}")
    return value


def parse_int_list(raw: object) -> list[int]:
    return [parse_non_negative_int(item) for item in parse_list(raw)]


def choice(*allowed: str) -> Callable[[object], str]:
    def parse(raw: object) -> str:
        text = str(raw).strip().lower()
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {raw!r}")
        return text

    return parse


def parse_fraction(raw: object) -> float:
    value = float(raw)  # type: ignore[arg-type]
    if not 0 < value <= 1:
        raise ValueError(f"must be greater than 0 and at most 1, got {raw!r}")
    return value


def parse_dir_name(raw: object) -> str:
    text = str(raw).strip()
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\x00" in text:
        raise ValueError(f"must be a plain directory name, got {raw!r}")
    return text


def parse_str(raw: object) -> str:
    return str(raw)


def parse_optional_str(raw: object) -> str | None:
    text = str(raw)
    return text or None


def parse_list(raw: object) -> list[str]:
    """A list from TOML, or a comma/whitespace separated string from flags and environment."""
    if isinstance(raw, list):
        return [str(item).strip() for item in raw if str(item).strip()]
    return [part for part in re.split(r"[\s,]+", str(raw)) if part]


def parse_host_list(raw: object) -> list[str]:
    hosts = [host.lower().rstrip(".") for host in parse_list(raw)]
    for host in hosts:
        if host != "*" and not re.fullmatch(
            r"(?:\[[0-9a-f:.]+\]|[a-z0-9_.\-]+)(?::\d{1,5})?", host
        ):
            raise ValueError(f"expected host names (NAME or NAME:PORT), got {host!r}")
    return hosts


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its name is the TOML key; flag and environment names derive from it."""

    name: str
    parse: Callable[[object], Any]
    default: Any
    help: str
    metavar: str | None = None
    repeatable: bool = False
    is_flag: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()
