"""``deepmem replay --html``: one self-contained HTML report of a replay (DESIGN.md §7).

Everything comes from the figures ``proxy.replay`` already computes (``RequestMetrics``,
``ProbeResult``, ``summarize``); nothing is measured again. The page needs no JavaScript and
loads nothing: CSS and the charts (inline SVG) are in the file. Per transcript it shows a
chart of tokens per request — original, compressed (proxied) and the proxied stream's cache
read (the longest common prefix with the previous request) and cache write (the rest) — its
totals, the probe table and the per-request figures; a summary table across transcripts
comes first. Series differ in line style and marker as well as colour, so the charts read in
black and white. Every string that comes from a transcript (names, probes) is escaped.

Cells holding a figure of ``summarize`` carry it exactly as ``data-key`` / ``data-value``
(the same keys and values as ``deepmem replay --json``), so scripts and tests can read the
report back.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.config import Settings
from proxy.costs import ANTHROPIC, OPENAI
from proxy.replay import RequestMetrics, TranscriptReport, money_lines, summarize, usd

# Settings that change what a replay measures (the rest concern serving or memory).
COMPRESSION_SETTINGS = (
    "compress",
    "tail_tokens",
    "min_output_tokens",
    "compress_live_turn",
    "pressure_thresholds",
    "protected_tools",
)

# C0 controls (but tab, newline, carriage return), DEL and the two non-characters are not
# allowed in XML and show as nothing in HTML; they appear as their control pictures.
_INVISIBLE = {code: chr(0x2400 + code) for code in range(32) if code not in (9, 10, 13)}
_INVISIBLE |= {0x7F: "\u2421", 0xFFFE: "\ufffd", 0xFFFF: "\ufffd"}
MINUS = "\u2212"
STATUS_MARK = {"visible": "\u2713", "recoverable": "\u21ba", "lost": "\u2717"}


def _e(text: object) -> str:
    """Escape for HTML text and attribute values (and XML: the SVG parts must parse)."""
    return html.escape(str(text).translate(_INVISIBLE), quote=True)


def _pct(value: float) -> str:
    return f"{value * 100:.1f} %".replace("-", MINUS)


def _int(value: float) -> str:
    return f"{value:,.0f}".replace("-", MINUS)


def _cell(key: str, value: float, text: str) -> str:
    """A figure of ``summarize`` with its exact value, for scripts reading the report back."""
    return f'<td class="num" data-key="{_e(key)}" data-value="{value!r}">{_e(text)}</td>'


def _saving(totals: dict[str, Any], flavour: str) -> str:
    key = f"savings_{flavour}"
    return _cell(key, totals[key], _pct(totals[key]))


def _money_cells(totals: dict[str, Any]) -> list[str]:
    """Dollars at list price (original, proxied, net saving), or dashes without a price."""
    if not totals["priced_requests"]:
        return [
            "<td class='num none' title='no price for this model: token units only'>\u2013</td>"
        ] * 3
    return [
        _cell("money_original", totals["money_original"], usd(totals["money_original"])),
        _cell("money_proxied", totals["money_proxied"], usd(totals["money_proxied"])),
        _cell("savings_money", totals["savings_money"], _pct(totals["savings_money"])),
    ]


def _num(text: str) -> str:
    return f'<td class="num">{_e(text)}</td>'


# --- the chart ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    key: str
    label: str
    color: str
    dash: str | None  # stroke-dasharray; None draws a solid line
    marker: str  # circle | square | triangle | cross
    value: Callable[[RequestMetrics], int]


SERIES = (
    Series("original", "original", "#000000", None, "circle", lambda r: r.tokens_original),
    Series(
        "proxied", "compressed (proxied)", "#0072b2", "7 4", "square", lambda r: r.tokens_proxied
    ),
    Series(
        "cache-read",
        "cache read (proxied)",
        "#009e73",
        "2 3",
        "triangle",
        lambda r: r.cached_proxied,
    ),
    Series(
        "cache-write",
        "cache write (proxied)",
        "#d55e00",
        "9 3 2 3",
        "cross",
        lambda r: r.tokens_proxied - r.cached_proxied,
    ),
)
BREAK_COLOR = "#7f7f7f"
BREAK_DASH = "1 3"

WIDTH, HEIGHT = 880, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 44, 52


def _nice_step(span: float, ticks: int, *, integer: bool = False) -> float:
    raw = max(span, 1e-9) / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        step = factor * magnitude
        if step >= raw and (not integer or float(step).is_integer()):
            return step
    return 10 * magnitude


def _token_label(value: float, top: float) -> str:
    if value == 0:
        return "0"
    if top >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:,.0f}"


def _marker(shape: str, x: float, y: float, color: str, attributes: str, title: str) -> str:
    inner = f"<title>{_e(title)}</title>"
    if shape == "circle":
        return (
            f'<circle {attributes} cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#ffffff" '
            f'stroke="{color}" stroke-width="1.5">{inner}</circle>'
        )
    if shape == "square":
        return (
            f'<rect {attributes} x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" '
            f'fill="{color}">{inner}</rect>'
        )
    if shape == "triangle":
        return (
            f'<path {attributes} d="M{x:.1f} {y - 4.5:.1f}L{x + 4.5:.1f} {y + 3.5:.1f}'
            f'L{x - 4.5:.1f} {y + 3.5:.1f}Z" fill="{color}">{inner}</path>'
        )
    return (
        f'<path {attributes} d="M{x - 4:.1f} {y - 4:.1f}L{x + 4:.1f} {y + 4:.1f}'
        f'M{x - 4:.1f} {y + 4:.1f}L{x + 4:.1f} {y - 4:.1f}" stroke="{color}" '
        f'stroke-width="2" fill="none">{inner}</path>'
    )


def _legend() -> str:
    parts = ['<g class="legend" font-size="12">']
    x = LEFT
    y = 18
    for series in SERIES:
        dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
        parts.append(
            f'<line x1="{x}" y1="{y}" x2="{x + 34}" y2="{y}" stroke="{series.color}" '
            f'stroke-width="1.8"{dash}/>'
        )
        parts.append(_marker(series.marker, x + 17, y, series.color, "", series.label))
        parts.append(f'<text x="{x + 40}" y="{y + 4}">{_e(series.label)}</text>')
        x += 40 + round(6.6 * len(series.label)) + 16
    parts.append(
        f'<line x1="{x + 6}" y1="{y - 8}" x2="{x + 6}" y2="{y + 8}" stroke="{BREAK_COLOR}" '
        f'stroke-width="1.5" stroke-dasharray="{BREAK_DASH}"/>'
    )
    parts.append(f'<text x="{x + 14}" y="{y + 4}">prefix break</text>')
    parts.append("</g>")
    return "".join(parts)


def chart_svg(report: TranscriptReport, chart_id: str) -> str:
    """Tokens per request of one transcript, one point per request and series."""
    requests = report.requests
    first, last = requests[0].index, requests[-1].index
    if first == last:
        first, last = first - 1, last + 1
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    peak = max(max(r.tokens_original, r.tokens_proxied) for r in requests) or 1
    y_step = _nice_step(peak, 5)
    y_top = math.ceil(peak / y_step) * y_step

    def px(k: int) -> float:
        return LEFT + (k - first) / (last - first) * plot_w

    def py(tokens: float) -> float:
        return TOP + plot_h - tokens / y_top * plot_h

    title = f"Tokens per request: {report.name}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{_e(chart_id)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-labelledby="{_e(chart_id)}-title" font-family="system-ui, sans-serif">',
        f'<title id="{_e(chart_id)}-title">{_e(title)}</title>',
        _legend(),
        '<g class="axes" font-size="11">',
    ]
    steps = round(y_top / y_step)
    for n in range(steps + 1):
        value = n * y_step
        y = py(value)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
            f'stroke="#dddddd" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_e(_token_label(value, y_top))}</text>"
        )
    x_step = int(_nice_step(last - first, 10, integer=True))
    tick = math.ceil(first / x_step) * x_step
    while tick <= last:
        x = px(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 5}" '
            f'stroke="#000000"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{tick}</text>'
        )
        tick += x_step
    parts.append(
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#000000"/>'
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" '
        f'stroke="#000000"/>'
    )
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
        f'font-size="12">request k (the first k messages; one per assistant message)</text>'
    )
    parts.append(
        f'<text transform="translate(16 {TOP + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle" font-size="12">tokens per request (cl100k_base)</text>'
    )
    parts.append("</g>")

    parts.append('<g class="prefix-breaks">')
    for r in requests:
        if r.prefix_break_at is None:
            continue
        x = px(r.index)
        parts.append(
            f'<line class="prefix-break" data-request="{r.index}" x1="{x:.1f}" y1="{TOP}" '
            f'x2="{x:.1f}" y2="{TOP + plot_h}" stroke="{BREAK_COLOR}" stroke-width="1.5" '
            f'stroke-dasharray="{BREAK_DASH}"><title>request {r.index}: prefix break at '
            f"message {r.prefix_break_at} ({_e(r.event or 'no event')})</title></line>"
        )
    parts.append("</g>")

    for series in SERIES:
        points = [(px(r.index), py(series.value(r)), r) for r in requests]
        dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
        parts.append(f'<g class="series" data-series="{series.key}">')
        parts.append(
            '<polyline points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
            + f'" fill="none" stroke="{series.color}" stroke-width="1.8"{dash}/>'
        )
        for x, y, r in points:
            value = series.value(r)
            parts.append(
                _marker(
                    series.marker,
                    x,
                    y,
                    series.color,
                    f'class="point {series.key}" data-request="{r.index}" data-tokens="{value}"',
                    f"request {r.index}: {series.label} {value:,} tokens",
                )
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


# --- tables ---------------------------------------------------------------------------------


def _summary_row(
    name: str, totals: dict[str, Any], anchor: str | None, css: str = "", model: str = ""
) -> str:
    label = f'<a href="#{_e(anchor)}">{_e(name)}</a>' if anchor else _e(name)
    cells = [
        f"<th scope='row'>{label}</th>",
        _cell("requests", totals["requests"], f"{totals['requests']:,}"),
        _cell("tokens_original", totals["tokens_original"], _int(totals["tokens_original"])),
        _cell("tokens_proxied", totals["tokens_proxied"], _int(totals["tokens_proxied"])),
        _cell("reduction_summed", totals["reduction_summed"], _pct(totals["reduction_summed"])),
        _cell("reduction_final", totals["reduction_final"], _pct(totals["reduction_final"])),
        f"<td class='model'>{_e(model)}</td>",
        *_money_cells(totals),
    ]
    for flavour in ("anthropic", "openai"):
        cells += [
            _cell(
                f"cost_{flavour}_original",
                totals[f"cost_{flavour}_original"],
                _int(totals[f"cost_{flavour}_original"]),
            ),
            _cell(
                f"cost_{flavour}_proxied",
                totals[f"cost_{flavour}_proxied"],
                _int(totals[f"cost_{flavour}_proxied"]),
            ),
            _saving(totals, flavour),
        ]
    cells += [
        _cell(key, totals[key], f"{totals[key]:,}")
        for key in ("probes_visible", "probes_recoverable", "probes_lost")
    ]
    cells += [
        _cell("prefix_breaks", totals["prefix_breaks"], f"{totals['prefix_breaks']:,}"),
        _cell("pairing_errors", totals["pairing_errors"], f"{totals['pairing_errors']:,}"),
    ]
    return f'<tr class="{css}" data-transcript="{_e(name)}">' + "".join(cells) + "</tr>"


COST_HEADS = (
    "<th scope='col'>original</th><th scope='col'>proxied</th><th scope='col'>net saving</th>"
)


def summary_table(reports: Sequence[TranscriptReport], anchors: Sequence[str]) -> str:
    head = (
        "<thead><tr><th rowspan='2' scope='col'>transcript</th>"
        "<th rowspan='2' scope='col'>requests</th>"
        "<th colspan='2' scope='colgroup'>tokens, summed</th>"
        "<th colspan='2' scope='colgroup'>context reduction</th>"
        "<th rowspan='2' scope='col'>model</th>"
        "<th colspan='3' scope='colgroup'>cost at list price (USD)</th>"
        "<th colspan='3' scope='colgroup'>Anthropic-like cost</th>"
        "<th colspan='3' scope='colgroup'>OpenAI-like cost</th>"
        "<th colspan='3' scope='colgroup'>probes</th>"
        "<th rowspan='2' scope='col'>prefix breaks</th>"
        "<th rowspan='2' scope='col'>pairing errors</th></tr>"
        "<tr><th scope='col'>original</th><th scope='col'>compressed</th>"
        "<th scope='col'>summed</th><th scope='col'>last request</th>"
        + COST_HEADS
        * 3
        + "<th scope='col'>visible</th><th scope='col'>recoverable</th>"
        "<th scope='col'>lost</th></tr></thead>"
    )
    rows = [
        _summary_row(report.name, report.totals(), anchor, model=_model_label(report))
        for report, anchor in zip(reports, anchors, strict=True)
    ]
    rows.append(_summary_row("TOTAL", summarize(reports), None, "total"))
    return (
        '<div class="scroll"><table class="summary">'
        + head
        + "<tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def _model_label(report: TranscriptReport) -> str:
    if report.model is None:
        return ""
    return report.model + (f" ({report.price.pattern})" if report.price else " (no price)")


def totals_table(report: TranscriptReport) -> str:
    totals = report.totals()
    final = report.requests[-1] if report.requests else None
    rows = [
        "<tr><th scope='row'>tokens, summed over requests</th>"
        + _cell("tokens_original", totals["tokens_original"], _int(totals["tokens_original"]))
        + _cell("tokens_proxied", totals["tokens_proxied"], _int(totals["tokens_proxied"]))
        + _num(_int(totals["tokens_original"] - totals["tokens_proxied"]))
        + _cell("reduction_summed", totals["reduction_summed"], _pct(totals["reduction_summed"]))
        + "</tr>",
        f"<tr><th scope='row'>tokens at the last request"
        f"{f' (k = {final.index})' if final else ''}</th>"
        + _num(_int(final.tokens_original if final else 0))
        + _num(_int(final.tokens_proxied if final else 0))
        + _num(_int(final.tokens_original - final.tokens_proxied if final else 0))
        + _cell("reduction_final", totals["reduction_final"], _pct(totals["reduction_final"]))
        + "</tr>",
    ]
    for flavour, label in (("anthropic", "Anthropic-like"), ("openai", "OpenAI-like")):
        original = totals[f"cost_{flavour}_original"]
        proxied = totals[f"cost_{flavour}_proxied"]
        rows.append(
            f"<tr><th scope='row'>{label} cost</th>"
            + _cell(f"cost_{flavour}_original", original, _int(original))
            + _cell(f"cost_{flavour}_proxied", proxied, _int(proxied))
            + _num(_int(original - proxied))
            + _saving(totals, flavour)
            + "</tr>"
        )
    if report.price is not None:
        original, proxied = totals["money_original"], totals["money_proxied"]
        rows.append(
            f"<tr><th scope='row'>cost at list price, USD ({_e(_model_label(report))})</th>"
            + _cell("money_original", original, usd(original))
            + _cell("money_proxied", proxied, usd(proxied))
            + _cell("money_saved", totals["money_saved"], usd(totals["money_saved"]))
            + _cell("savings_money", totals["savings_money"], _pct(totals["savings_money"]))
            + "</tr>"
        )
    figures = (
        "<table class='totals'><thead><tr><th></th><th scope='col'>original</th>"
        "<th scope='col'>proxied</th><th scope='col'>saved</th><th scope='col'>net saving</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )
    counts = (
        "<table class='totals'><thead><tr><th scope='col'>requests</th>"
        "<th scope='col'>probes</th><th scope='col'>visible</th>"
        "<th scope='col'>recoverable</th><th scope='col'>lost</th>"
        "<th scope='col'>prefix breaks</th><th scope='col'>pairing errors</th>"
        "<th scope='col'>ms p50</th><th scope='col'>ms max</th></tr></thead><tbody><tr>"
        + "".join(
            _cell(key, totals[key], f"{totals[key]:,}")
            for key in (
                "requests",
                "probes",
                "probes_visible",
                "probes_recoverable",
                "probes_lost",
                "prefix_breaks",
                "pairing_errors",
            )
        )
        + _cell("ms_p50", totals["ms_p50"], f"{totals['ms_p50']:.2f}")
        + _cell("ms_max", totals["ms_max"], f"{totals['ms_max']:.2f}")
        + "</tr></tbody></table>"
    )
    return figures + counts


def probe_table(report: TranscriptReport) -> str:
    if not report.probes:
        return "<p class='note'>No probes in this transcript.</p>"
    rows = [
        f'<tr class="probe status-{_e(p.status)}"><td class="num">{n}</td>'
        f'<td class="probe-text"><code>{_e(p.probe)}</code></td>'
        f'<td class="num">{p.request}</td>'
        f'<td class="status">{STATUS_MARK.get(p.status, "?")} {_e(p.status)}</td>'
        f'<td class="tool">{_e(p.tool)}</td><td class="compressor">{_e(p.compressor)}</td></tr>'
        for n, p in enumerate(report.probes, 1)
    ]
    return (
        "<table class='probes'><thead><tr><th scope='col'>#</th><th scope='col'>probe</th>"
        "<th scope='col'>request k</th><th scope='col'>status</th>"
        "<th scope='col'>source tool</th><th scope='col'>compressor (hidden probes)</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def hidden_table(reports: Sequence[TranscriptReport], anchors: Sequence[str]) -> str:
    """Probes not visible at their request, per transcript, by source tool and compressor."""
    rows = []
    for report, anchor in zip(reports, anchors, strict=True):
        for row in report.totals()["hidden_probes"]:
            css = "status-lost" if row["lost"] else "status-recoverable"
            rows.append(
                f'<tr class="hidden {css}" data-hidden-in="{_e(report.name)}" '
                f'data-tool="{_e(row["tool"])}" data-compressor="{_e(row["compressor"])}" '
                f'data-recoverable="{row["recoverable"]}" data-lost="{row["lost"]}">'
                f'<th scope="row"><a href="#{_e(anchor)}">{_e(report.name)}</a></th>'
                f"<td>{_e(row['tool'] or '?')}</td><td>{_e(row['compressor'])}</td>"
                + _num(str(row["recoverable"]))
                + _num(str(row["lost"]))
                + "</tr>"
            )
    if not rows:
        return "<p class='note'>Every probe was visible at its request.</p>"
    return (
        "<table class='hidden-probes'><thead><tr><th scope='col'>transcript</th>"
        "<th scope='col'>source tool</th><th scope='col'>compressor</th>"
        "<th scope='col'>recoverable</th><th scope='col'>lost</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def requests_table(report: TranscriptReport) -> str:
    rows = []
    for r in report.requests:
        reduction = 1 - r.tokens_proxied / r.tokens_original if r.tokens_original else 0.0
        broken = "" if r.prefix_break_at is None else f"message {r.prefix_break_at}"
        rows.append(
            f'<tr data-request="{r.index}"><td class="num">{r.index}</td>'
            + "".join(
                _num(_int(value))
                for value in (
                    r.tokens_original,
                    r.tokens_proxied,
                )
            )
            + _num(_pct(reduction))
            + "".join(
                _num(_int(value))
                for value in (
                    r.cached_original,
                    r.tokens_original - r.cached_original,
                    r.cached_proxied,
                    r.tokens_proxied - r.cached_proxied,
                    ANTHROPIC.cost(r.tokens_original, r.cached_original),
                    ANTHROPIC.cost(r.tokens_proxied, r.cached_proxied),
                    OPENAI.cost(r.tokens_original, r.cached_original),
                    OPENAI.cost(r.tokens_proxied, r.cached_proxied),
                )
            )
            + f"<td>{_e(broken)}</td><td>{_e(r.event or '')}</td>"
            + _num(f"{r.milliseconds:.2f}")
            + "</tr>"
        )
    return (
        "<details><summary>Per-request figures</summary><div class='scroll'>"
        "<table class='requests'><thead><tr><th rowspan='2' scope='col'>k</th>"
        "<th colspan='2' scope='colgroup'>tokens</th>"
        "<th rowspan='2' scope='col'>reduction</th>"
        "<th colspan='2' scope='colgroup'>original stream</th>"
        "<th colspan='2' scope='colgroup'>proxied stream</th>"
        "<th colspan='2' scope='colgroup'>Anthropic-like cost</th>"
        "<th colspan='2' scope='colgroup'>OpenAI-like cost</th>"
        "<th rowspan='2' scope='col'>prefix break at</th>"
        "<th rowspan='2' scope='col'>event</th><th rowspan='2' scope='col'>ms</th></tr>"
        "<tr><th scope='col'>original</th><th scope='col'>compressed</th>"
        + "<th scope='col'>cache read</th><th scope='col'>cache write</th>" * 2
        + "<th scope='col'>original</th><th scope='col'>proxied</th>" * 2
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div></details>"
    )


# --- the page -------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111;
  margin: 1.5rem auto; max-width: 1400px; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2.5rem; border-bottom: 2px solid #333; }
h3 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
p.meta, p.note { color: #444; margin: .3rem 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .4rem 0 .8rem; }
th, td { border: 1px solid #bbb; padding: .2rem .45rem; vertical-align: top; }
thead th { background: #f0f0f0; font-weight: 600; }
tbody th { text-align: left; font-weight: 500; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.summary { font-size: 13px; }
table.summary th, table.summary td { padding: .2rem .3rem; }
table.summary tbody th { white-space: nowrap; }
tr.total th, tr.total td { font-weight: 700; border-top: 2px solid #333; }
table.probes { width: 100%; }
td.probe-text code { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12.5px; }
td.status { white-space: nowrap; }
table.probes td.num, table.probes td.status { width: 1%; }
table.probes td.tool, table.probes td.compressor { white-space: nowrap; width: 1%; }
tr.status-visible td.status { background: #e6f4ea; }
tr.status-recoverable td.status, tr.hidden.status-recoverable td { background: #fff4d6; }
tr.status-lost td.status, tr.hidden.status-lost td { background: #fbe0dc; font-weight: 700; }
svg.chart { width: 100%; max-width: 1000px; height: auto; display: block; margin: .4rem 0; }
details { margin: .5rem 0 1rem; }
summary { cursor: pointer; }
dl.defs { display: grid; grid-template-columns: max-content 1fr; gap: .15rem .8rem; }
dl.defs dt { font-weight: 600; }
dl.defs dd { margin: 0; }
"""

DEFINITIONS = (
    (
        "request k",
        "the first k messages of the transcript, sent when assistant message k is due "
        "(DESIGN.md §7).",
    ),
    ("tokens", "cl100k_base tokens of the request's serialized messages."),
    (
        "cache read / write",
        "cache read: tokens of the longest common byte prefix with the previous request of "
        "the same stream; cache write: the rest of the request.",
    ),
    (
        "context reduction",
        "1 \u2212 proxied / original tokens, summed over requests and at the last.",
    ),
    (
        "cost",
        "in token units. Anthropic-like: Σ 0.1·cache read + 1.25·cache write; OpenAI-like: "
        "Σ 0.5·cache read + 1.0·cache write. Net saving: 1 \u2212 proxied / original cost.",
    ),
    (
        "cost at list price",
        "in US dollars, for a transcript whose model has a price (deepmem's built-in list "
        "prices or the prices setting): cache reads at the cache-read price, cache writes at "
        "the cache-write price where the provider charges writes (Anthropic), else the input "
        "price. A model without a price shows a dash: its costs are in token units only.",
    ),
    (
        "probes",
        "strings the agent took from a tool output and used later, looked up in the "
        "referencing request: visible (in the request), recoverable (in an original behind "
        "a marker of that request) or lost.",
    ),
    (
        "prefix break",
        "a proxied request whose earlier messages changed since the previous one (a cache "
        "miss past that point).",
    ),
    (
        "hidden probes",
        "probes not visible at their request, by the tool whose output they came from and "
        "what handled that output: a compressor's name, dedup (a pointer to an identical "
        "earlier output), dropped, not compressed or rewritten.",
    ),
    ("pairing errors", "tool results that lost their tool call, or calls that lost their result."),
)


def render_html(
    reports: Iterable[TranscriptReport],
    *,
    target: str = "",
    settings: Settings | None = None,
    generated: datetime | None = None,
) -> str:
    """The whole report as one HTML document."""
    reports = list(reports)
    anchors = [f"t{n}" for n in range(1, len(reports) + 1)]
    generated = generated or datetime.now(UTC)
    total = summarize(reports)
    meta = [
        f"Generated {_e(generated.strftime('%Y-%m-%d %H:%M UTC'))} by deepmem "
        f"{_e(__version__)} from <code>{_e(target)}</code>: {total['transcripts']} "
        f"transcript(s), {total['requests']:,} requests, sent as "
        f"{_e(', '.join(sorted({r.dialect for r in reports})) or 'chat')} requests."
    ]
    if settings is not None:
        meta.append(
            "Compression settings: "
            + ", ".join(
                f"<code>{name} = {_e(getattr(settings, name))}</code>"
                for name in COMPRESSION_SETTINGS
            )
            + "."
        )
    meta += [_e(line) for line in money_lines(reports, total)]
    definitions = "".join(f"<dt>{_e(term)}</dt><dd>{_e(text)}</dd>" for term, text in DEFINITIONS)
    body = [
        "<h1>deepmem replay report</h1>",
        *(f"<p class='meta'>{line}</p>" for line in meta),
        "<h2 id='summary'>Summary</h2>",
        summary_table(reports, anchors),
        (
            f"<p class='note'>Probes: {total['probes_visible']} visible, "
            f"{total['probes_recoverable']} recoverable, {total['probes_lost']} lost of "
            f"{total['probes']}. Costs are in token units; a negative net saving means the "
            "proxied stream costs more.</p>"
        ),
        "<h3 id='hidden'>Hidden probes by source tool and compressor</h3>",
        hidden_table(reports, anchors),
        f"<details><summary>Definitions</summary><dl class='defs'>{definitions}</dl></details>",
    ]
    for report, anchor in zip(reports, anchors, strict=True):
        body.append(
            f'<section class="transcript" id="{anchor}" data-name="{_e(report.name)}">'
            f"<h2>{_e(report.name)}</h2>"
            f"<p class='meta' data-dialect='{_e(report.dialect)}'>Sent as "
            f"{_e(report.dialect)} requests"
            + (f"; model {_e(_model_label(report))}" if report.model else "")
            + ".</p>"
        )
        body.append("<h3>Totals</h3>" + totals_table(report))
        body.append("<h3>Tokens per request</h3>")
        if report.requests:
            body.append(chart_svg(report, f"chart-{anchor}"))
        else:
            body.append("<p class='note'>No requests (no assistant message after the first).</p>")
        body.append(f"<h3>Probes ({len(report.probes)})</h3>" + probe_table(report))
        if report.requests:
            body.append(requests_table(report))
        body.append('<p class="note"><a href="#summary">back to the summary</a></p></section>')
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>deepmem replay: {_e(target)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_html(
    reports: Iterable[TranscriptReport],
    path: Path,
    *,
    target: str = "",
    settings: Settings | None = None,
) -> int:
    """Write the report to ``path``; returns its size in bytes."""
    data = render_html(reports, target=target, settings=settings).encode("utf-8", "replace")
    path.write_bytes(data)
    return len(data)
