"""``deepmem replay --opencode`` on the database the real OpenCode CLI wrote.

The harness (``harness.py``) runs OpenCode offline against the fake LLM through deepmem with
the built-in ``anthropic`` provider (model ``claude-sonnet-4-5``): a session that reads a
file, runs a build script twice, expands a marker and answers, then continues, overflows
and compacts. OpenCode keeps that session in its own ``opencode.db``; replaying it must find
the session, rebuild its tool calls, send it as Anthropic Messages and price it in dollars.

Needs npm, like ``test_opencode.py`` (``DEEPMEM_E2E=skip`` skips it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.replay_opencode import COMPACTION_TEXT, load_sessions
from tests.e2e import harness
from tests.e2e.test_opencode import opencode_binary  # noqa: F401 (a fixture)


@pytest.mark.slow
def test_replay_of_a_real_opencode_database(
    opencode_binary: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = harness.run_scenario("anthropic", opencode_binary, tmp_path / "run")
    assert [run["returncode"] for run in result["runs"]] == [0, 0], result["runs"]
    database = Path(result["home"]) / ".local" / "share" / "opencode" / "opencode.db"
    assert database.is_file()

    # The session as replay rebuilds it: the tool calls with their outputs, then the part
    # after the compaction as a transcript of its own.
    transcripts = load_sessions(database)
    assert {t.dialect for t in transcripts} == {"anthropic"}
    assert {t.model for t in transcripts} == {"anthropic/claude-sonnet-4-5"}
    first = transcripts[0]
    assert {"read", "bash"} <= set(first.tools)
    calls = {
        call["id"]: call["function"]["name"]
        for message in first.messages
        for call in message.get("tool_calls", ())
    }
    outputs = {m["tool_call_id"]: m["content"] for m in first.messages if m["role"] == "tool"}
    assert set(calls) == set(outputs)  # every call answered
    bash_outputs = [outputs[i] for i, name in calls.items() if name == "bash"]
    assert any("test_threshold_for_warehouse_07 FAILED" in out for out in bash_outputs)
    read_outputs = [outputs[i] for i, name in calls.items() if name == "read"]
    assert any("class Warehouse07" in out for out in read_outputs)
    assert any(
        t.messages[:1] == [{"role": "user", "content": COMPACTION_TEXT}] for t in transcripts
    )

    html = tmp_path / "replay.html"
    argv = ["replay", "--opencode", str(database), "--json", "--html", str(html)]
    code = main([*argv, "--data-dir", str(tmp_path / "replay-data")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    names = [t["name"] for t in report["transcripts"]]
    assert names == [t.name for t in transcripts] and len(names) >= 2
    total = report["total"]
    assert total["requests"] >= 5  # one per assistant step OpenCode stored
    assert total["pairing_errors"] == 0
    assert total["tokens_proxied"] < total["tokens_original"]  # the long outputs compressed
    for key in ("savings_anthropic", "savings_openai", "money_original", "money_saved"):
        assert key in total
    assert total["priced_requests"] == total["requests"]  # sonnet has a list price
    assert total["models"] == ["anthropic/claude-sonnet-4-5"]
    assert {t["dialect"] for t in report["transcripts"]} == {"anthropic"}
    assert {t["price"]["pattern"] for t in report["transcripts"]} == {"claude-sonnet-4*"}
    page = html.read_text(encoding="utf-8")
    assert "cost at list price" in page
    for name in names:
        assert f'data-transcript="{name}"' in page
    assert page.count("data-dialect='anthropic'") == len(names)
    print(
        f"\nreplay --opencode: {len(names)} transcripts, {total['requests']} requests, "
        f"reduction {total['reduction_summed']:.1%}, saved ${total['money_saved']:.4f} of "
        f"${total['money_original']:.4f} ({total['savings_money']:.1%})"
    )
