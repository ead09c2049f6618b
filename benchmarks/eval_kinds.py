"""Black-box evaluator results by agent kind and by tuning split.

    python -m benchmarks.eval_kinds RESULT.json [RESULT.json ...]

Reads the JSON files ``shared/eval/blackbox_eval.py --out`` writes and prints, per run, a
Markdown table with one row per agent kind (OpenCode ``oc-*``, Claude Code ``cc-*``, Codex
``cx-*``, SWE-style: the rest), then the transcripts used for tuning and the five held out from
tuning: probes visible / recoverable / lost, context reduction summed over requests and at the
last request, cache-aware cost savings (Anthropic-like, OpenAI-like) and prefix breaks per
pair of consecutive measured requests. The figures follow the evaluator's definitions
(``../shared/eval/README.md``); ``compare`` prints them for the whole corpus only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("OpenCode (oc-*)", lambda name: name.startswith("oc-")),
    ("Claude Code (cc-*)", lambda name: name.startswith("cc-")),
    ("Codex (cx-*)", lambda name: name.startswith("cx-")),
    ("SWE-style (the rest)", lambda name: not name.startswith(("oc-", "cc-", "cx-"))),
)
# Never used to tune constants: the check of whether tuning generalises.
HELD_OUT = frozenset(
    {
        "cc-ohmyposh-94fab1a1",
        "cc-entirecli-5e231473",
        "oc-darkfactory-39c0a3da",
        "cx-sessionbridge-019d6cca",
        "swesmith-lineprofiler-100",
    }
)
GROUPS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    *KINDS,
    ("tuning (20)", lambda name: name not in HELD_OUT),
    ("held out from tuning (5)", lambda name: name in HELD_OUT),
    ("all", lambda name: True),
)


@dataclass
class Figures:
    transcripts: int = 0
    requests: int = 0
    visible: int = 0
    recoverable: int = 0
    lost: int = 0
    tokens_original: int = 0
    tokens_received: int = 0
    final_original: int = 0
    final_received: int = 0
    anthropic_original: float = 0.0
    anthropic_received: float = 0.0
    openai_original: float = 0.0
    openai_received: float = 0.0
    breaks: int = 0
    pairs: int = 0

    def add(self, transcript: dict[str, Any]) -> None:
        self.transcripts += 1
        measured = [r for r in transcript["requests"] if "T_R" in r]
        self.requests += len(transcript["requests"])
        for n, r in enumerate(measured):
            total_o, total_r, cached_o, cached_r = r["T_O"], r["T_R"], r["cached_O"], r["cached_R"]
            self.tokens_original += total_o
            self.tokens_received += total_r
            self.anthropic_original += 0.1 * cached_o + 1.25 * (total_o - cached_o)
            self.anthropic_received += 0.1 * cached_r + 1.25 * (total_r - cached_r)
            self.openai_original += 0.5 * cached_o + 1.0 * (total_o - cached_o)
            self.openai_received += 0.5 * cached_r + 1.0 * (total_r - cached_r)
            self.pairs += n > 0
            self.breaks += "break" in r
        if measured:
            self.final_original += measured[-1]["T_O"]
            self.final_received += measured[-1]["T_R"]
        for probe in transcript["probes"]:
            outcome = probe["outcome"]
            if outcome == "visible":
                self.visible += 1
            elif outcome == "recoverable":
                self.recoverable += 1
            elif outcome in ("lost", "error"):
                self.lost += 1


def _saving(received: float, original: float) -> str:
    return f"{(1 - received / original) * 100:.1f} %" if original else "-"


def figures(transcripts: Iterable[dict[str, Any]], member: Callable[[str], bool]) -> Figures:
    result = Figures()
    for transcript in transcripts:
        if member(transcript["id"]):
            result.add(transcript)
    return result


HEADER = (
    "| group | transcripts / requests | probes visible / recoverable / lost | "
    "reduction summed | reduction final | savings Anthropic-like | savings OpenAI-like | "
    "prefix breaks / pairs |"
)


def row(name: str, f: Figures) -> str:
    return (
        f"| {name} | {f.transcripts} / {f.requests} | {f.visible} / {f.recoverable} / {f.lost} | "
        f"{_saving(f.tokens_received, f.tokens_original)} | "
        f"{_saving(f.final_received, f.final_original)} | "
        f"{_saving(f.anthropic_received, f.anthropic_original)} | "
        f"{_saving(f.openai_received, f.openai_original)} | {f.breaks} / {f.pairs} |"
    )


def report(path: Path) -> str:
    run = orjson.loads(path.read_bytes())
    label = run.get("label") or path.stem
    lines = [
        f"### {label} (dialect {run.get('dialect') or 'chat'}, {path.name})",
        "",
        HEADER,
        "|---|" + "---:|" * 7,
    ]
    lines += [row(name, figures(run["transcripts"], member)) for name, member in GROUPS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="blackbox_eval.py --out files")
    args = parser.parse_args(argv)
    print("\n\n".join(report(path) for path in args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
