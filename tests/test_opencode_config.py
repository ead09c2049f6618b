"""Where OpenCode's configuration files are, in which order: one answer for init and doctor."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import doctor, init_cli
from proxy.opencode_config import (
    CUSTOM,
    GLOBAL,
    PROJECT,
    ConfigPath,
    config_search_path,
    existing_config_files,
)


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A global config dir, a custom file, a git repository with a nested working directory."""
    xdg = tmp_path / "xdg"
    (xdg / "opencode").mkdir(parents=True)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    workdir = repo / "packages" / "app"
    workdir.mkdir(parents=True)
    return {"global": xdg / "opencode", "repo": repo, "workdir": workdir, "tmp": tmp_path}


def environ_of(layout: dict[str, Path], custom: Path | None = None) -> dict[str, str]:
    environ = {"XDG_CONFIG_HOME": str(layout["global"].parent), "HOME": str(layout["tmp"])}
    if custom is not None:
        environ["OPENCODE_CONFIG"] = str(custom)
    return environ


def write(path: Path, text: str = "{}") -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_the_search_path_in_load_order(layout: dict[str, Path]) -> None:
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


def test_a_file_reached_twice_counts_once_at_its_first_place(layout: dict[str, Path]) -> None:
    global_file = write(layout["global"] / "opencode.json")
    link = layout["workdir"] / "opencode.jsonc"
    link.symlink_to(global_file)
    environ = environ_of(layout, custom=global_file)
    assert existing_config_files(environ, layout["workdir"]) == [ConfigPath(global_file, GLOBAL)]


def test_doctor_and_init_see_the_same_files_in_the_same_order(layout: dict[str, Path]) -> None:
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
