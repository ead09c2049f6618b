"""``deepmem init``: OpenCode's config files edited in place, with backup, diff and undo."""

from __future__ import annotations

import io
import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy import init_cli, jsonc
from proxy.config import load_settings
from proxy.opencode_config import route_name
from tests.cli_result import Result, run

# A global config as people write them: comments, trailing commas, a custom provider with its
# own baseURL, another MCP server, settings deepmem has no business touching.
GLOBAL = """\
{
  // my OpenCode settings
  "$schema": "https://opencode.ai/config.json",
  "theme": "tokyonight", /* dark */
  "model": "deepseek/deepseek-chat",
  "provider": {
    "deepseek": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "DeepSeek",
      "options": {
        "baseURL": "https://api.deepseek.com/v1", // the real one
        "apiKey": "{env:DEEPSEEK_API_KEY}",
      },
      "models": { "deepseek-chat": { "name": "DeepSeek Chat" } },
    },
  },
  "mcp": {
    "github": { "type": "remote", "url": "https://example.invalid/mcp", "enabled": false },
  },
  "permission": { "bash": "ask" },
}
"""

# What `deepmem init --provider deepseek --provider anthropic` makes of it, byte for byte.
GLOBAL_ROUTED = """\
{
  // my OpenCode settings
  "$schema": "https://opencode.ai/config.json",
  "theme": "tokyonight", /* dark */
  "model": "deepseek/deepseek-chat",
  "provider": {
    "deepseek": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "DeepSeek",
      "options": {
        "baseURL": "http://127.0.0.1:8787/deepseek", // the real one
        "apiKey": "{env:DEEPSEEK_API_KEY}",
      },
      "models": { "deepseek-chat": { "name": "DeepSeek Chat" } },
    },
    "anthropic": {
      "options": {
        "baseURL": "http://127.0.0.1:8787/anthropic"
      }
    },
  },
  "mcp": {
    "github": { "type": "remote", "url": "https://example.invalid/mcp", "enabled": false },
    "deepmem": {
      "type": "remote",
      "url": "http://127.0.0.1:8787/mcp",
      "enabled": true
    },
  },
  "permission": { "bash": "ask" },
}
"""

KEY_VARIABLES = (
    "OPENCODE_CONFIG",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "GROQ_API_KEY",
    "MISTRAL_API_KEY",
    "XAI_API_KEY",
)

Init = Callable[..., Result]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway HOME whose OpenCode config dir exists; the current directory a project."""
    home = tmp_path / "home"
    (home / ".config" / "opencode").mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(project)
    return home


@pytest.fixture
def init(capsys: pytest.CaptureFixture[str]) -> Init:
    def call(*argv: str) -> Result:
        return run(capsys, ["init", *argv])

    return call


def global_file(home: Path, name: str = "opencode.jsonc") -> Path:
    return home / ".config" / "opencode" / name


def backup_of(path: Path) -> Path:
    return path.with_name(path.name + ".deepmem-backup")


def test_routes_providers_and_mounts_the_tools_keeping_everything_else(
    home: Path, init: Init
) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    result = init("--provider", "deepseek", "--provider", "anthropic")
    assert result.code == 0, result.err
    assert config.read_text() == GLOBAL_ROUTED
    assert backup_of(config).read_text() == GLOBAL
    # the proxy must learn where deepseek really is; anthropic is embedded
    assert 'upstream = ["deepseek=https://api.deepseek.com/v1"]' in result.out
    assert "deepmem serve --upstream deepseek=https://api.deepseek.com/v1" in result.out
    assert "anthropic built in" in result.out
    assert "--undo" in result.out


def test_dry_run_prints_a_unified_diff_and_writes_nothing(home: Path, init: Init) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    result = init("--provider", "deepseek", "--provider", "anthropic", "--dry-run")
    assert result.code == 0, result.err
    assert config.read_text() == GLOBAL
    assert not backup_of(config).exists()
    assert result.out.startswith(f"--- {config}\n+++ {config}\n@@ ")
    assert '-        "baseURL": "https://api.deepseek.com/v1", // the real one\n' in result.out
    assert '+        "baseURL": "http://127.0.0.1:8787/deepseek", // the real one\n' in result.out
    body = result.out.splitlines()[2:]
    removed = [line for line in body if line.startswith("-")]
    added = [line for line in body if line.startswith("+")]
    assert removed == ['-        "baseURL": "https://api.deepseek.com/v1", // the real one']
    assert len(added) == len(GLOBAL_ROUTED.splitlines()) - len(GLOBAL.splitlines()) + 1
    assert "would change" in result.err


def test_a_second_run_changes_nothing(home: Path, init: Init) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    assert init("--provider", "deepseek", "--provider", "anthropic").code == 0
    stamp = config.stat().st_mtime_ns
    again = init("--provider", "deepseek", "--provider", "anthropic")
    assert again.code == 0
    assert config.read_text() == GLOBAL_ROUTED and config.stat().st_mtime_ns == stamp
    assert backup_of(config).read_text() == GLOBAL
    assert "unchanged" in again.out and "(already)" in again.out
    # the real URL is still known (from the backup), so the upstream line is printed again
    assert 'upstream = ["deepseek=https://api.deepseek.com/v1"]' in again.out
    assert init("--provider", "deepseek", "--dry-run").out == ""  # no diff at all


def test_undo_restores_the_file_and_says_when_there_is_nothing_to_undo(
    home: Path, init: Init
) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    assert init("--provider", "deepseek").code == 0
    assert config.read_text() != GLOBAL
    undone = init("--undo")
    assert undone.code == 0
    assert config.read_text() == GLOBAL
    assert not backup_of(config).exists()
    assert "restored" in undone.err
    again = init("--undo")
    assert again.code == 1
    assert "nothing to undo" in again.err


def test_undo_dry_run_shows_what_it_would_put_back(home: Path, init: Init) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    assert init("--provider", "deepseek").code == 0
    shown = init("--undo", "--dry-run")
    assert shown.code == 0
    assert '+        "baseURL": "https://api.deepseek.com/v1", // the real one\n' in shown.out
    assert config.read_text() != GLOBAL and backup_of(config).exists()


def test_undo_keeps_the_first_backup_across_runs(home: Path, init: Init) -> None:
    config = global_file(home)
    config.write_text(GLOBAL)
    assert init("--provider", "deepseek").code == 0
    assert init("--provider", "anthropic").code == 0
    assert backup_of(config).read_text() == GLOBAL
    assert init("--undo").code == 0
    assert config.read_text() == GLOBAL


def test_without_any_config_it_creates_one_and_undo_removes_it(home: Path, init: Init) -> None:
    result = init("--provider", "anthropic", "--provider", "openai")
    assert result.code == 0, result.err
    created = global_file(home, "opencode.json")
    assert json.loads(created.read_text()) == {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "anthropic": {"options": {"baseURL": "http://127.0.0.1:8787/anthropic"}},
            "openai": {"options": {"baseURL": "http://127.0.0.1:8787/openai"}},
        },
        "mcp": {"deepmem": {"type": "remote", "url": "http://127.0.0.1:8787/mcp", "enabled": True}},
    }
    assert "upstream = [" not in result.out  # both are embedded in deepmem
    assert "run: deepmem serve\n" in result.out
    assert init("--undo").code == 0
    assert not created.exists() and not backup_of(created).exists()


def test_project_file_and_proxy_url(home: Path, init: Init, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "opencode.json").write_text('{"model": "anthropic/claude-sonnet-4-5"}\n')
    result = init("--project", "--provider", "anthropic", "--proxy-url", "http://127.0.0.1:9999/")
    assert result.code == 0, result.err
    assert (project / "opencode.json").read_text() == (
        '{"model": "anthropic/claude-sonnet-4-5", "provider": {"anthropic": {"options": '
        '{"baseURL": "http://127.0.0.1:9999/anthropic"}}}, "mcp": {"deepmem": {"type": '
        '"remote", "url": "http://127.0.0.1:9999/mcp", "enabled": true}}}\n'
    )
    assert not global_file(home, "opencode.json").exists()


@pytest.mark.parametrize("where", ["project", "."])
def test_a_project_file_that_overrides_the_baseurl_is_named(
    home: Path, init: Init, tmp_path: Path, where: str
) -> None:
    """The project's own file, or a parent directory's: outside a git repository OpenCode's
    project is /, and it reads the opencode.json[c] of every directory up to there."""
    overriding = tmp_path / where / "opencode.jsonc"
    overriding.write_text(
        '{"provider": {"anthropic": {"options": {"baseURL": "https://gw.example.invalid/v1"}}}}'
    )
    result = init("--provider", "anthropic")
    assert result.code == 0
    assert f"{overriding} sets provider.anthropic.options.baseURL" in result.err
    assert f"deepmem init --project {overriding.parent}" in result.err
    # the gateway, in force, is where deepmem must forward anthropic's requests
    assert '"anthropic=https://gw.example.invalid/v1"' in result.out


def test_opencode_config_variable_is_the_file_edited(
    home: Path, init: Init, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    custom = tmp_path / "custom.json"
    custom.write_text("{}")
    global_file(home).write_text(GLOBAL)
    monkeypatch.setenv("OPENCODE_CONFIG", str(custom))
    assert init("--provider", "deepseek").code == 0
    assert global_file(home).read_text() == GLOBAL
    routed = jsonc.loads(custom.read_text())
    assert routed["provider"]["deepseek"]["options"]["baseURL"] == "http://127.0.0.1:8787/deepseek"


def test_mcp_entries_that_reach_deepmem_already_are_kept(home: Path, init: Init) -> None:
    config = global_file(home, "opencode.json")
    text = (
        '{\n  "mcp": {\n    "memory": {"type": "remote", '
        '"url": "http://127.0.0.1:8787/mcp?project=/home/me/app"}\n  }\n}\n'
    )
    config.write_text(text)
    assert init("--provider", "anthropic").code == 0
    assert '"deepmem"' not in config.read_text()


@pytest.mark.parametrize("host", ["localhost", "[::1]"])
def test_urls_at_deepmem_under_another_loopback_name_are_routed_already(
    home: Path, init: Init, host: str
) -> None:
    """Not an upstream of deepmem's own (a loop): the provider and the tools go through it."""
    config = global_file(home, "opencode.json")
    text = (
        f'{{"provider": {{"anthropic": {{"options": {{"baseURL": "http://{host}:8787/anthropic"}}}}}},'
        f' "mcp": {{"mine": {{"type": "remote", "url": "http://{host}:8787/mcp/"}}}}}}'
    )
    config.write_text(text)
    result = init("--provider", "anthropic")
    assert result.code == 0
    assert f"anthropic: baseURL http://{host}:8787/anthropic (already)" in result.out
    assert "upstream =" not in result.out and "nothing to configure" in result.out
    assert config.read_text() == text


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8787/deepmem", "http://127.0.0.1:99999", "ftp://h:1", "http://:1"]
)
def test_a_proxy_url_that_is_not_http_host_port_is_refused(
    home: Path, init: Init, url: str
) -> None:
    result = init("--provider", "anthropic", "--proxy-url", url)
    assert result.code == 1 and "expected http://HOST:PORT" in result.err


def test_an_old_deepmem_mcp_entry_gets_the_new_url_and_keeps_its_headers(
    home: Path, init: Init
) -> None:
    config = global_file(home, "opencode.json")
    config.write_text(
        '{"mcp": {"deepmem": {"type": "remote", "url": "http://127.0.0.1:7000/mcp", '
        '"headers": {"Authorization": "Bearer x"}}}}'
    )
    assert init("--provider", "anthropic").code == 0
    assert jsonc.loads(config.read_text())["mcp"] == {
        "deepmem": {
            "type": "remote",
            "url": "http://127.0.0.1:8787/mcp",
            "headers": {"Authorization": "Bearer x"},
        }
    }


def test_no_mcp(home: Path, init: Init) -> None:
    assert init("--provider", "anthropic", "--no-mcp").code == 0
    assert "mcp" not in jsonc.loads(global_file(home, "opencode.json").read_text())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"provider": {"a": 1,,}}', "is not valid JSONC: line 1, column 22: expected a property"),
        (b"[1, 2]", "the top level is not an object"),
        (b'{"a": "\xff"}', "is not UTF-8 text"),
        (b'{"provider": "none"}', "provider is not an object"),
    ],
)
def test_bad_files_are_one_line_errors_and_stay_untouched(
    home: Path, init: Init, content: bytes, message: str
) -> None:
    config = global_file(home, "opencode.json")
    config.write_bytes(content)
    result = init("--provider", "anthropic")
    assert result.code == 1
    assert message in result.err
    assert result.err.count("\n") == 1 and result.err.startswith("deepmem: ")
    assert "Traceback" not in result.err
    assert config.read_bytes() == content
    assert not backup_of(config).exists()


def test_an_unreadable_config_is_a_one_line_error(home: Path, init: Init) -> None:
    global_file(home, "opencode.json").mkdir()
    result = init("--provider", "anthropic")
    assert result.code == 1
    assert result.err == f"deepmem: {global_file(home, 'opencode.json')} is not a regular file\n"


def test_without_a_terminal_it_names_what_to_pass_instead_of_asking(
    home: Path, init: Init, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("1\n"))  # not a terminal: never read
    result = init()
    assert result.code == 1
    assert "--provider NAME (repeatable) or --all" in result.err
    assert not global_file(home, "opencode.json").exists()


def test_on_a_terminal_it_asks(home: Path, init: Init, monkeypatch: pytest.MonkeyPatch) -> None:
    global_file(home).write_text(GLOBAL)
    monkeypatch.setattr(init_cli, "interactive", lambda: True)
    monkeypatch.setattr("sys.stdin", io.StringIO("1, anthropic\n"))
    result = init()
    assert result.code == 0, result.err
    assert "1. deepseek" in result.out and "Route which providers" in result.err
    assert global_file(home).read_text() == GLOBAL_ROUTED


def test_end_of_input_on_the_prompt_changes_nothing(
    home: Path, init: Init, monkeypatch: pytest.MonkeyPatch
) -> None:
    global_file(home).write_text(GLOBAL)
    monkeypatch.setattr(init_cli, "interactive", lambda: True)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    result = init()
    assert result.code == 1 and "no provider picked" in result.err
    assert global_file(home).read_text() == GLOBAL


def test_all_takes_the_providers_in_use(
    home: Path, init: Init, monkeypatch: pytest.MonkeyPatch
) -> None:
    global_file(home).write_text(GLOBAL)
    auth = home / ".local" / "share" / "opencode" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text('{"openrouter": {"type": "api", "key": "sk-or-not-read"}}')
    monkeypatch.setenv("XAI_API_KEY", "xai-test")
    listed = init("--list")
    assert "deepseek" in listed.out and "logged in" in listed.out and "XAI_API_KEY" in listed.out
    assert "sk-or" not in listed.out
    assert init("--all").code == 0
    providers = jsonc.loads(global_file(home).read_text())["provider"]
    assert sorted(providers) == ["deepseek", "openrouter", "xai"]


def test_all_skips_a_provider_it_cannot_route(home: Path, init: Init) -> None:
    auth = home / ".local" / "share" / "opencode" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text('{"github-copilot": {"type": "oauth"}, "anthropic": {"type": "oauth"}}')
    result = init("--all")
    assert result.code == 0, result.err
    assert "skipped: provider github-copilot has no options.baseURL" in result.err
    config = jsonc.loads(global_file(home, "opencode.json").read_text())
    assert sorted(config["provider"]) == ["anthropic"]
    auth.write_text('{"github-copilot": {"type": "oauth"}}')
    global_file(home, "opencode.json").unlink()
    none = init("--all")
    assert none.code == 1 and "can route none of the providers in use" in none.err


def test_unknown_provider_and_custom_provider_without_url(home: Path, init: Init) -> None:
    config = global_file(home, "opencode.json")
    config.write_text('{"provider": {"local": {"npm": "@ai-sdk/openai-compatible"}}}')
    unknown = init("--provider", "nosuch")
    assert unknown.code == 1 and "unknown provider 'nosuch'" in unknown.err
    nourl = init("--provider", "local")
    assert nourl.code == 1 and "provider local has no options.baseURL" in nourl.err
    assert not backup_of(config).exists()


def test_env_references_in_the_base_url_are_resolved(
    home: Path, init: Init, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = global_file(home, "opencode.json")
    config.write_text('{"provider": {"corp": {"options": {"baseURL": "{env:CORP_URL}"}}}}')
    monkeypatch.delenv("CORP_URL", raising=False)
    missing = init("--provider", "corp")
    assert missing.code == 1 and "names $CORP_URL, which is not set" in missing.err
    monkeypatch.setenv("CORP_URL", "https://llm.corp.invalid/v1/")
    result = init("--provider", "corp")
    assert result.code == 0
    assert '"corp=https://llm.corp.invalid/v1"' in result.out


def test_writes_keep_the_mode_and_go_through_a_symlink(
    home: Path, init: Init, tmp_path: Path
) -> None:
    dotfiles = tmp_path / "dotfiles" / "opencode.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text("{}\n")
    dotfiles.chmod(0o600)
    link = global_file(home, "opencode.json")
    link.symlink_to(dotfiles)
    assert init("--provider", "anthropic").code == 0
    assert link.is_symlink()
    assert "anthropic" in dotfiles.read_text()
    assert dotfiles.stat().st_mode & 0o777 == 0o600
    leftovers = [p.name for p in dotfiles.parent.iterdir()]
    assert sorted(leftovers) == ["opencode.json", "opencode.json.deepmem-backup"]


def test_crlf_config_stays_crlf(home: Path, init: Init) -> None:
    config = global_file(home, "opencode.json")
    config.write_bytes(b'{\r\n  "theme": "x"\r\n}\r\n')
    assert init("--provider", "anthropic").code == 0
    raw = config.read_bytes()
    assert raw.count(b"\n") == raw.count(b"\r\n") and raw.startswith(b'{\r\n  "theme": "x",\r\n')


# ---- deepmem's own TOML file


def test_deepmem_config_gets_the_upstreams_merged(home: Path, init: Init, tmp_path: Path) -> None:
    global_file(home).write_text(GLOBAL)
    toml = tmp_path / "deepmem.toml"
    toml.write_text(
        '# my proxy\nport = 8787\nupstream = [\n  "kimi=https://api.moonshot.ai/v1", # kimi\n]\n'
    )
    args = ("--provider", "deepseek", "--provider", "anthropic", "--deepmem-config", str(toml))
    result = init(*args)
    assert result.code == 0, result.err
    assert toml.read_text() == (
        "# my proxy\nport = 8787\nupstream = [\n"
        '  "kimi=https://api.moonshot.ai/v1", # kimi\n'
        '  "deepseek=https://api.deepseek.com/v1",\n]\n'
    )
    assert f"deepmem serve --config {toml}" in result.out
    # the proxy reads it: deepseek is routed, kimi and the embedded ones are still there
    settings = load_settings({"config": str(toml)}, environ={})
    routes = {u.name: u.url for u in settings.upstreams}
    assert routes["deepseek"] == "https://api.deepseek.com/v1"
    assert routes["kimi"] == "https://api.moonshot.ai/v1"
    assert routes["anthropic"] == "https://api.anthropic.com/v1"
    stamp = toml.stat().st_mtime_ns
    assert init(*args).code == 0
    assert toml.stat().st_mtime_ns == stamp
    assert init("--undo", "--deepmem-config", str(toml)).code == 0
    assert "deepseek" not in toml.read_text() and "kimi" in toml.read_text()


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, 'upstream = [\n  "deepseek=https://api.deepseek.com/v1",\n]\n'),
        (
            "port = 9000",
            'port = 9000\nupstream = [\n  "deepseek=https://api.deepseek.com/v1",\n]\n',
        ),
        (
            'upstream = ["deepseek=https://old.invalid/v1", "b=https://b.invalid"]\n',
            'upstream = ["deepseek=https://api.deepseek.com/v1", "b=https://b.invalid"]\n',
        ),
        (
            "upstream = ['a=https://a.invalid']\n",
            "upstream = ['a=https://a.invalid', \"deepseek=https://api.deepseek.com/v1\"]\n",
        ),
        ("upstream = []\n", 'upstream = ["deepseek=https://api.deepseek.com/v1"]\n'),
    ],
)
def test_deepmem_config_layouts(
    home: Path, init: Init, tmp_path: Path, before: str | None, after: str
) -> None:
    global_file(home).write_text(GLOBAL)
    toml = tmp_path / "deepmem.toml"
    if before is not None:
        toml.write_text(before)
    assert init("--provider", "deepseek", "--deepmem-config", str(toml)).code == 0
    assert toml.read_text() == after
    assert tomllib.loads(after)["upstream"]


def test_a_deepmem_config_that_is_not_toml_is_an_error(
    home: Path, init: Init, tmp_path: Path
) -> None:
    global_file(home).write_text(GLOBAL)
    toml = tmp_path / "deepmem.toml"
    toml.write_text("upstream = [\n")
    result = init("--provider", "deepseek", "--deepmem-config", str(toml))
    assert result.code == 1 and "is not valid TOML" in result.err
    assert global_file(home).read_text() == GLOBAL  # nothing written when a part fails


def test_route_names_are_valid_upstream_names() -> None:
    assert route_name("deepseek") == "deepseek"
    assert route_name("My Provider") == "my-provider"
    assert route_name("mcp") == "mcp-provider"
    assert route_name("v1") == "v1-provider"
    assert route_name("@@@") == "provider"


def test_help_explains_the_approach(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(capsys, ["init", "--help"])
    text = capsys.readouterr().out
    for phrase in ("--deepmem-config", "upstream = [...]", "--undo", "atomically", "--dry-run"):
        assert phrase in text
