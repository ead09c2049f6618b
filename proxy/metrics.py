"""Counters, a histogram and gauges, rendered in the Prometheus text exposition format."""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import ClassVar

Labels = tuple[tuple[str, str], ...]

OVERHEAD_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
)


def _labels(pairs: dict[str, str]) -> Labels:
    return tuple(sorted(pairs.items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render_labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{name}="{_escape(value)}"' for name, value in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += 1
        self.sum += value


class Metrics:
    """The proxy's process-wide metrics. Each family is declared once in ``HELP``."""

    HELP: ClassVar[dict[str, tuple[str, str]]] = {
        "deepmem_requests_total": ("counter", "Requests answered, by route kind and status."),
        "deepmem_proxy_overhead_seconds": (
            "histogram",
            "Time the proxy spent on a request before forwarding it upstream.",
        ),
        "deepmem_upstream_errors_total": (
            "counter",
            "Upstream failures: unreachable, timeout, interrupted stream, by upstream.",
        ),
        "deepmem_active_streams": ("gauge", "Responses being relayed right now."),
        "deepmem_fail_open_total": (
            "counter",
            "Rewrites that raised and forwarded the original bytes instead.",
        ),
        "deepmem_non_json_bodies_total": (
            "counter",
            "Chat-route bodies that were not JSON and were relayed untouched.",
        ),
        "deepmem_unrecognised_bodies_total": (
            "counter",
            "Chat-route JSON bodies of a shape deepmem does not read, relayed untouched.",
        ),
        "deepmem_bytes_in_total": ("counter", "Request body bytes received from clients."),
        "deepmem_bytes_out_total": ("counter", "Request body bytes forwarded upstream."),
        "deepmem_expands_total": ("counter", "Originals returned by expand, by interface."),
        "deepmem_mcp_requests_total": ("counter", "MCP requests answered, by status."),
        "deepmem_mcp_tool_calls_total": ("counter", "MCP tool calls, by tool and failure."),
        "deepmem_client_disconnects_total": (
            "counter",
            "Clients that went away before their response was complete.",
        ),
    }

    def __init__(self) -> None:
        self.counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self.histograms: dict[str, dict[Labels, Histogram]] = defaultdict(dict)
        self.gauges: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.counters[name][_labels(labels)] += amount

    def gauge_add(self, name: str, amount: float, **labels: str) -> None:
        self.gauges[name][_labels(labels)] += amount

    def observe(self, name: str, value: float, **labels: str) -> None:
        family = self.histograms[name]
        key = _labels(labels)
        histogram = family.get(key)
        if histogram is None:
            histogram = family[key] = Histogram(OVERHEAD_BUCKETS)
        histogram.observe(value)

    def counter_total(self, name: str) -> float:
        return sum(self.counters.get(name, {}).values())

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, text) in self.HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            if kind == "counter":
                for labels, value in sorted(self.counters.get(name, {}).items()):
                    lines.append(f"{name}{_render_labels(labels)} {value:g}")
            elif kind == "gauge":
                values = self.gauges.get(name) or {(): 0.0}
                for labels, value in sorted(values.items()):
                    lines.append(f"{name}{_render_labels(labels)} {value:g}")
            else:
                for labels, histogram in sorted(self.histograms.get(name, {}).items()):
                    cumulative = 0
                    for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
                        cumulative += count
                        bucket = _render_labels(labels, f'le="{bound:g}"')
                        lines.append(f"{name}_bucket{bucket} {cumulative}")
                    inf = _render_labels(labels, 'le="+Inf"')
                    lines.append(f"{name}_bucket{inf} {histogram.total}")
                    lines.append(f"{name}_sum{_render_labels(labels)} {histogram.sum:.6f}")
                    lines.append(f"{name}_count{_render_labels(labels)} {histogram.total}")
        return "\n".join(lines) + "\n"
