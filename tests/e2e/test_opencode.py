"""The real OpenCode CLI (npm ``opencode-ai``, pinned) talking to a scripted LLM through deepmem.

For each of the three provider setups (a custom ``@ai-sdk/openai-compatible`` provider, the
built-in ``anthropic`` and ``openai`` providers, each pointed at deepmem by ``baseURL``, with
deepmem also mounted as a remote MCP server) OpenCode runs a real session in a scratch git
repository (``harness.py``, driven by ``fake_llm.py``): read a 675-line file, run a script
that prints a long log twice, expand a ``[deep-memory: …]`` marker with deepmem's MCP tool,
answer; then ``opencode run -c`` overflows the context, compacts and answers again.

The verdict comes from what the fake LLM received, what OpenCode printed and what deepmem
left on disk and reports. The key figures of each provider are printed (``pytest -s``) and
written as JSON under pytest's temporary directory.

Needs npm to install ``opencode-ai`` once into ``$XDG_CACHE_HOME/deepmem-e2e`` (or
``~/.cache/deepmem-e2e``); without npm the test fails, unless ``DEEPMEM_E2E=skip`` is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import harness
from tests.e2e.fake_llm import (
    FINAL1,
    FINAL2,
    SUMMARY_TAG,
    TURN1_TAG,
    Entry,
    markers_in,
    parse_entries,
    tool_names,
)

MCP_TOOLS = (
    "deepmem_deep_expand",
    "deepmem_memory_search",
    "deepmem_memory_store",
    "deepmem_memory_forget",
)
EXPECTED_ACTIONS = ["read", "bash", "bash", "expand", "final", "overflow", "summary", "final"]


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    """OpenCode, installed with npm into the cache directory (reused when present)."""
    if os.environ.get("DEEPMEM_E2E") == "skip":
        pytest.skip("DEEPMEM_E2E=skip is set: the end-to-end test with the real OpenCode is off")
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            "the end-to-end test needs npm (Node.js) to install the real OpenCode CLI "
            f"(opencode-ai@{harness.OPENCODE_VERSION}) into {harness.cache_dir()}; install "
            "Node.js and npm, or set DEEPMEM_E2E=skip to skip this test",
            pytrace=False,
        )
    try:
        return harness.install_opencode(npm)
    except harness.E2EError as exc:
        pytest.fail(f"cannot install OpenCode: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def figures_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "deepmem-e2e-figures.json"


@dataclass(frozen=True, slots=True)
class Request:
    """One chat request as the fake LLM received it (after deepmem)."""

    seq: int
    api: str
    raw: bytes
    body: dict[str, Any]
    entries: list[Entry]
    tools: list[str]
    plan: dict[str, Any]
    session_id: str

    @property
    def action(self) -> str:
        return str(self.plan["action"])

    def results(self) -> dict[str, str]:
        return {e.call_id: e.text for e in self.entries if e.kind == "tool_result"}


def _header(headers: dict[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def _encoded(text: str) -> int:
    """Bytes of ``text`` as a JSON string (the way both OpenCode and deepmem write it)."""
    return len(json.dumps(text, ensure_ascii=False).encode())


def _events(stdout: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def _reasoning_before(entries: list[Entry], call_id: str) -> Entry | None:
    """The reasoning of the assistant message that made tool call ``call_id``."""
    index = next(
        (i for i, e in enumerate(entries) if e.kind == "tool_call" and e.call_id == call_id), None
    )
    if index is None:
        return None
    for entry in reversed(entries[:index]):
        if entry.kind == "reasoning":
            return entry
        if entry.kind in ("tool_result", "user"):
            return None
    return None


class Verdict:
    """Everything the test checks about one provider's run, and the figures it reports."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.problems: list[str] = []
        self.expand_ok = False
        self.requests = [
            Request(
                r["seq"],
                r["api"],
                r["raw"].encode(),
                body,
                parse_entries(r["api"], body),
                tool_names(r["api"], body),
                r["plan"],
                _header(r["headers"], "x-session-id"),
            )
            for r in result["records"]
            if r["api"] and r["plan"] and isinstance(body := json.loads(r["raw"]), dict)
        ]
        self.agent = [r for r in self.requests if r.plan["kind"] == "agent"]
        self.turn1 = [r for r in self.agent if r.plan["turn"] == TURN1_TAG]
        self.events = [e for run in result["runs"] for e in _events(run["stdout"])]
        # What each tool returned, as OpenCode itself reports it: the originals.
        self.outputs = {
            e["part"]["callID"]: e["part"]["state"]["output"]
            for e in self.events
            if e.get("type") == "tool_use"
            and e["part"].get("state", {}).get("status") == "completed"
            and isinstance(e["part"]["state"].get("output"), str)
        }
        session_ids = {r.session_id for r in self.requests}
        self.session_id = session_ids.pop() if len(session_ids) == 1 else ""
        self.stats = next(
            (s for s in result["stats"]["sessions"] if s["session_id"] == self.session_id), None
        )

    def check(self, ok: object, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return bool(ok)

    def restored_size(self, request: Request) -> int:
        """The request's size had every tool result been sent as the tool returned it."""
        size = len(request.raw)
        for call_id, text in request.results().items():
            original = self.outputs.get(call_id)
            if original is not None and original != text:
                size += _encoded(original) - _encoded(text)
        return size

    # ---- the checks

    def check_runs(self) -> None:
        runs = self.result["runs"]
        self.check(len(runs) == 2, f"expected two OpenCode runs, got {len(runs)}")
        for run, final in zip(runs, (FINAL1, FINAL2), strict=False):
            where = f"(stderr log: {run['stderr_log']})"
            self.check(
                run["returncode"] == 0 and not run["timed_out"],
                f"`opencode run{' -c' if run['continue'] else ''}` exited {run['returncode']}"
                f"{' after timing out' if run['timed_out'] else ''} {where}:\n"
                f"{run['stderr_tail'][-1500:]}",
            )
            self.check(final in run["stdout"], f"OpenCode did not print {final!r} {where}")
        actions = [r.action for r in self.requests if r.plan["kind"] != "title"]
        self.check(
            actions == EXPECTED_ACTIONS,
            f"the scripted session went {actions}, expected {EXPECTED_ACTIONS}",
        )
        self.check(self.session_id, "the requests do not carry one x-session-id")

    def check_mcp_tools(self) -> None:
        for request in self.agent:
            missing = [name for name in MCP_TOOLS if name not in request.tools]
            self.check(
                not missing,
                f"request {request.seq}: deepmem's MCP tools {missing} are not in OpenCode's tool "
                f"list {request.tools}",
            )

    def check_compression(self) -> None:
        if not self.check(len(self.turn1) == 5, "turn 1 did not take five requests"):
            return
        calls = {r.plan["call_id"]: r.action for r in self.turn1 if r.plan["tool"]}
        final = self.turn1[-1]
        for call_id, text in final.results().items():
            if calls.get(call_id) not in ("read", "bash"):
                continue
            original = self.outputs.get(call_id, "")
            keys = markers_in(text)
            self.check(
                keys and len(text) < len(original),
                f"the {calls[call_id]} result {call_id} is not compressed in the last request "
                f"of turn 1 ({len(text)} chars, the tool returned {len(original)})",
            )
            expanded = self.result["expanded"].get(keys[0]) if keys else None
            self.check(
                expanded == original,
                f"marker ccr:{keys[0] if keys else '?'} of {call_id} does not expand to what the "
                "tool returned",
            )
        later = self.agent[2:]  # from the request after the bash step on
        self.check(
            all(len(r.raw) < self.restored_size(r) for r in later),
            "a later request was not smaller than its tool results as the tools returned them: "
            + str([(r.seq, len(r.raw), self.restored_size(r)) for r in later]),
        )

    def check_expand(self) -> None:
        asking = next((r for r in self.turn1 if r.action == "expand"), None)
        if not self.check(asking is not None, "the fake LLM never found a marker to expand"):
            return
        key, call_id = asking.plan["expand_key"], asking.plan["call_id"]
        self.check(asking.plan["expand_from"] == "read", "the read's result carried no marker")
        read_call = next(r.plan["call_id"] for r in self.turn1 if r.action == "read")
        original = self.outputs.get(read_call, "")
        answer = next((r for r in self.turn1 if r.seq > asking.seq), None)
        came_back = answer.results().get(call_id) if answer else None
        self.check(
            came_back == original and original,
            f"the deep_expand result for ccr:{key} is not the original read output "
            f"({len(came_back or '')} chars, original {len(original)})",
        )
        source = (Path(self.result["repo"]) / self.result["read_file"]).read_text()
        lines = [f"{n}: {line}" for n, line in enumerate(source.splitlines(), 1)]
        missing = [line for line in lines if line not in (came_back or "")]
        self.check(
            not missing, f"{len(missing)} lines of the file did not come back, e.g. {missing[:2]}"
        )
        used = [
            e
            for e in self.events
            if e.get("type") == "tool_use" and e["part"].get("tool") == "deepmem_deep_expand"
        ]
        self.check(
            used and used[0]["part"]["state"].get("status") == "completed",
            "OpenCode did not report a completed deepmem_deep_expand tool call",
        )
        calls = re.search(
            r'^deepmem_mcp_tool_calls_total\{failed="false",tool="deep_expand"\} (\d+)',
            self.result["metrics"],
            re.MULTILINE,
        )
        counted = self.check(
            calls and int(calls[1]) >= 1, "deepmem counted no successful MCP deep_expand"
        )
        self.expand_ok = bool(came_back == original and original and used and counted)

    def check_reasoning(self) -> int:
        """The live turn's reasoning comes back unchanged on every later step of the turn."""
        checked = 0
        for index, request in enumerate(self.turn1):
            emitted, call_id = request.plan["reasoning"], request.plan["call_id"]
            if not (emitted and call_id):
                continue
            encoded = json.dumps(emitted["text"], ensure_ascii=False)[1:-1].encode()
            for later in self.turn1[index + 1 :]:
                found = _reasoning_before(later.entries, call_id)
                where = f"request {later.seq}, the reasoning of step {request.plan['step']}"
                if not self.check(found is not None, f"{where} is missing"):
                    continue
                self.check(found.text == emitted["text"], f"{where} changed: {found.text!r}")
                self.check(encoded in later.raw, f"{where}: its bytes are not in the body")
                for field in ("signature", "encrypted_content"):
                    if field in emitted:
                        self.check(
                            found.extra.get(field) == emitted[field], f"{where}: {field} changed"
                        )
                checked += 1
        return checked

    def check_compaction(self) -> None:
        compaction = [r for r in self.requests if r.plan["kind"] == "compaction"]
        if not self.check(compaction, "no compaction request reached the fake LLM"):
            return
        self.check(
            compaction[0].session_id == self.session_id,
            "the compaction request names another session",
        )
        after = [r for r in self.agent if r.seq > compaction[0].seq]
        self.check(
            after and SUMMARY_TAG in after[0].raw.decode(),
            "the request after the compaction does not carry the summary",
        )
        # The restarted history opens with OpenCode's "What did we do so far?"; deepmem adds
        # the checkpoint's essentials to it.
        self.check(
            any('kind="resume"' in e.text for r in after for e in r.entries),
            "no resume block reached the model after the compaction",
        )
        memory_dir = Path(self.result["repo"]) / ".deep-memory"
        checkpoint, raw = memory_dir / "checkpoint.md", memory_dir / "checkpoint.raw.json"
        if self.check(checkpoint.is_file(), f"{checkpoint} was not written"):
            first = checkpoint.read_text().splitlines()[0]
            self.check(
                first == f"# Checkpoint — {self.session_id}", f"{checkpoint} begins {first!r}"
            )
        if self.check(raw.is_file(), f"{raw} was not written"):
            saved = json.loads(raw.read_text())
            self.check(
                saved.get("sessionID") == self.session_id,
                f"{raw} names session {saved.get('sessionID')!r}, not {self.session_id!r}",
            )
            self.check(
                saved.get("messageCount", 0) > 0 and saved.get("messages"), f"{raw} is empty"
            )

    def check_stats(self) -> None:
        stats = self.stats
        if not self.check(stats, f"/stats has no session {self.session_id!r}"):
            return
        compression, memory = stats["compression"], stats["memory"]
        self.check(
            compression["tool_output_tokens_before"] > compression["tool_output_tokens_after"] > 0,
            f"/stats shows no tokens saved: {compression}",
        )
        self.check(compression["outputs_compressed"] >= 2, f"/stats: {compression}")
        self.check(stats["kinds"].get("compaction", 0) >= 1, f"/stats kinds: {stats['kinds']}")
        self.check(memory["checkpoints"] >= 1, f"/stats shows no checkpoint: {memory}")
        self.check(stats["fail_opens"] == 0, f"deepmem failed open {stats['fail_opens']} times")

    def run_all(self) -> dict[str, Any]:
        self.check_runs()
        self.check_mcp_tools()
        self.check_compression()
        self.check_expand()
        reasoning = self.check_reasoning()
        self.check_compaction()
        self.check_stats()
        return self.figures(reasoning)

    def figures(self, reasoning_checked: int) -> dict[str, Any]:
        sizes = [(len(r.raw), self.restored_size(r)) for r in self.agent]
        keys = {k for r in self.agent for text in r.results().values() for k in markers_in(text)}
        compaction = next((r for r in self.requests if r.plan["kind"] == "compaction"), None)
        after_compaction = [r for r in self.agent if compaction and r.seq > compaction.seq]
        stats = self.stats or {}
        compression = stats.get("compression", {})
        return {
            "provider": self.result["provider"],
            "isolated_network": self.result.get("isolated"),
            "run_seconds": [run["seconds"] for run in self.result["runs"]],
            "requests": len(self.requests),
            "actions": [r.action for r in self.requests],
            "largest_request_bytes": {
                "without_deepmem": max((b for _, b in sizes), default=0),
                "through_deepmem": max((a for a, _ in sizes), default=0),
            },
            "all_agent_request_bytes": {
                "without_deepmem": sum(b for _, b in sizes),
                "through_deepmem": sum(a for a, _ in sizes),
            },
            "markers_seen": len(keys),
            "expand_ok": self.expand_ok,
            "reasoning_checks": reasoning_checked,
            "compaction_transcript_markers": len(
                [k for e in (compaction.entries if compaction else []) for k in markers_in(e.text)]
            ),
            "resume_block_after_compaction": any(
                'kind="resume"' in e.text for r in after_compaction for e in r.entries
            ),
            "stats_tokens": {
                "before": compression.get("tool_output_tokens_before"),
                "after": compression.get("tool_output_tokens_after"),
            },
            "checkpoints": stats.get("memory", {}).get("checkpoints"),
            "session_id": self.session_id,
            "logs": self.result["logs"],
        }


def _report(figures: dict[str, Any], path: Path) -> None:
    everything = json.loads(path.read_text()) if path.exists() else {}
    everything[figures["provider"]] = figures
    path.write_text(json.dumps(everything, indent=2))
    size, total = figures["largest_request_bytes"], figures["all_agent_request_bytes"]
    tokens = figures["stats_tokens"]
    print(
        f"\n[deepmem e2e] {figures['provider']}: {figures['requests']} requests, "
        f"largest {size['without_deepmem']} → {size['through_deepmem']} bytes, "
        f"all agent requests {total['without_deepmem']} → {total['through_deepmem']} bytes, "
        f"{figures['markers_seen']} markers, expand ok: {figures['expand_ok']}, "
        f"reasoning checks: {figures['reasoning_checks']}, tool-output tokens "
        f"{tokens['before']} → {tokens['after']}, checkpoints: {figures['checkpoints']}, "
        f"runs {figures['run_seconds']} s, isolated: {figures['isolated_network']}"
        f"\n[deepmem e2e] figures: {path}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("provider", list(harness.PROVIDERS))
def test_opencode_session_through_deepmem(
    provider: str, opencode_binary: Path, tmp_path: Path, figures_file: Path
) -> None:
    try:
        result = harness.run_scenario(provider, opencode_binary, tmp_path / provider)
    except harness.E2EError as exc:
        pytest.fail(str(exc), pytrace=False)
    verdict = Verdict(result)
    figures = verdict.run_all()
    _report(figures, figures_file)
    assert not verdict.problems, (
        f"{provider}: {len(verdict.problems)} problem(s); logs in {result['logs']}\n- "
        + "\n- ".join(verdict.problems)
    )
