"""Where OpenCode's configuration files are, in which order: one answer for init and doctor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy import doctor, init_cli
from proxy.opencode_config import (
    CUSTOM,
    GLOBAL,
    PROJECT,
    ConfigFile,
    ConfigPath,
    ProxyAddress,
    config_search_path,
    existing_config_files,
    is_proxy_mcp_url,
    merge_configs,
    proxy_prefix,
    source_of,
    substitute_env,
    unset_env,
)


@pytest.fixture
def layout(opencode_home: dict[str, Any]) -> dict[str, Any]:
    """The global config dir, a git repository and a working directory nested in it."""
    repo = opencode_home["project"]
    workdir = repo / "packages" / "app"
    workdir.mkdir(parents=True)
    return {**opencode_home, "repo": repo, "workdir": workdir, "tmp": repo.parent}


def environ_of(layout: dict[str, Any], custom: Path | None = None) -> dict[str, str]:
    custom_variable = {} if custom is None else {"OPENCODE_CONFIG": str(custom)}
    return {**layout["environ"], **custom_variable}


def write(path: Path, text: str = "{}") -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_the_search_path_in_load_order(layout: dict[str, Any]) -> None:
    custom = layout["tmp"] / "custom.jsonc"
    environ = environ_of(layout, custom)
    repo, workdir = layout["repo"], layout["workdir"]
    assert config_search_path(environ, workdir) == [
        ConfigPath(layout["global"] / "config.json", GLOBAL),
        ConfigPath(layout["global"] / "opencode.json", GLOBAL),
        ConfigPath(layout["global"] / "opencode.jsonc", GLOBAL),
        ConfigPath(custom, CUSTOM),
        ConfigPath(repo / "opencode.json", PROJECT),  # the git root, not above it
        ConfigPath(repo / "opencode.jsonc", PROJECT),
        ConfigPath(repo / "packages" / "opencode.json", PROJECT),
        ConfigPath(repo / "packages" / "opencode.jsonc", PROJECT),
        ConfigPath(workdir / "opencode.json", PROJECT),
        ConfigPath(workdir / "opencode.jsonc", PROJECT),
    ]
    write(layout["tmp"] / "opencode.json")  # above the git root: not OpenCode's
    files = [
        write(layout["global"] / "config.json"),
        write(custom),
        write(workdir / "opencode.json"),
    ]
    assert [location.path for location in existing_config_files(environ, workdir)] == files


def test_outside_a_repository_the_project_files_go_up_to_the_filesystem_root(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "a" / "b"
    workdir.mkdir(parents=True)
    paths = [location.path for location in config_search_path({"HOME": str(tmp_path)}, workdir)]
    assert paths[-6:] == [
        tmp_path / "opencode.json",
        tmp_path / "opencode.jsonc",
        tmp_path / "a" / "opencode.json",
        tmp_path / "a" / "opencode.jsonc",
        workdir / "opencode.json",
        workdir / "opencode.jsonc",
    ]
    assert paths[3:5] == [Path("/opencode.json"), Path("/opencode.jsonc")]


def test_a_file_reached_twice_counts_once_at_its_first_place(layout: dict[str, Any]) -> None:
    global_file = write(layout["global"] / "opencode.json")
    link = layout["workdir"] / "opencode.jsonc"
    link.symlink_to(global_file)
    environ = environ_of(layout, custom=global_file)
    assert existing_config_files(environ, layout["workdir"]) == [ConfigPath(global_file, GLOBAL)]


def test_doctor_and_init_see_the_same_files_in_the_same_order(layout: dict[str, Any]) -> None:
    custom = write(layout["tmp"] / "custom.json")
    environ = environ_of(layout, custom)
    expected = [
        (write(layout["global"] / "config.json"), GLOBAL),
        (write(layout["global"] / "opencode.jsonc"), GLOBAL),
        (custom, CUSTOM),
        (write(layout["repo"] / "opencode.jsonc"), PROJECT),
        (write(layout["workdir"] / "opencode.json"), PROJECT),
        (write(layout["workdir"] / "opencode.jsonc"), PROJECT),
    ]
    seen_by_doctor, problems = doctor.read_opencode_configs(environ, layout["workdir"])
    assert problems == []
    seen_by_init, _ = init_cli.load_layers(custom, layout["workdir"], environ)
    assert [(c.path, c.label) for c in seen_by_doctor] == expected
    assert [(c.path, c.label) for c in seen_by_init] == expected


def config(path: str, data: dict[str, Any], label: str = PROJECT) -> ConfigFile:
    return ConfigFile(Path(path), label, "", data)


def test_files_merge_deeply_and_a_value_comes_from_the_last_file_that_sets_it() -> None:
    first = config(
        "/g/opencode.json",
        {
            "provider": {"anthropic": {"options": {"apiKey": "k", "baseURL": "https://a/v1"}}},
            "mcp": {"deepmem": {"type": "remote", "url": "http://127.0.0.1:8787/mcp"}},
            "model": "anthropic/claude",
            "theme": {"name": "dark"},
        },
        GLOBAL,
    )
    second = config(
        "/p/opencode.json",
        {
            "provider": {"anthropic": {"options": {"baseURL": "http://127.0.0.1:8787/anthropic"}}},
            "mcp": {"deepmem": {"enabled": False}},
            "theme": "light",  # not an object: replaces the earlier one
        },
    )
    assert merge_configs([first, second]) == {
        "provider": {
            "anthropic": {"options": {"apiKey": "k", "baseURL": "http://127.0.0.1:8787/anthropic"}}
        },
        "mcp": {
            "deepmem": {"type": "remote", "url": "http://127.0.0.1:8787/mcp", "enabled": False}
        },
        "model": "anthropic/claude",
        "theme": "light",
    }
    assert first.data["provider"]["anthropic"]["options"]["baseURL"] == "https://a/v1"  # kept
    base_url = ("provider", "anthropic", "options", "baseURL")
    assert source_of([first, second], base_url) is second
    assert source_of([first, second], ("provider", "anthropic", "options", "apiKey")) is first
    assert source_of([first, second], ("provider", "openai")) is None


def test_env_references_are_substituted_as_opencode_does() -> None:
    environ = {"HOST": "127.0.0.1", "EMPTY": ""}
    text = "http://{env:HOST}:8787/{env:EMPTY}{env:UNSET}v1"
    assert substitute_env(text, environ) == "http://127.0.0.1:8787/v1"
    assert unset_env(text, environ) == ["EMPTY", "UNSET"]
    assert substitute_env("no reference {env:}", environ) == "no reference {env:}"


def test_which_urls_reach_deepmem() -> None:
    local = ProxyAddress.of_url("http://127.0.0.1:8787")
    for url in ("http://localhost:8787/anthropic", "http://[::1]:8787", "http://LOCALHOST:8787"):
        assert local.parse(url) is not None, url
    for url in ("http://127.0.0.1:8788/x", "http://10.0.0.2:8787/x", "ws://localhost:8787", ":"):
        assert local.parse(url) is None, url
    named = ProxyAddress.of_url("http://deepmem.lan:8787/")
    assert named.parse("http://deepmem.lan:8787/v1") and not named.parse("http://localhost:8787")
    assert ProxyAddress(80, None).parse("http://any.host/openai") is not None  # binds all
    assert proxy_prefix("http://localhost:8787/anthropic/v1", local) == "anthropic"
    assert proxy_prefix("http://localhost:8787", local) == ""
    assert proxy_prefix("https://api.anthropic.com/v1", local) is None
    assert is_proxy_mcp_url("http://localhost:8787/mcp/?project=/x", local)
    assert not is_proxy_mcp_url("http://localhost:8787/mcp/other", local)
