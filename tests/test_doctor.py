"""``deepmem doctor``: every problem it detects, on real loopback sockets and real files, and
where each setting's value came from."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.cli import main
from proxy.config import load_settings_with_sources
from proxy.doctor import (
    OK,
    PROBLEM,
    WARNING,
    Finding,
    Report,
    run_checks,
    setting_rows,
)
from tests.conftest import REDIS_PASSWORD, ProxyFactory
from tests.fake_upstream import FakeUpstream


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def local_flags(upstream: FakeUpstream, tmp_path: Path, **flags: object) -> dict[str, object]:
    """Every upstream (the embedded ones too) on the fake; data and roots in tmp_path."""
    base = {
        "upstream": [
            f"{upstream.url}/v1",
            f"openai={upstream.url}/v1",
            f"anthropic={upstream.url}/v1",
        ],
        "data_dir": str(tmp_path / "data"),
        "allowed_roots": str(tmp_path),
        "port": str(closed_port()),
    }
    return {**base, **flags}


async def doctor(
    flags: dict[str, object], home: dict[str, Any], environ: dict[str, str] | None = None
) -> Report:
    environ = {**home["environ"], **(environ or {})}
    settings, sources = load_settings_with_sources(flags, environ)
    return await run_checks(settings, sources, environ, home["project"], timeout=3.0)


def found(report: Report, check: str) -> Finding:
    matches = [finding for finding in report.findings if finding.check == check]
    assert len(matches) == 1, report.findings
    return matches[0]


def write_opencode(path: Path, port: int, *, prefix: str = "anthropic", mcp: bool = True) -> None:
    mcp_entry = (
        f'"mcp": {{"deepmem": {{"type": "remote", "url": "http://localhost:{port}/mcp"}},}},'
    )
    path.write_text(
        "// OpenCode's config, as a user writes it: comments and trailing commas\n"
        "{\n"
        '  "$schema": "https://opencode.ai/config.json", /* a block comment */\n'
        f'  "provider": {{"anthropic": {{"options": {{"baseURL": '
        f'"http://127.0.0.1:{port}/{prefix}",}},}},}},\n'
        + (f"  {mcp_entry}\n" if mcp else "")
        + "}\n",
        encoding="utf-8",
    )


# ------------------------------------------------------------------ upstreams


async def test_an_unreachable_upstream_is_a_problem(upstream, tmp_path, opencode_home) -> None:
    port = closed_port()
    flags = local_flags(upstream, tmp_path)
    flags["upstream"] = [*flags["upstream"], f"kimi=http://127.0.0.1:{port}/v1"]  # type: ignore[misc]
    report = await doctor(flags, opencode_home)
    finding = found(report, "upstream kimi")
    assert finding.status == PROBLEM
    assert "unreachable" in finding.message and f"127.0.0.1:{port}" in finding.message
    assert found(report, "upstream default").status == OK
    assert report.exit_code == 1


async def test_a_missing_version_path_gets_a_hint(tmp_path, opencode_home) -> None:
    async def v1_only(request: web.Request, body: bytes) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            return web.json_response({"object": "list", "data": []})
        return web.json_response({"error": "not found"}, status=404)

    fake = await FakeUpstream(handler=v1_only).start()
    try:
        flags = local_flags(fake, tmp_path)
        flags["upstream"] = [*flags["upstream"], f"kimi={fake.url}"]  # type: ignore[misc]
        report = await doctor(flags, opencode_home)
    finally:
        await fake.stop()
    finding = found(report, "upstream kimi")
    assert finding.status == PROBLEM
    assert "version path" in finding.message
    assert finding.hint == f"set --upstream kimi={fake.url}/v1"
    assert found(report, "upstream default").status == OK  # {fake}/v1 answers /v1/models
    # kimi: /models (404), then /v1/models to find where the API lives; the others: /v1/models
    assert sorted(r.path for r in fake.requests) == ["/models"] + ["/v1/models"] * 4


async def test_a_404_with_the_version_path_present_is_only_a_warning(
    tmp_path, opencode_home
) -> None:
    async def no_models(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"error": "not found"}, status=404)

    fake = await FakeUpstream(handler=no_models).start()
    try:
        report = await doctor(local_flags(fake, tmp_path), opencode_home)
    finally:
        await fake.stop()
    assert found(report, "upstream default").status == WARNING


# ------------------------------------------------------------------ local state


async def test_an_unwritable_data_dir_is_a_problem(upstream, tmp_path, opencode_home) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    report = await doctor(
        local_flags(upstream, tmp_path, data_dir=str(blocker / "data")), opencode_home
    )
    assert found(report, "data_dir").status == PROBLEM
    report = await doctor(local_flags(upstream, tmp_path, data_dir=str(blocker)), opencode_home)
    assert "not a directory" in found(report, "data_dir").message

    report = await doctor(local_flags(upstream, tmp_path), opencode_home)
    assert found(report, "data_dir").status == OK
    assert not (tmp_path / "data").exists()  # the doctor changes nothing


async def test_a_state_url_nobody_answers_is_a_problem_and_its_password_is_not_shown(
    upstream, tmp_path, opencode_home
) -> None:
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{closed_port()}/0"
    report = await doctor(local_flags(upstream, tmp_path, state_url=url), opencode_home)
    finding = found(report, "state")
    assert finding.status == PROBLEM
    assert REDIS_PASSWORD not in json.dumps(report.to_json())


async def test_a_damaged_state_database_is_a_problem(upstream, tmp_path, opencode_home) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "deepmem.sqlite3").write_bytes(b"this is not an SQLite database" * 100)
    report = await doctor(local_flags(upstream, tmp_path), opencode_home)
    assert found(report, "state").status == PROBLEM


async def test_a_redis_that_answers_is_fine(upstream, tmp_path, opencode_home, redis) -> None:
    report = await doctor(local_flags(upstream, tmp_path, state_url=redis.url), opencode_home)
    assert found(report, "state").status == OK


async def test_no_existing_allowed_root_is_a_problem(upstream, tmp_path, opencode_home) -> None:
    flags = local_flags(upstream, tmp_path, allowed_roots=str(tmp_path / "nowhere"))
    assert found(await doctor(flags, opencode_home), "allowed_roots").status == PROBLEM


# ------------------------------------------------------------------ OpenCode's configuration


async def test_opencode_not_pointing_at_the_proxy_is_a_problem(
    upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    write_opencode(opencode_home["project"] / "opencode.jsonc", closed_port())  # another port
    report = await doctor(flags, opencode_home)
    assert found(report, "opencode providers").status == PROBLEM
    assert found(report, "opencode mcp").status == WARNING

    write_opencode(opencode_home["project"] / "opencode.jsonc", int(str(flags["port"])))
    report = await doctor(flags, opencode_home)
    assert found(report, "opencode provider anthropic").status == OK
    assert found(report, "opencode mcp").status == OK
    assert not [f for f in report.findings if f.check == "opencode providers"]


async def test_a_base_url_under_no_upstream_prefix_is_a_problem(
    upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    write_opencode(
        opencode_home["global"] / "opencode.json", int(str(flags["port"])), prefix="deepseek"
    )
    finding = found(await doctor(flags, opencode_home), "opencode provider anthropic")
    assert finding.status == PROBLEM and "/deepseek/" in finding.message


async def test_a_missing_mcp_entry_is_a_warning(upstream, tmp_path, opencode_home) -> None:
    flags = local_flags(upstream, tmp_path)
    config = tmp_path / "elsewhere.json"
    write_opencode(config, int(str(flags["port"])), mcp=False)
    report = await doctor(flags, opencode_home, {"OPENCODE_CONFIG": str(config)})
    assert found(report, "opencode provider anthropic").status == OK  # $OPENCODE_CONFIG is read
    finding = found(report, "opencode mcp")
    assert finding.status == WARNING and "/mcp" in finding.message


async def test_env_references_are_read_as_opencode_reads_them(
    upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    port = int(str(flags["port"]))
    (opencode_home["project"] / "opencode.json").write_text(
        '{"provider": {"anthropic": {"options": {"baseURL": "http://{env:PROXY}/anthropic"}}},'
        ' "mcp": {"deepmem": {"type": "remote", "url": "http://{env:PROXY}/mcp"}}}'
    )
    report = await doctor(flags, opencode_home, {"PROXY": f"127.0.0.1:{port}"})
    assert found(report, "opencode provider anthropic").status == OK
    assert found(report, "opencode mcp").status == OK


async def test_an_opencode_file_that_is_not_jsonc_is_a_problem_that_says_where(
    upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    broken = opencode_home["project"] / "opencode.jsonc"
    broken.write_text('{\n  "provider": {} /* never closed\n}\n')
    write_opencode(opencode_home["global"] / "opencode.json", int(str(flags["port"])))
    report = await doctor(flags, opencode_home)
    problem = found(report, "opencode")
    assert problem.status == PROBLEM
    assert (
        problem.message
        == f"{broken} is not valid JSONC: line 2, column 18: unterminated /* comment"
    )
    assert found(report, "opencode provider anthropic").status == OK  # the other file still counts


# ------------------------------------------------------------------ a running proxy


async def test_a_running_proxy_is_found_and_a_missing_one_is_a_warning(
    start_proxy: ProxyFactory, upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    assert found(await doctor(flags, opencode_home), "running proxy").status == WARNING

    running = await start_proxy(upstream=[f"{upstream.url}/v1"])
    flags["port"] = running.url.rpartition(":")[2]
    finding = found(await doctor(flags, opencode_home), "running proxy")
    assert finding.status == OK and "answers" in finding.message


# ------------------------------------------------------------------ settings and their sources


def test_each_value_says_where_it_came_from(tmp_path: Path) -> None:
    config = tmp_path / "deepmem.toml"
    config.write_text('retention_days = 3\nport = 7000\nadmin_token = "s3cret-token"\n')
    environ = {
        "DEEP_MEMORY_CONFIG": str(config),
        "DEEP_MEMORY_LOG_LEVEL": "debug",
        "DEEP_MEMORY_PORT": "7100",
        "DEEP_MEMORY_STATE_URL": "redis://:hunter2@127.0.0.1:6379/0",
    }
    flags = {"port": "7200", "upstream": ["kimi=https://user:pw@api.moonshot.ai/v1?key=abc"]}
    settings, sources = load_settings_with_sources(flags, environ)
    rows = {row["name"]: row for row in setting_rows(settings, sources)}
    assert rows["port"] == {"name": "port", "value": "7200", "source": "flag --port"}
    assert rows["log_level"]["source"] == "environment DEEP_MEMORY_LOG_LEVEL"
    assert rows["retention_days"] == {
        "name": "retention_days",
        "value": "3.0",
        "source": f"config file {config}",
    }
    assert rows["host"] == {"name": "host", "value": "127.0.0.1", "source": "default"}
    assert rows["config"]["source"] == "environment DEEP_MEMORY_CONFIG"
    assert rows["upstream kimi"]["source"] == "flag --upstream"
    assert rows["upstream anthropic"]["source"] == "embedded"
    shown = json.dumps(rows)
    for secret in ("s3cret-token", "hunter2", "user:pw", "abc"):
        assert secret not in shown
    assert rows["admin_token"]["value"] == "<redacted>"


async def test_the_command_prints_json_and_exits_0_when_all_is_well(
    start_proxy: ProxyFactory, upstream, tmp_path, opencode_home, monkeypatch, capsys
) -> None:
    running = await start_proxy(upstream=[f"{upstream.url}/v1"])
    port = running.url.rpartition(":")[2]
    for name, value in opencode_home["environ"].items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OPENCODE_CONFIG", raising=False)
    monkeypatch.chdir(opencode_home["project"])
    write_opencode(opencode_home["project"] / "opencode.json", int(port))
    flags = local_flags(upstream, tmp_path)
    argv = ["doctor", "--json", "--timeout", "3", "--port", port]
    argv += ["--data-dir", str(flags["data_dir"]), "--allowed-roots", str(tmp_path)]
    for spec in flags["upstream"]:  # type: ignore[union-attr]
        argv += ["--upstream", spec]
    # On a thread: the command runs its own event loop; the fake upstream and the proxy run
    # on this one.
    code = await asyncio.to_thread(main, argv)
    out = json.loads(capsys.readouterr().out)
    assert [c for c in out["checks"] if c["status"] != OK] == []
    assert code == 0 and out["ok"] is True and out["problems"] == out["warnings"] == 0
    rows = {row["name"]: row["source"] for row in out["settings"]}
    assert rows["port"] == "flag --port" and rows["retention_days"] == "default"

    code = await asyncio.to_thread(
        main, [*argv, "--upstream", f"kimi=http://127.0.0.1:{closed_port()}"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["problems"] == 1


def test_a_configuration_error_is_reported_as_a_problem(monkeypatch, capsys) -> None:
    monkeypatch.setenv("DEEP_MEMORY_PORT", "not-a-port")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM  config: environment DEEP_MEMORY_PORT" in out


async def test_the_project_config_overrides_the_global_one(
    upstream, tmp_path, opencode_home
) -> None:
    flags = local_flags(upstream, tmp_path)
    write_opencode(opencode_home["global"] / "opencode.jsonc", int(str(flags["port"])))
    (opencode_home["project"] / "opencode.json").write_text(
        '{"provider": {"anthropic": {"options": {"baseURL": "https://api.anthropic.com/v1"}}},'
        ' "mcp": {"deepmem": {"enabled": false}}}'
    )
    report = await doctor(flags, opencode_home)
    assert found(report, "opencode providers").status == PROBLEM
    finding = found(report, "opencode mcp")
    assert finding.status == WARNING and "disabled" in finding.message
