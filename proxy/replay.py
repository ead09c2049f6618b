"""Replay recorded transcripts through the proxy's own pipeline and measure (DESIGN.md §7).

A transcript (corpus format: OpenAI chat ``messages``, optional ``tools`` and ``probes``) is
replayed as one request per assistant message k, ``messages[:k]``, through the same rewrite
hook, session memo and CCR store the proxy uses. Per request and in total it reports context
reduction, prompt-cache cost (Anthropic-like and OpenAI-like token units, and dollars at the
list price of a transcript's ``model`` when it has one, ``proxy.prices``), prefix breaks,
probe retention (visible, recoverable through a marker, lost), tool-call pairing errors and
time. ``proxy.replay_opencode`` feeds it OpenCode's own sessions the same way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from compressors.markers import MARKER_RE, ccr_key, marker, marker_keys
from compressors.outputs import ToolOutput
from compressors.pipeline import CompressionSettings, SessionMemo
from compressors.registry import compress_output
from compressors.tokens import TokenCounter
from compressors.view import Conversation, Kind
from compressors.wire import parse_conversation
from proxy.addons import build_addons
from proxy.bodies import BodyCache
from proxy.compression import CompressionReport, compression_settings
from proxy.config import Settings
from proxy.costs import ANTHROPIC, OPENAI, common_prefix_length
from proxy.pipeline import rewrite_request
from proxy.prices import ModelPrice
from proxy.replay_wire import (
    DIALECTS,
    paired_calls,
    payload,
    request_body,
    text_of,
    tool_calls,
)
from proxy.stores import open_stores

T = TypeVar("T")


@dataclass
class RequestMetrics:
    index: int  # k: the request is messages[:k]
    tokens_original: int
    tokens_proxied: int
    cached_original: int
    cached_proxied: int
    prefix_break_at: int | None  # first message index whose bytes changed since last request
    event: str | None
    milliseconds: float


@dataclass
class ProbeResult:
    probe: str
    request: int
    status: str  # visible | recoverable | lost
    tool: str = ""  # the tool call whose output the probe first appeared in
    compressor: str = ""  # hidden probes: what handled that output (see ``handled_by``)

    @property
    def hidden(self) -> bool:
        return self.status != "visible"


@dataclass
class TranscriptReport:
    name: str
    dialect: str = "chat"
    requests: list[RequestMetrics] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    pairing_errors: int = 0
    model: str | None = None  # the model the transcript's requests named, when known
    price: ModelPrice | None = None  # and its list price, when it has one

    def totals(self) -> dict[str, Any]:
        return summarize([self])


def _first_changed_message(previous: list[bytes], current: list[bytes]) -> int | None:
    for index, (old, new) in enumerate(zip(previous, current, strict=False)):
        if old != new:
            return index
    return None


class NotATranscript(ValueError):
    """The file cannot be replayed; the message says why, naming the file."""


def load_transcript(path: Path) -> dict[str, Any]:
    """The transcript in ``path``, its shape checked, or ``NotATranscript``.

    OpenCode request captures (``fixtures/opencode``: one request, ``body`` in any of three
    wire formats) are refused by name: replay measures a whole session request by request,
    which a single request cannot give.
    """
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise NotATranscript(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise NotATranscript(f"{path}: not JSON ({exc})") from exc
    if isinstance(data, dict) and "messages" not in data and {"path", "body"} <= data.keys():
        raise NotATranscript(
            f"{path}: an OpenCode request capture (one request), not a transcript; replay "
            "reads whole sessions: an object with a 'messages' list in OpenAI chat format"
        )
    check_transcript(data, str(path))
    return data


def check_transcript(data: Any, path: str) -> None:
    """``NotATranscript`` (naming ``path``) unless ``data`` has a transcript's shape."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise NotATranscript(
            f"{path}: not a transcript: expected an object with a 'messages' list "
            "(OpenAI chat format, optional 'tools' and 'probes')"
        )
    if not all(isinstance(message, dict) for message in data["messages"]):
        raise NotATranscript(f"{path}: every entry of 'messages' must be an object")
    if not isinstance(data.get("tools") or [], list):
        raise NotATranscript(f"{path}: 'tools' must be a list")
    probes = data.get("probes") or []
    if not isinstance(probes, list) or not all(
        isinstance(probe, dict)
        and isinstance(probe.get("probe"), str)
        and isinstance(probe.get("referencing_turn_index"), int)
        for probe in probes
    ):
        raise NotATranscript(
            f"{path}: 'probes' must be a list of {{'probe': text, 'referencing_turn_index': n}}"
        )
    if not isinstance(data.get("model") or "", str):
        raise NotATranscript(f"{path}: 'model' must be a model id (text)")


def _searchable(conversation: Conversation) -> str:
    return "\n".join(item.text for item in conversation.items)


def _source_tools(messages: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Tool call id -> (tool name, arguments) of every call in the transcript."""
    calls: dict[str, tuple[str, str]] = {}
    for message in messages:
        for call in tool_calls(message):
            function = call.get("function")
            if not isinstance(function, dict):
                function = {}
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
            calls[str(call.get("id"))] = (str(function.get("name") or ""), arguments)
    return calls


def handled_by(
    sent: str | None,
    output: ToolOutput,
    memo: SessionMemo,
    settings: CompressionSettings,
) -> str:
    """What turned a tool output into the text ``sent`` upstream: a compressor's name,
    ``dedup`` (a pointer to an identical earlier output), ``dropped`` (no longer in the
    request), ``not compressed`` or ``rewritten`` (changed by something other than a
    compressor, e.g. a dropped reminder); ``unattributed`` when no level reproduces it.

    The compression result counts compressors per request, not per output; the one that
    produced ``sent`` is found by compressing the original again, at each level, with the
    session's task terms: compressors are pure, so the one whose output equals ``sent``
    is the one that ran."""
    if sent is None:
        return "dropped"
    if sent == output.text:
        return "not compressed"
    found = MARKER_RE.match(sent)
    if found is None:
        return "rewritten"
    if found.group("what").startswith("identical to an earlier"):
        return "dedup"
    focused = ToolOutput(
        output.text, output.tool, output.arguments, memo.focus[1] if memo.focus else frozenset()
    )
    key = ccr_key(output.text)
    for level in range(1, len(settings.level_ratios) + 1):
        outcome = compress_output(focused, settings.budget(output.text, level))
        if outcome is None:
            continue
        name, compressed = outcome
        if marker(compressed.omitted, key) + "\n" + compressed.text == sent:
            return name
    return "unattributed"


def _tool_results(conversation: Conversation) -> dict[str, str]:
    return {
        str(item.call_id): item.text for item in conversation.items if item.kind is Kind.TOOL_RESULT
    }


def replay_transcript(
    path: Path, settings: Settings, counter: TokenCounter, dialect: str = "chat"
) -> TranscriptReport:
    """Replay one transcript file as requests of ``dialect`` (chat, anthropic or responses)."""
    return replay_data(path.stem, load_transcript(path), settings, counter, dialect)


def replay_data(
    name: str,
    data: dict[str, Any],
    settings: Settings,
    counter: TokenCounter,
    dialect: str = "chat",
) -> TranscriptReport:
    """Replay one transcript (checked by ``check_transcript``) named ``name``; its optional
    ``model`` prices it (``settings.prices``)."""
    messages: list[dict[str, Any]] = data["messages"]
    tools = data.get("tools") or []
    calls = _source_tools(messages)
    stores = open_stores(settings, in_memory=True)
    addons = build_addons(settings, stores)
    wire = DIALECTS[dialect]
    compression = compression_settings(settings)
    model = data.get("model") or None
    report = TranscriptReport(name, dialect, model=model, price=settings.prices.lookup(model))
    headers = {"x-session-id": f"replay-{name}"}
    probes_by_request: dict[int, list[tuple[str, str]]] = {}
    for probe in data.get("probes") or ():
        index = probe.get("tool_message_index")
        source = messages[int(index)] if index is not None else {}
        probes_by_request.setdefault(int(probe["referencing_turn_index"]), []).append(
            (probe["probe"], str(source.get("tool_call_id") or ""))
        )

    previous: tuple[bytes, bytes, list[bytes]] | None = None
    bodies = BodyCache()  # as the proxy parses: each request from where it differs
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or k == 0:
            continue
        original_body = request_body(dialect, messages[:k], tools)
        raw = orjson.dumps(original_body)
        started = time.perf_counter()
        rewrite = rewrite_request(raw, wire, headers, addons, bodies=bodies)
        elapsed = (time.perf_counter() - started) * 1000
        proxied_body = orjson.loads(rewrite.body)
        compressed = rewrite.flow.report(CompressionReport) if rewrite.flow else None
        result = compressed.result if compressed else None

        original_payload = payload(dialect, original_body)
        proxied_payload = payload(dialect, proxied_body)
        original_bytes = orjson.dumps(original_payload)
        proxied_bytes = orjson.dumps(proxied_payload)
        per_message = [orjson.dumps(m) for m in proxied_payload]
        cached_original = cached_proxied = 0
        break_at = None
        if previous is not None:
            cached_original = counter.count(
                original_bytes[: common_prefix_length(previous[0], original_bytes)].decode(
                    "utf-8", "ignore"
                )
            )
            common = common_prefix_length(previous[1], proxied_bytes)
            cached_proxied = counter.count(proxied_bytes[:common].decode("utf-8", "ignore"))
            break_at = _first_changed_message(previous[2], per_message)
        previous = (original_bytes, proxied_bytes, per_message)
        report.requests.append(
            RequestMetrics(
                index=k,
                tokens_original=counter.count(original_bytes.decode()),
                tokens_proxied=counter.count(proxied_bytes.decode()),
                cached_original=cached_original,
                cached_proxied=cached_proxied,
                prefix_break_at=break_at,
                event=result.event if result else None,
                milliseconds=elapsed,
            )
        )
        report.pairing_errors += len(
            paired_calls(dialect, original_body) - paired_calls(dialect, proxied_body)
        )

        wanted = probes_by_request.get(k)
        if wanted:
            conversation = parse_conversation(wire, proxied_body)
            visible = _searchable(conversation)
            reachable = "\n".join(
                (stores.originals.get(key) or b"").decode("utf-8", "surrogatepass")
                for key in marker_keys(visible)
            )
            sent = _tool_results(conversation)
            memo = stores.memos.load(rewrite.session_id)
            for probe, call_id in wanted:
                tool, arguments = calls.get(call_id, ("", ""))
                status = (
                    "visible"
                    if probe in visible
                    else "recoverable"
                    if probe in reachable
                    else "lost"
                )
                handler = ""
                if status != "visible" and call_id:  # without its tool message: unknown
                    source = next((m for m in messages[:k] if m.get("tool_call_id") == call_id), {})
                    output = ToolOutput(text_of(source.get("content")), tool, arguments)
                    handler = handled_by(sent.get(call_id), output, memo, compression)
                report.probes.append(ProbeResult(probe, k, status, tool, handler))
    return report


def summarize(reports: Iterable[TranscriptReport]) -> dict[str, Any]:
    reports = list(reports)
    requests = [r for report in reports for r in report.requests]
    probes = [p for report in reports for p in report.probes]
    finals = [report.requests[-1] for report in reports if report.requests]
    original = sum(r.tokens_original for r in requests)
    proxied = sum(r.tokens_proxied for r in requests)
    anthropic = [
        sum(ANTHROPIC.cost(r.tokens_original, r.cached_original) for r in requests),
        sum(ANTHROPIC.cost(r.tokens_proxied, r.cached_proxied) for r in requests),
    ]
    openai = [
        sum(OPENAI.cost(r.tokens_original, r.cached_original) for r in requests),
        sum(OPENAI.cost(r.tokens_proxied, r.cached_proxied) for r in requests),
    ]
    priced = [(report.price, r) for report in reports if report.price for r in report.requests]
    money = [
        sum(price.input_cost(r.tokens_original, r.cached_original) for price, r in priced),
        sum(price.input_cost(r.tokens_proxied, r.cached_proxied) for price, r in priced),
    ]
    final_original = sum(r.tokens_original for r in finals)
    final_proxied = sum(r.tokens_proxied for r in finals)
    times = sorted(r.milliseconds for r in requests)

    def share(status: str) -> int:
        return sum(1 for p in probes if p.status == status)

    return {
        "transcripts": len(reports),
        "requests": len(requests),
        "tokens_original": original,
        "tokens_proxied": proxied,
        "reduction_summed": 1 - proxied / original if original else 0.0,
        "reduction_final": 1 - final_proxied / final_original if final_original else 0.0,
        "cost_anthropic_original": anthropic[0],
        "cost_anthropic_proxied": anthropic[1],
        "savings_anthropic": 1 - anthropic[1] / anthropic[0] if anthropic[0] else 0.0,
        "cost_openai_original": openai[0],
        "cost_openai_proxied": openai[1],
        "savings_openai": 1 - openai[1] / openai[0] if openai[0] else 0.0,
        "models": sorted({report.model for report in reports if report.model}),
        "priced_requests": len(priced),
        "unpriced_requests": len(requests) - len(priced),
        "money_original": money[0],
        "money_proxied": money[1],
        "money_saved": money[0] - money[1],
        "savings_money": 1 - money[1] / money[0] if money[0] else 0.0,
        "prefix_breaks": sum(1 for r in requests if r.prefix_break_at is not None),
        "prefix_break_locations": [
            (report.name, r.index, r.prefix_break_at, r.event)
            for report in reports
            for r in report.requests
            if r.prefix_break_at is not None
        ],
        "probes": len(probes),
        "probes_visible": share("visible"),
        "probes_recoverable": share("recoverable"),
        "probes_lost": share("lost"),
        "lost_probes": [(p.probe, p.request) for p in probes if p.status == "lost"],
        "hidden_probes": hidden_probes(probes),
        "pairing_errors": sum(report.pairing_errors for report in reports),
        "ms_p50": times[len(times) // 2] if times else 0.0,
        "ms_max": times[-1] if times else 0.0,
    }


def hidden_probes(probes: Iterable[ProbeResult]) -> list[dict[str, Any]]:
    """Probes not visible at their request, counted by source tool and compressor (most
    first): ``{"tool", "compressor", "recoverable", "lost"}``."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for probe in probes:
        if probe.hidden:
            row = counts.setdefault((probe.tool, probe.compressor), {"recoverable": 0, "lost": 0})
            row[probe.status] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1]["lost"], -kv[1]["recoverable"], kv[0]))
    return [{"tool": tool, "compressor": name, **row} for (tool, name), row in ranked]


def transcript_files(target: Path) -> list[Path]:
    if not target.is_dir():
        return [target]
    found = sorted(p for p in target.glob("*.json") if p.name != "manifest.json")
    if not found:
        raise NotATranscript(f"{target}: no transcripts (*.json files) in this directory")
    return found


def progress(items: list[T], label: Callable[[T], str]) -> Iterator[T]:
    """The items, with a progress bar on stderr when it is a terminal."""
    show = sys.stderr.isatty()
    for done, item in enumerate(items):
        if show:
            width = 30
            filled = width * done // len(items)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{len(items)} "
                f"{label(item)[:40]:<40}"
            )
            sys.stderr.flush()
        yield item
    if show:
        sys.stderr.write("\r" + " " * 80 + "\r")


def run_replay(target: Path, settings: Settings, dialect: str = "chat") -> list[TranscriptReport]:
    counter = TokenCounter()
    return [
        replay_transcript(path, settings, counter, dialect)
        for path in progress(transcript_files(target), lambda path: path.name)
    ]


def _pct(value: float) -> str:
    return f"{value * 100:5.1f}%"


def format_text(reports: list[TranscriptReport]) -> str:
    header = (
        f"{'transcript':<32} {'reqs':>4} {'tokens':>9} {'proxied':>9} {'summed':>7} "
        f"{'final':>7} {'anthr.':>7} {'openai':>7} {'$ saved':>9} {'breaks':>6} "
        f"{'probes v/r/l':>13} {'pair':>4} {'ms p50':>7}"
    )
    dialects = sorted({r.dialect for r in reports}) or ["chat"]
    lines = [f"dialect: {', '.join(dialects)}", header, "-" * len(header)]
    for name, totals in [(r.name, r.totals()) for r in reports] + [("TOTAL", summarize(reports))]:
        if name == "TOTAL":
            lines.append("-" * len(header))
        probes = (
            f"{totals['probes_visible']}/{totals['probes_recoverable']}/{totals['probes_lost']}"
        )
        lines.append(
            f"{name[:32]:<32} {totals['requests']:>4} {totals['tokens_original']:>9,} "
            f"{totals['tokens_proxied']:>9,} {_pct(totals['reduction_summed']):>7} "
            f"{_pct(totals['reduction_final']):>7} {_pct(totals['savings_anthropic']):>7} "
            f"{_pct(totals['savings_openai']):>7} {_saved(totals):>9} "
            f"{totals['prefix_breaks']:>6} {probes:>13} "
            f"{totals['pairing_errors']:>4} {totals['ms_p50']:>7.2f}"
        )
    total = summarize(reports)
    lines += money_lines(reports, total)
    if total["probes"]:
        lines.append(
            f"probes: {total['probes_visible']} visible "
            f"({total['probes_visible'] / total['probes'] * 100:.1f}%), "
            f"{total['probes_recoverable']} recoverable, {total['probes_lost']} lost"
        )
    if total["prefix_break_locations"]:
        lines.append("prefix breaks (transcript, request, first changed message, event):")
        for name, request, message, event in total["prefix_break_locations"]:
            lines.append(f"  {name} request {request}: message {message} ({event or 'no event'})")
    if total["lost_probes"]:
        lines.append("lost probes: " + ", ".join(f"{p!r}@{r}" for p, r in total["lost_probes"]))
    hidden = [(r.name, r.totals()["hidden_probes"]) for r in reports]
    if any(rows for _, rows in hidden):
        lines.append("hidden probes by source tool -> compressor (recoverable/lost):")
        for name, rows in hidden:
            if rows:
                lines.append(f"  {name}: " + ", ".join(_hidden_cell(row) for row in rows))
        lines.append("  TOTAL: " + ", ".join(_hidden_cell(row) for row in total["hidden_probes"]))
    return "\n".join(lines)


def usd(value: float) -> str:
    """Dollars, to the cent from one dollar on, to a hundredth of a cent below."""
    text = f"${abs(value):,.2f}" if abs(value) >= 1 else f"${abs(value):.4f}"
    return "-" + text if value < 0 else text


def _saved(totals: dict[str, Any]) -> str:
    return usd(totals["money_saved"]) if totals["priced_requests"] else "-"


def money_lines(reports: list[TranscriptReport], total: dict[str, Any]) -> list[str]:
    """What the transcripts' models cost at list price, and which have no price."""
    lines = []
    if total["priced_requests"]:
        lines.append(
            f"at list prices: {usd(total['money_saved'])} saved of "
            f"{usd(total['money_original'])} input ({_pct(total['savings_money']).strip()}) "
            f"over {total['priced_requests']} requests of "
            + ", ".join(sorted({f"{r.model} ({r.price.pattern})" for r in reports if r.price}))
        )
    unpriced = sorted({r.model or "no model named" for r in reports if not r.price})
    if unpriced:
        lines.append(
            "no price (token units only, the anthr./openai columns): " + ", ".join(unpriced)
        )
    return lines


def _hidden_cell(row: dict[str, Any]) -> str:
    return f"{row['tool'] or '?'} -> {row['compressor'] or '?'} {row['recoverable']}/{row['lost']}"


def format_json(reports: list[TranscriptReport]) -> bytes:
    return orjson.dumps(
        {
            "dialect": ", ".join(sorted({r.dialect for r in reports})) or "chat",
            "total": summarize(reports),
            "transcripts": [
                {
                    "name": r.name,
                    "dialect": r.dialect,
                    "model": r.model,
                    "price": r.price.as_dict() if r.price else None,
                    "totals": r.totals(),
                    "requests": [asdict(x) for x in r.requests],
                    "probes": [asdict(p) for p in r.probes],
                }
                for r in reports
            ],
        },
        option=orjson.OPT_INDENT_2,
    )
