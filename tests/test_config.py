"""One loader: flags > DEEP_MEMORY_* environment > TOML file > defaults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proxy.cli import build_parser, main
from proxy.config import (
    EMBEDDED_UPSTREAMS,
    OPTIONS,
    ConfigError,
    load_settings,
    parse_upstreams,
    unknown_environment,
)


def flags_of(*argv: str) -> dict:
    args = build_parser().parse_args(["serve", *argv])
    return {key: value for key, value in vars(args).items() if key != "command"}


def test_defaults_are_embedded():
    settings = load_settings({}, environ={})
    assert (settings.host, settings.port) == ("127.0.0.1", 8787)
    assert {u.name: u.url for u in settings.upstreams} == EMBEDDED_UPSTREAMS
    assert settings.max_body_bytes == 64 * 1024 * 1024
    assert settings.admin_token is None


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    config = tmp_path / "deepmem.toml"
    config.write_text('port = 1111\nhost = "0.0.0.0"\nlog_format = "json"\nread_timeout = 5\n')
    env = {"DEEP_MEMORY_PORT": "2222", "DEEP_MEMORY_HOST": "127.0.0.2"}
    settings = load_settings(flags_of("--config", str(config), "--port", "3333"), environ=env)
    assert settings.port == 3333  # flag
    assert settings.host == "127.0.0.2"  # environment
    assert settings.log_format == "json"  # file
    assert settings.read_timeout == 5.0  # file
    assert settings.connect_timeout == 10.0  # default
    assert settings.config_file == config


def test_config_file_from_environment(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('upstream = ["http://127.0.0.1:9/v1", "local=http://127.0.0.1:8/v1"]\n')
    settings = load_settings({}, environ={"DEEP_MEMORY_CONFIG": str(config)})
    table = {u.prefix: u.url for u in settings.upstreams}
    assert table["v1"] == "http://127.0.0.1:9/v1"
    assert table["local"] == "http://127.0.0.1:8/v1"
    assert table["anthropic"] == EMBEDDED_UPSTREAMS["anthropic"]


def test_repeatable_upstream_flag_and_env_list():
    settings = load_settings(
        flags_of("--upstream", "http://a:1/v1/", "--upstream", "Kimi=http://k:2/v1"), environ={}
    )
    table = {u.name: u.url for u in settings.upstreams}
    assert table["default"] == "http://a:1/v1"
    assert table["kimi"] == "http://k:2/v1"
    env = load_settings({}, environ={"DEEP_MEMORY_UPSTREAM": "http://e:1/v1, z=http://z:2"})
    assert {u.name: u.url for u in env.upstreams}["z"] == "http://z:2"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("health=http://x", "reserved"),
        ("v1=http://x", "reserved"),
        ("bad name=http://x", "upstream name"),
        ("ftp://x", "http:// or https://"),
        ("name=not-a-url", "http:// or https://"),
    ],
)
def test_bad_upstreams_are_clear_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_upstreams([spec])


def test_bad_values_name_their_source(tmp_path):
    with pytest.raises(ConfigError, match="DEEP_MEMORY_PORT"):
        load_settings({}, environ={"DEEP_MEMORY_PORT": "eighty"})
    with pytest.raises(ConfigError, match="--log-format"):
        load_settings(flags_of("--log-format", "xml"), environ={})
    config = tmp_path / "c.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*prot"):
        load_settings({"config": str(config)}, environ={})
    config.write_text("port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({"config": str(config)}, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings({"config": str(tmp_path / "missing.toml")}, environ={})


def test_boolean_flag_and_environment():
    assert load_settings(flags_of("--log-bodies"), environ={}).log_bodies is True
    assert load_settings({}, environ={"DEEP_MEMORY_LOG_BODIES": "yes"}).log_bodies is True
    assert load_settings({}, environ={"DEEP_MEMORY_LOG_BODIES": "0"}).log_bodies is False


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config" in text and "DEEP_MEMORY_CONFIG" in text
    for option in OPTIONS:
        assert option.flag in text, option.flag
        assert option.env in text, option.env


def test_cli_reports_config_errors_without_traceback(capsys):
    assert main(["serve", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert "deepmem: flag --port" in err and "Traceback" not in err


def test_readme_configuration_table_is_generated_from_options():
    from proxy.docs import README, render

    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "README is out of date: run `python -m proxy.docs`"


# --- what a new user hits on the command line (issue 10, item 26) -------------------------------


def test_subcommands_offer_only_the_settings_they_read(capsys):
    with pytest.raises(SystemExit):
        main(["memory", "search", "--help"])
    text = capsys.readouterr().out
    assert "--data-dir" in text and "--memory-dir-name" in text and "--limit" in text
    for serve_only in ("--upstream", "--compress", "--port", "--admin-token", "--tail-tokens"):
        assert serve_only not in text, serve_only
    assert len(text.splitlines()) < 50
    with pytest.raises(SystemExit):
        main(["expand", "--help"])
    text = capsys.readouterr().out
    assert "--retention-days" in text and "--upstream" not in text


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["serve", "--bogus"], "usage: deepmem serve "),
        (["memory", "search", "x", "--bogus"], "usage: deepmem memory search "),
        (["history", "sessions", "--bogus"], "usage: deepmem history sessions "),
        (["--bogus"], "usage: deepmem "),
    ],
)
def test_an_unknown_option_is_reported_with_its_subcommands_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments: --bogus" in err


def test_unknown_environment_variables_are_named_with_the_closest_setting():
    assert unknown_environment(
        {"DEEP_MEMORY_PORTT": "1", "DEEP_MEMORY_PORT": "1", "DEEP_MEMORY_XYZZY": "1", "HOME": "/"}
    ) == [
        "environment variable DEEP_MEMORY_PORTT is not a deepmem setting, ignored; "
        "did you mean DEEP_MEMORY_PORT?",
        "environment variable DEEP_MEMORY_XYZZY is not a deepmem setting, ignored",
    ]
    assert unknown_environment({"DEEP_MEMORY_CONFIG": "x", "DEEP_MEMORY_ADMIN_TOKEN": "t"}) == []


def test_a_command_warns_about_a_mistyped_variable(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DEEP_MEMORY_ALLOWED_ROOT", str(tmp_path))
    code = main(["memory", "stats", "--project", str(tmp_path), "--data-dir", str(tmp_path)])
    assert code == 0
    assert capsys.readouterr().err == (
        "deepmem: warning: environment variable DEEP_MEMORY_ALLOWED_ROOT is not a deepmem "
        "setting, ignored; did you mean DEEP_MEMORY_ALLOWED_ROOTS?\n"
    )


@pytest.mark.slow
def test_serve_logs_its_data_dir_roots_and_environment_mistakes(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DEEP_MEMORY_DATA_DIR": str(tmp_path / "data"),
        "DEEP_MEMORY_ALLOWED_ROOTS": f"{tmp_path},/srv/projects",
        "DEEP_MEMORY_PORTT": "9999",
    }
    served = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert served.stderr is not None
        lines = [served.stderr.readline() for _ in range(4)]
    finally:
        served.terminate()
        served.wait(timeout=10)
    assert "WARNING" in lines[0] and "DEEP_MEMORY_PORTT" in lines[0]
    assert "did you mean DEEP_MEMORY_PORT?" in lines[0]
    assert (
        "WARNING" in lines[1] and "allowed roots that do not exist here: /srv/projects" in lines[1]
    )
    assert "listening on http://127.0.0.1:0" in lines[2]
    assert (
        lines[3]
        .rstrip()
        .endswith(
            f"data dir {tmp_path / 'data'}; project memory: project_dir unset (taken from each "
            f"request), allowed roots {tmp_path}, /srv/projects"
        )
    )


def test_config_file_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, capsys):
    """Were tracebacks: UnicodeDecodeError, IsADirectoryError, NotADirectoryError."""
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('log_format = "caf\xe9"\n'.encode("latin-1"))
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    under_a_file = latin1 / "deepmem.toml"
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "gone.toml")
    cases = [
        (latin1, "is not UTF-8 text"),
        (tmp_path, "is not a regular file"),
        (fifo, "is not a regular file"),
        (under_a_file, "cannot read config file"),
        (dangling, "does not exist"),
    ]
    for path, message in cases:
        assert main(["replay", str(tmp_path), "--config", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert err.startswith("deepmem: ") and message in err and str(path) in err, err
        assert "Traceback" not in err and len(err.splitlines()) == 1


def test_settings_defaults_are_the_options_defaults(tmp_path):
    """Each default is declared once, in OPTIONS; Settings() and load_settings agree on every
    one but those load_settings fills from the machine (upstreams, data dir, allowed roots)."""
    from dataclasses import fields

    from proxy.config import Settings

    loaded = load_settings({"data_dir": str(tmp_path)}, environ={})
    machine = {"upstreams", "data_dir", "allowed_roots", "config_file"}
    for field in fields(Settings):
        if field.name not in machine:
            assert getattr(Settings(), field.name) == getattr(loaded, field.name), field.name
