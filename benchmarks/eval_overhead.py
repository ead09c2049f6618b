"""The black-box evaluator's overhead, split by which of a request's two sends went first.

    python -m benchmarks.eval_overhead CONTROL.json RUN.json [RUN.json ...]

``../shared/eval/blackbox_eval.py`` times each request twice, straight to its fake upstream
and through the proxy, and alternates which goes first (the first is sent after the
evaluator's own work on the previous request, on cold caches; the second follows it at once).
So each proxy's overheads fall in two groups about 0.7 ms apart, and the p50 of the whole run
lies between them, where few requests are: two runs of the same control in one hour had p50s
0.2 ms apart (0.86 against 1.05) while their requests, one by one, differed by 0.00 ms at the
median (0.05 ms within either group).

For the control and each run (``--out`` files of the same dialect and corpus) this prints the
evaluator's p50 and p95, the p50 of each group with its ratio to the control's, and each
request's overhead less the control's for the same request (transcript and index), at the
median and mean: the steadiest figure of what the proxy adds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from benchmarks.overhead import percentile

# The evaluator sends the direct request first for even request indices of a transcript.
ORDERS = (("direct sent first", 0), ("proxy sent first", 1))

RequestKey = tuple[str, int]


@dataclass(frozen=True)
class Run:
    label: str
    overheads: dict[RequestKey, float]  # ms, by transcript id and index of the request

    def of_order(self, parity: int) -> list[float]:
        return [ms for (_, index), ms in self.overheads.items() if index % 2 == parity]


def load(path: Path) -> Run:
    data = orjson.loads(path.read_bytes())
    overheads: dict[RequestKey, float] = {}
    for transcript in data["transcripts"]:
        for index, request in enumerate(transcript["requests"]):
            if "direct_ms" in request and "proxy_ms" in request and "direct_error" not in request:
                overheads[(transcript["id"], index)] = request["proxy_ms"] - request["direct_ms"]
    return Run(str(data.get("label") or path.stem), overheads)


def _percentile(values: list[float], q: int) -> float:
    """As the evaluator computes it (linear between the two nearest ranks)."""
    return percentile(values, q) if values else float("nan")


def _ratio(value: float, control: float) -> str:
    return f"{value / control:.2f}" if control > 0 else "-"


def report(control: Run, runs: list[Run]) -> str:
    header = "| proxy | p50 / p95 ms (ratio) |" + "".join(
        f" {name}: p50 ms (ratio) |" for name, _ in ORDERS
    )
    lines = [
        header + " per request, less the control's: median / mean ms |",
        "|---|---|" + "---|" * len(ORDERS) + "---|",
    ]
    all_control = list(control.overheads.values())
    c50, c95 = _percentile(all_control, 50), _percentile(all_control, 95)
    for run in [control, *runs]:
        values = list(run.overheads.values())
        p50, p95 = _percentile(values, 50), _percentile(values, 95)
        cells = [f"{p50:.2f} / {p95:.2f} ({_ratio(p50, c50)} / {_ratio(p95, c95)})"]
        for _, parity in ORDERS:
            mine = _percentile(run.of_order(parity), 50)
            theirs = _percentile(control.of_order(parity), 50)
            cells.append(f"{mine:.2f} ({_ratio(mine, theirs)})")
        shared = [key for key in run.overheads if key in control.overheads]
        differences = [run.overheads[key] - control.overheads[key] for key in shared]
        if run is control or not differences:
            cells.append("-")
        else:
            median, mean = statistics.median(differences), statistics.fmean(differences)
            cells.append(f"{median:+.2f} / {mean:+.2f} (n={len(differences)})")
        lines.append(f"| {run.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("control", type=Path, help="the pass-through control's --out file")
    parser.add_argument("runs", nargs="+", type=Path, help="the proxies' --out files")
    args = parser.parse_args(argv)
    print(report(load(args.control), [load(path) for path in args.runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
