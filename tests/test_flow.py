"""The request path's flow, addons and reports: the order, the project identified once, and
each report adding its own figures."""

from __future__ import annotations

from pathlib import Path

from compressors.pipeline import CompressionResult
from compressors.tokens import estimate_tokens
from compressors.view import Dialect
from compressors.wire import parse_conversation
from proxy.addons import build_addons
from proxy.compaction import CompactionReport, CompactionStage
from proxy.compression import CompressionReport, CompressionStage
from proxy.config import load_settings
from proxy.flow import Flow
from proxy.memory_api import memory_service
from proxy.memory_stage import MemoryReport, MemoryStage
from proxy.pipeline import rewrite_request
from proxy.projects import IdentifyProject, ProjectResolver
from proxy.sessions import RequestKind, Tally
from proxy.stores import open_stores


def test_the_list_identifies_the_project_first_and_relay_mode_drops_the_rewriters(
    tmp_path: Path,
) -> None:
    settings = load_settings({"data_dir": str(tmp_path / "data")}, environ={})
    stores = open_stores(settings, in_memory=True)
    memory = memory_service(settings)
    kinds = [type(a) for a in build_addons(settings, stores, memory)]
    assert kinds == [IdentifyProject, CompactionStage, CompressionStage, MemoryStage]
    assert [type(a) for a in build_addons(settings, stores)] == [CompressionStage]
    relay = load_settings({"data_dir": str(tmp_path / "data"), "compress": "false"}, environ={})
    kinds = [type(a) for a in build_addons(relay, stores, memory)]
    assert CompressionStage not in kinds and kinds[0] is IdentifyProject


def test_the_project_is_identified_for_agent_and_compaction_requests_only(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    identify = IdentifyProject(ProjectResolver(None, (tmp_path,)))
    body = {
        "messages": [
            {"role": "system", "content": f"Working directory: {project}"},
            {"role": "user", "content": "hi"},
        ]
    }
    conversation = parse_conversation(Dialect.OPENAI_CHAT, body)
    for kind, expected in [
        (RequestKind.AGENT, project),
        (RequestKind.COMPACTION, project),
        (RequestKind.TITLE, None),
    ]:
        flow = Flow(Dialect.OPENAI_CHAT, "ses", kind)
        assert identify.request(conversation, flow) is False
        found = flow.project.path if flow.project is not None else None
        assert found == expected, kind


def test_each_report_adds_its_own_figures() -> None:
    compression = CompressionResult(tokens_before=900, tokens_after=300, event="turn")
    compression.counters.update({"compressed:search": 2, "reasoning_dropped": 5})
    memory = MemoryReport(None, "", new_turn=True, hits=3, captured=True, nudges=("memory",))
    memory.inject(0, "remembered " * 20, False)
    memory.inject(3, "recalled " * 20, True)
    memory.resumed = "resume:2026-11-24T05:00"
    flow = Flow(Dialect.ANTHROPIC, "ses", RequestKind.AGENT)
    flow.reports += [CompressionReport(compression), memory, CompactionReport(None, Path(), 0, "")]
    tally = Tally()
    flow.account(tally)
    assert (tally.tool_output_tokens_before, tally.tool_output_tokens_after) == (900, 300)
    assert (tally.outputs_compressed, tally.compression_events) == (2, 1)
    # the resume is not a nudge (it used to be told apart by a ":" in its tag)
    assert (tally.memory_turns, tally.memory_hits, tally.memory_nudges) == (1, 3, 1)
    injected = estimate_tokens("remembered " * 20) + estimate_tokens("recalled " * 20)
    assert (tally.memory_captures, tally.tokens_injected, tally.checkpoints) == (1, injected, 0)
    assert flow.report(MemoryReport) is memory and flow.report(int) is None


def test_the_rewrite_carries_its_flow_with_the_reports() -> None:
    class Count:
        def request(self, conversation, flow):  # type: ignore[no-untyped-def]
            flow.reports.append(CompactionReport(None, Path(), len(conversation.items), "x"))
            return False

    raw = b'{"messages":[{"role":"user","content":"a"}]}'
    rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, {}, [Count(), Count()])
    assert rewrite.body is raw and rewrite.flow is not None
    assert [r.messages for r in rewrite.flow.reports] == [1, 1]  # type: ignore[attr-defined]


async def test_deferred_work_runs_after_the_answer_and_a_failure_is_only_logged(
    start_proxy, upstream, client
) -> None:
    import asyncio

    from tests.addons import Hook

    seen: list[int] = []

    def late() -> None:
        seen.append(len(upstream.requests))  # what the upstream had been sent by then

    def broken() -> None:
        raise RuntimeError("a cache warmer's bug")

    def defer(conversation, flow) -> bool:
        flow.defer(broken)
        flow.defer(late)
        return False

    proxy = await start_proxy([Hook(defer)], upstream=[f"{upstream.url}/v1"])
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}'
    for _ in range(2):
        async with client.post(
            proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": "ses_d"}
        ) as response:
            assert response.status == 200
            await response.read()
        for _ in range(100):
            if len(seen) == len(upstream.requests):
                break
            await asyncio.sleep(0.01)
    assert seen == [1, 2]  # each request's work ran after it was forwarded, the failure aside
