"""One loader: flags > DEEP_MEMORY_* environment > TOML file > defaults."""

from __future__ import annotations

import os

import pytest

from proxy.cli import build_parser, main
from proxy.config import (
    EMBEDDED_UPSTREAMS,
    OPTIONS,
    ConfigError,
    load_settings,
    parse_upstreams,
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
