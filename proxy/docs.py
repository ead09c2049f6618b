"""The generated parts of README.md: ``python -m proxy.docs`` rewrites them, tests check them.

A generated part sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from proxy.config import options_markdown

README = Path(__file__).resolve().parent.parent / "README.md"
GENERATORS: dict[str, Callable[[], str]] = {"options": options_markdown}


def _section(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.DOTALL)


def render(text: str) -> str:
    """``text`` with every generated part replaced by what its generator gives now."""
    for name, generate in GENERATORS.items():
        pattern = _section(name)
        if not pattern.search(text):
            raise ValueError(f"README has no generated:{name} section")
        text = pattern.sub(_filled_with(generate()), text)
    return text


def _filled_with(generated: str) -> Callable[[re.Match[str]], str]:
    """A replacement that keeps a section's markers and puts ``generated`` between them."""
    return lambda match: match.group(1) + generated + match.group(3)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    updated = render(text)
    if updated != text:
        README.write_text(updated, encoding="utf-8")
        print(f"updated {README}")
    else:
        print(f"{README} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
