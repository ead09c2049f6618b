"""Replay recorded transcripts through the proxy's own pipeline and measure (DESIGN.md §7).

A transcript (corpus format: OpenAI chat ``messages``, optional ``tools`` and ``probes``) is
replayed as one request per assistant message k, ``messages[:k]``, through the same rewrite
hook, session memo and CCR store the proxy uses. Per request and in total it reports context
reduction, prompt-cache cost (Anthropic-like and OpenAI-like), prefix breaks, probe
retention (visible, recoverable through a marker, lost), tool-call pairing errors and time.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from compressors.markers import marker_keys
from compressors.tokens import TokenCounter
from compressors.view import Dialect, parse_conversation
from proxy.compression import REPORT
from proxy.config import Settings
from proxy.costs import ANTHROPIC, OPENAI, common_prefix_length
from proxy.pipeline import rewrite_request
from proxy.stages import build_transforms, open_stores


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


@dataclass
class TranscriptReport:
    name: str
    requests: list[RequestMetrics] = field(default_factory=list)
    probes: list[ProbeResult] = field(default_factory=list)
    pairing_errors: int = 0

    def totals(self) -> dict[str, Any]:
        return summarize([self])


def _first_changed_message(previous: list[bytes], current: list[bytes]) -> int | None:
    for index, (old, new) in enumerate(zip(previous, current, strict=False)):
        if old != new:
            return index
    return None


def _pairing(messages: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    calls = {
        str(call.get("id"))
        for message in messages
        if message.get("role") == "assistant"
        for call in _list(message.get("tool_calls"))
        if isinstance(call, dict)
    }
    results = {str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool"}
    return calls, results


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _searchable(messages: list[dict[str, Any]]) -> str:
    conversation = parse_conversation(Dialect.OPENAI_CHAT, {"messages": messages})
    return "\n".join(item.text for item in conversation.items)


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
    return data


def replay_transcript(path: Path, settings: Settings, counter: TokenCounter) -> TranscriptReport:
    data = load_transcript(path)
    messages: list[dict[str, Any]] = data["messages"]
    tools = data.get("tools") or []
    stores = open_stores(settings, in_memory=True)
    transforms = build_transforms(settings, stores)
    report = TranscriptReport(path.stem)
    headers = {"x-session-id": f"replay-{path.stem}"}
    probes_by_request: dict[int, list[str]] = {}
    for probe in data.get("probes") or ():
        probes_by_request.setdefault(int(probe["referencing_turn_index"]), []).append(
            probe["probe"]
        )

    previous: tuple[bytes, bytes, list[bytes]] | None = None
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or k == 0:
            continue
        original_messages = messages[:k]
        body: dict[str, Any] = {"model": "replay", "messages": copy.deepcopy(original_messages)}
        if tools:
            body["tools"] = tools
        raw = orjson.dumps(body)
        started = time.perf_counter()
        rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, transforms)
        elapsed = (time.perf_counter() - started) * 1000
        proxied_messages = orjson.loads(rewrite.body)["messages"]
        compression = rewrite.context.reports.get(REPORT) if rewrite.context else None

        original_bytes = orjson.dumps(original_messages)
        proxied_bytes = orjson.dumps(proxied_messages)
        per_message = [orjson.dumps(m) for m in proxied_messages]
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
                event=compression.event if compression else None,
                milliseconds=elapsed,
            )
        )

        calls, results = _pairing(original_messages)
        proxied_calls, proxied_results = _pairing(proxied_messages)
        report.pairing_errors += len((calls & results) - (proxied_calls & proxied_results))

        wanted = probes_by_request.get(k)
        if wanted:
            visible = _searchable(proxied_messages)
            reachable = "\n".join(
                (stores.originals.get(key) or b"").decode("utf-8", "surrogatepass")
                for key in marker_keys(visible)
            )
            for probe in wanted:
                status = (
                    "visible"
                    if probe in visible
                    else "recoverable"
                    if probe in reachable
                    else "lost"
                )
                report.probes.append(ProbeResult(probe, k, status))
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
        "pairing_errors": sum(report.pairing_errors for report in reports),
        "ms_p50": times[len(times) // 2] if times else 0.0,
        "ms_max": times[-1] if times else 0.0,
    }


def transcript_files(target: Path) -> list[Path]:
    if not target.is_dir():
        return [target]
    found = sorted(p for p in target.glob("*.json") if p.name != "manifest.json")
    if not found:
        raise NotATranscript(f"{target}: no transcripts (*.json files) in this directory")
    return found


def _progress(paths: list[Path]) -> Iterator[Path]:
    show = sys.stderr.isatty()
    for done, path in enumerate(paths):
        if show:
            width = 30
            filled = width * done // len(paths)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{len(paths)} "
                f"{path.name[:40]:<40}"
            )
            sys.stderr.flush()
        yield path
    if show:
        sys.stderr.write("\r" + " " * 80 + "\r")


def run_replay(target: Path, settings: Settings) -> list[TranscriptReport]:
    counter = TokenCounter()
    return [
        replay_transcript(path, settings, counter) for path in _progress(transcript_files(target))
    ]


def _pct(value: float) -> str:
    return f"{value * 100:5.1f}%"


def format_text(reports: list[TranscriptReport]) -> str:
    header = (
        f"{'transcript':<32} {'reqs':>4} {'tokens':>9} {'proxied':>9} {'summed':>7} "
        f"{'final':>7} {'anthr.':>7} {'openai':>7} {'breaks':>6} {'probes v/r/l':>13} "
        f"{'pair':>4} {'ms p50':>7}"
    )
    lines = [header, "-" * len(header)]
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
            f"{_pct(totals['savings_openai']):>7} {totals['prefix_breaks']:>6} {probes:>13} "
            f"{totals['pairing_errors']:>4} {totals['ms_p50']:>7.2f}"
        )
    total = summarize(reports)
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
    return "\n".join(lines)


def format_json(reports: list[TranscriptReport]) -> bytes:
    return orjson.dumps(
        {
            "total": summarize(reports),
            "transcripts": [
                {
                    "name": r.name,
                    "totals": r.totals(),
                    "requests": [asdict(x) for x in r.requests],
                    "probes": [asdict(p) for p in r.probes],
                }
                for r in reports
            ],
        },
        option=orjson.OPT_INDENT_2,
    )
