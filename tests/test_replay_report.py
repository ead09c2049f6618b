"""``deepmem replay --html``: the self-contained HTML report (proxy/replay_report.py).

Synthetic transcripts in the corpus format are replayed through ``proxy.cli.main``; the
report is parsed back (``html.parser`` for the page, ``xml.etree`` for each SVG chart) and
its figures compared with what ``--json`` prints for the same replay.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from tests.conftest import ROOT

HOSTILE_PROBE = '<script>alert("x")</script></code></td>&amp; ]]> \x1b[31m'
HOSTILE_NAME = "evil<i>&\"'name"
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}
SVG_NS = "{http://www.w3.org/2000/svg}"


def _log(lines: int, needle: str) -> str:
    rows = [
        f"2024-01-01 12:00:{n % 60:02d} INFO worker {n} processed batch {n * 7}"
        for n in range(lines)
    ]
    rows[lines // 2] = f"2024-01-01 12:00:00 ERROR {needle}"
    return "\n".join(rows)


def _source(functions: int) -> str:
    return "\n".join(
        f"def compute_total_{n}(items):\n    return sum(item.price * {n} for item in items)\n"
        for n in range(functions)
    )


def _call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


def hostile_transcript() -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "The nightly job fails; find out why."},
        {
            "role": "assistant",
            "content": "Reading the log.",
            "tool_calls": [_call("c1", "cat log")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": _log(400, HOSTILE_PROBE)},
        {
            "role": "assistant",
            "content": f"The log says {HOSTILE_PROBE}. Reading the code.",
            "tool_calls": [_call("c2", "cat totals.py")],
        },
        {"role": "tool", "tool_call_id": "c2", "content": _source(80)},
        {
            "role": "assistant",
            "content": "compute_total_41 is wrong; running the tests.",
            "tool_calls": [_call("c3", "pytest -q")],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "3 passed"},
        {
            "role": "assistant",
            "content": "Fixed compute_total_41; worker 123 processed batch 861 was fine.",
        },
    ]
    return {
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "probes": [
            {"probe": HOSTILE_PROBE, "referencing_turn_index": 4},
            {"probe": "compute_total_41", "referencing_turn_index": 6},
            {"probe": "compute_total_41", "referencing_turn_index": 8},
            {"probe": "worker 123 processed batch 861", "referencing_turn_index": 8},
        ],
    }


def plain_transcript() -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "", "tool_calls": [_call("p1", "ls")]},
            {"role": "tool", "tool_call_id": "p1", "content": "README.md\nsetup.py"},
            {"role": "assistant", "content": "There is a setup.py."},
        ],
        "probes": [{"probe": "setup.py", "referencing_turn_index": 3}],
    }


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / f"{HOSTILE_NAME}.json").write_text(json.dumps(hostile_transcript()))
    (folder / "plain.json").write_text(json.dumps(plain_transcript()))
    return folder


class Page(HTMLParser):
    """Checks that tags nest, and collects what the tests read back."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.section: str | None = None
        self.figures: dict[str | None, list[tuple[str, str]]] = {}  # section -> (key, value)
        self.summary: dict[str, list[tuple[str, str]]] = {}  # row transcript -> figures
        self.probes: dict[str | None, list[list[str]]] = {}
        self._row: str | None = None
        self._probe: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "section":
            self.section = a.get("data-name")
        if tag == "tr" and self.section is None and "data-transcript" in a:
            self._row = a["data-transcript"]
            self.summary[self._row or ""] = []
        if tag == "tr" and "probe" in (a.get("class") or "").split():
            self._probe = []
        if tag == "td" and self._probe is not None:
            self._cell = []
        if tag == "td" and a.get("data-key"):
            pair = (a["data-key"] or "", a.get("data-value") or "")
            if self.section is None and self._row is not None:
                self.summary[self._row].append(pair)
            elif self.section is not None:
                self.figures.setdefault(self.section, []).append(pair)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "section":
            self.section = None
        if tag == "tr":
            self._row = None
            if self._probe is not None:
                self.probes.setdefault(self.section, []).append(self._probe)
                self._probe = None
        if tag == "td" and self._cell is not None and self._probe is not None:
            self._probe.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(document: str) -> Page:
    page = Page()
    page.feed(document)
    page.close()
    assert page.errors == []
    assert page.stack == []
    return page


def visible_form(text: str) -> str:
    """How the report shows a string: control characters as their control pictures."""
    return "".join(chr(0x2400 + ord(c)) if ord(c) < 32 and c not in "\t\n\r" else c for c in text)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_figures(pairs: list[tuple[str, str]], expected: dict[str, Any]) -> None:
    assert pairs
    keys = {key for key, _ in pairs}
    assert {"reduction_summed", "reduction_final", "savings_anthropic", "savings_openai"} <= keys
    assert {"cost_anthropic_original", "cost_openai_proxied", "probes_lost"} <= keys
    assert {"prefix_breaks", "pairing_errors", "tokens_original", "tokens_proxied"} <= keys
    for key, value in pairs:
        assert float(value) == pytest.approx(expected[key], rel=0, abs=0), key


def test_html_report_matches_json(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    data_dir = tmp_path / "data"
    code, stdout, stderr = run(
        ["replay", str(corpus), "--json", "--html", str(out), "--data-dir", str(data_dir)], capsys
    )
    assert code == 0
    result = json.loads(stdout)  # stdout stays pure JSON; the note goes to stderr
    assert f"HTML report written to {out}" in stderr
    document = out.read_text(encoding="utf-8")
    page = parse(document)
    transcripts = {t["name"]: t for t in result["transcripts"]}
    assert set(transcripts) == {HOSTILE_NAME, "plain"}
    hostile = transcripts[HOSTILE_NAME]
    assert len(hostile["requests"]) == 4  # k = 2, 4, 6, 8
    assert hostile["totals"]["tokens_proxied"] < hostile["totals"]["tokens_original"]

    # self-contained, no script
    tags = {tag for tag, _ in page.tags}
    assert not tags & {"script", "link", "img", "iframe", "object", "embed"}
    for _, attributes in page.tags:
        assert "src" not in attributes
        assert (attributes.get("href") or "#").startswith("#")
    assert "url(" not in document and "@import" not in document
    assert "<script" not in document.lower()

    # one chart per transcript, one point per request and series, well-formed SVG
    charts = re.findall(r"<svg\b.*?</svg>", document, re.S)
    assert len(charts) == len(result["transcripts"])
    for chart, transcript in zip(charts, result["transcripts"], strict=True):
        root = ET.fromstring(chart)
        assert root.tag == SVG_NS + "svg"
        assert transcript["name"] in (root.findtext(SVG_NS + "title") or "")
        requests = transcript["requests"]
        expected = {
            "original": [r["tokens_original"] for r in requests],
            "proxied": [r["tokens_proxied"] for r in requests],
            "cache-read": [r["cached_proxied"] for r in requests],
            "cache-write": [r["tokens_proxied"] - r["cached_proxied"] for r in requests],
        }
        for series, values in expected.items():
            points = [e for e in root.iter() if series in (e.get("class") or "").split()[1:]]
            assert [int(p.get("data-tokens") or -1) for p in points] == values, series
            assert [int(p.get("data-request") or -1) for p in points] == [
                r["index"] for r in requests
            ]
        breaks = [e for e in root.iter() if e.get("class") == "prefix-break"]
        assert len(breaks) == transcript["totals"]["prefix_breaks"]
        texts = " ".join(e.text or "" for e in root.iter(SVG_NS + "text"))
        assert "request k" in texts and "tokens" in texts  # axis labels
        legend = [e for e in root.iter(SVG_NS + "g") if e.get("class") == "legend"]
        assert legend and "cache write (proxied)" in "".join(legend[0].itertext())

    # the probe table: the string, the referencing request, the status
    for name, transcript in transcripts.items():
        rows = page.probes[name]
        assert [(row[1], int(row[2]), row[3].split()[-1]) for row in rows] == [
            (visible_form(p["probe"]), p["request"], p["status"]) for p in transcript["probes"]
        ]

    # totals: per transcript and the summary table, exactly the --json figures
    for name, transcript in transcripts.items():
        check_figures(page.figures[name], transcript["totals"])
        check_figures(page.summary[name], transcript["totals"])
    check_figures(page.summary["TOTAL"], result["total"])
    assert result["total"]["probes"] == 5
    statuses = [p["status"] for p in hostile["probes"]]
    assert statuses == ["visible", "visible", "visible", "recoverable"]

    # every transcript string is escaped: the hostile name and probe come back as text
    assert HOSTILE_NAME not in document
    assert "<i>" not in document
    assert "]]>" not in document
    assert "\x1b" not in document
    assert visible_form(HOSTILE_PROBE) in [row[1] for row in page.probes[HOSTILE_NAME]]


def test_text_table_still_printed(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    argv = ["replay", str(corpus / "plain.json"), "--html", str(out)]
    code, stdout, _ = run([*argv, "--data-dir", str(tmp_path / "data")], capsys)
    assert code == 0
    assert stdout.splitlines()[0] == "dialect: chat"
    assert stdout.splitlines()[1].startswith("transcript")
    assert "TOTAL" in stdout
    assert stdout.rstrip().endswith(f"HTML report written to {out} ({out.stat().st_size:,} bytes)")
    page = parse(out.read_text(encoding="utf-8"))
    assert list(page.probes) == ["plain"]


def test_html_into_missing_directory(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "missing" / "report.html"
    argv = ["replay", str(corpus), "--html", str(out), "--data-dir", str(tmp_path / "data")]
    code, stdout, stderr = run(argv, capsys)
    assert code == 2
    assert stdout == ""
    assert "cannot write" in stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"messages": 5}', "expected an object with a 'messages' list"),
        (b"[1, 2]", "expected an object with a 'messages' list"),
        (b"not json at all", "not JSON"),
        (b'{"messages": [1]}', "every entry of 'messages' must be an object"),
        (b'{"messages": [], "tools": 3}', "'tools' must be a list"),
        (b'{"messages": [], "probes": [{"probe": "x"}]}', "'probes' must be a list"),
        (
            (ROOT / "fixtures/opencode/opencode-1.18.33-openai-compatible-title.json").read_bytes(),
            "an OpenCode request capture",
        ),
    ],
)
def test_replay_refuses_what_is_not_a_transcript(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    """Were tracebacks (TypeError, JSONDecodeError, KeyError: 'messages')."""
    target = tmp_path / "input.json"
    target.write_bytes(content)
    for argv in (["replay", str(target)], ["replay", str(tmp_path), "--json"]):
        code, stdout, stderr = run([*argv, "--data-dir", str(tmp_path / "data")], capsys)
        assert code == 2
        assert stdout == ""
        assert stderr.startswith(f"deepmem: replay: {target}: ") and message in stderr
        assert "Traceback" not in stderr


def test_replay_of_a_directory_without_transcripts_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was an empty table and exit 0."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text("{}")
    code, stdout, stderr = run(["replay", str(empty), "--data-dir", str(tmp_path / "d")], capsys)
    assert code == 2 and stdout == ""
    assert stderr == f"deepmem: replay: {empty}: no transcripts (*.json files) in this directory\n"


def test_tool_calls_of_an_odd_shape_do_not_stop_a_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "tool_calls": 5},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "done"},
        ]
    }
    target = tmp_path / "odd.json"
    target.write_text(json.dumps(odd))
    code, stdout, stderr = run(
        ["replay", str(target), "--json", "--data-dir", str(tmp_path)], capsys
    )
    assert code == 0, stderr
    assert json.loads(stdout)["total"]["requests"] == 2


def test_a_transcript_of_a_priced_model_is_costed_in_dollars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "priced"
    folder.mkdir()
    (folder / "sonnet.json").write_text(
        json.dumps({**hostile_transcript(), "model": "anthropic/claude-sonnet-4-5-20250929"})
    )
    (folder / "unknown.json").write_text(json.dumps({**plain_transcript(), "model": "mystery-7b"}))
    out = tmp_path / "report.html"
    argv = ["replay", str(folder), "--json", "--html", str(out), "--data-dir", str(tmp_path / "d")]
    code, stdout, _ = run(argv, capsys)
    assert code == 0
    result = json.loads(stdout)
    sonnet, unknown = result["transcripts"]
    assert sonnet["price"]["pattern"] == "claude-sonnet-4*" and unknown["price"] is None
    # Sonnet costs $0.30 per million cached input tokens and $3.75 written: three dollars
    # per million Anthropic-like units, request by request
    figures = sonnet["totals"]
    assert figures["priced_requests"] == len(sonnet["requests"]) > 0
    assert figures["money_original"] == pytest.approx(figures["cost_anthropic_original"] * 3e-6)
    assert figures["money_saved"] == pytest.approx(
        (figures["cost_anthropic_original"] - figures["cost_anthropic_proxied"]) * 3e-6
    )
    assert figures["money_saved"] > 0
    assert unknown["totals"]["priced_requests"] == 0 and unknown["totals"]["money_saved"] == 0
    total = result["total"]
    assert total["money_saved"] == figures["money_saved"]
    assert total["unpriced_requests"] == len(unknown["requests"])

    page = parse(out.read_text(encoding="utf-8"))
    check_figures(page.summary["sonnet"], figures)
    check_figures(page.figures["sonnet"], figures)
    check_figures(page.summary["TOTAL"], total)
    assert "money_original" in dict(page.summary["sonnet"])
    assert "money_original" not in dict(page.summary["unknown"])  # a dash: no price
    assert "no price (token units only" in out.read_text(encoding="utf-8")

    code, text, _ = run(["replay", str(folder), "--data-dir", str(tmp_path / "d")], capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in text.splitlines()[2:] if line[:1].isalpha()}
    assert rows["sonnet"].split()[8].startswith("$")
    assert rows["unknown"].split()[8] == "-"
    assert "no price (token units only, the anthr./openai columns): mystery-7b" in text
