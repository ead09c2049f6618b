"""The one configuration definition and its loader.

Every setting is declared once, as an ``Option`` in the module that uses it (the server's
own here, in ``SERVER_OPTIONS``), and gathered in ``OPTIONS``. The command line, the
``DEEP_MEMORY_*`` environment, the TOML file and the documentation are all derived from that
list, and values are resolved in one order: flags > environment > config file > defaults.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from proxy import (
    cluster,
    compaction,
    compression,
    injections,
    memory_api,
    opt_out,
    prices,
    projects,
    stores,
)
from proxy.logs import redact_text
from proxy.options import (
    ENV_PREFIX,
    Option,
    choice,
    parse_bool,
    parse_host_list,
    parse_list,
    parse_non_negative_int,
    parse_optional_str,
    parse_port,
    parse_positive_float,
    parse_positive_int,
    parse_str,
)

DEFAULT_UPSTREAM_NAME = "default"
DEFAULT_PREFIX = "v1"
UPSTREAM_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
# Path segments the proxy answers itself; an upstream may not take them as a name.
RESERVED_NAMES = frozenset(
    {DEFAULT_PREFIX, "health", "stats", "metrics", "expand", "mcp", "memory", "sessions", "api"}
)
EMBEDDED_UPSTREAMS: dict[str, str] = {
    DEFAULT_UPSTREAM_NAME: "https://api.openai.com/v1",
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
}


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message says which and why."""


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return os.path.join(base, "deepmem")


SERVER_OPTIONS: tuple[Option, ...] = (
    Option("host", parse_str, "127.0.0.1", "Address to bind.", "ADDR"),
    Option("port", parse_port, 8787, "Port to listen on.", "PORT"),
    Option(
        "upstream",
        parse_list,
        [],
        "Provider base URL, as OpenCode's baseURL would be (including /v1). 'URL' sets the "
        "default upstream served at /v1/...; 'NAME=URL' adds one served at /NAME/... "
        "Repeatable; the environment and the config file take a list. Named entries override "
        "the embedded ones by name: "
        + ", ".join(f"{name}={url}" for name, url in EMBEDDED_UPSTREAMS.items())
        + ".",
        "[NAME=]URL",
        repeatable=True,
    ),
    Option("data_dir", parse_str, None, "Directory for durable state.", "DIR"),
    Option("log_level", choice("debug", "info", "warning", "error"), "info", "Log level.", "LEVEL"),
    Option("log_format", choice("text", "json"), "text", "Log line format.", "FORMAT"),
    Option(
        "log_bodies",
        parse_bool,
        False,
        "Debug only: log request bodies (credentials redacted, long bodies truncated).",
        is_flag=True,
    ),
    Option(
        "max_body_mb",
        parse_positive_float,
        64.0,
        "Largest request body accepted, in MiB; larger ones get 413.",
        "MB",
    ),
    Option(
        "connect_timeout",
        parse_positive_float,
        10.0,
        "Seconds to open a connection to an upstream (TCP and TLS) before answering 504. "
        "Waiting for a free connection of a full pool (upstream_pool_size) is not counted.",
        "SECONDS",
    ),
    Option(
        "read_timeout",
        parse_positive_float,
        600.0,
        "Seconds an upstream may stay silent (before its headers or between two chunks), or "
        "leave the request's body unread, before the request fails with 504. Streams have no "
        "total time limit.",
        "SECONDS",
    ),
    Option(
        "upstream_pool_size",
        parse_non_negative_int,
        0,
        "Most concurrent connections per upstream; 0, the default, sets no limit (every "
        "stream of every session gets its own). With a limit, a request beyond it waits for a "
        "free connection; the wait is not an upstream failure and never times out by itself.",
        "N",
    ),
    Option(
        "admin_token",
        parse_optional_str,
        None,
        "Token that admin endpoints (the dashboard's data, /stats, /metrics, /expand, /mcp, "
        "/memory, /sessions) accept as 'Authorization: Bearer TOKEN' from any address. "
        "Without it they answer loopback clients only.",
        "TOKEN",
    ),
    Option(
        "allowed_hosts",
        parse_host_list,
        [],
        "Host names (NAME or NAME:PORT) under which the dashboard and admin endpoints answer, "
        "besides loopback (localhost, 127.0.0.1, [::1]); a request naming any other Host gets "
        "403, which defeats DNS rebinding. Add the name clients use to reach the proxy, e.g. "
        "'deepmem' for another container. '*' accepts any Host.",
        "NAME,...",
    ),
    Option(
        "compress",
        parse_bool,
        True,
        "Rewrite requests: compression, memory injection and nudges, the compaction prompt. "
        "Off: every body goes upstream byte for byte; the proxy still counts, reports, captures "
        "notes and writes checkpoints.",
        "BOOL",
    ),
    Option(
        "retention_days",
        parse_positive_float,
        30.0,
        "Days an original stays expandable after the last request that referenced it.",
        "DAYS",
    ),
    Option(
        "max_sessions",
        parse_positive_int,
        1000,
        "Sessions kept in memory for statistics; the least recently seen go first.",
        "N",
    ),
)
# The one list, in the order the documentation shows it: the server's own settings, then
# each part of the request path's, declared in its module.
OPTIONS: tuple[Option, ...] = (
    *SERVER_OPTIONS,
    *stores.OPTIONS,
    *cluster.OPTIONS,
    *projects.OPTIONS,
    *memory_api.OPTIONS,
    *compression.OPTIONS,
    *opt_out.OPTIONS,
    *compaction.OPTIONS,
    *injections.OPTIONS,
    *prices.OPTIONS,
)

OPTIONS_BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    url: str  # base URL without a trailing slash

    @property
    def public_url(self) -> str:
        """The URL as pages and logs show it: no userinfo, no key-like query parameters."""
        return redact_text(self.url)

    @property
    def prefix(self) -> str:
        """The first path segment that routes to this upstream."""
        return DEFAULT_PREFIX if self.name == DEFAULT_UPSTREAM_NAME else self.name


def _default(name: str) -> Any:
    """The default ``OPTIONS`` declares for ``name``, as ``Settings`` holds it (a list as a
    tuple): each default is written once, in its option."""
    value = OPTIONS_BY_NAME[name].default
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting, resolved. Defaults are the ones ``OPTIONS`` declares (``_default``);
    ``load_settings`` also fills the upstreams, the data dir and the allowed roots."""

    host: str = _default("host")
    port: int = _default("port")
    upstreams: tuple[Upstream, ...] = field(default_factory=tuple)
    data_dir: Path = field(default_factory=lambda: Path(_default_data_dir()))
    log_level: str = _default("log_level")
    log_format: str = _default("log_format")
    log_bodies: bool = _default("log_bodies")
    max_body_mb: float = _default("max_body_mb")
    connect_timeout: float = _default("connect_timeout")
    read_timeout: float = _default("read_timeout")
    upstream_pool_size: int = _default("upstream_pool_size")
    admin_token: str | None = _default("admin_token")
    allowed_hosts: tuple[str, ...] = _default("allowed_hosts")
    max_sessions: int = _default("max_sessions")
    compress: bool = _default("compress")
    tail_tokens: int = _default("tail_tokens")
    min_output_tokens: int = _default("min_output_tokens")
    compress_live_turn: bool = _default("compress_live_turn")
    pressure_thresholds: tuple[int, ...] = _default("pressure_thresholds")
    protected_tools: tuple[str, ...] = _default("protected_tools")
    relay_models: tuple[str, ...] = _default("relay_models")
    relay_sessions: tuple[str, ...] = _default("relay_sessions")
    retention_days: float = _default("retention_days")
    state_url: str | None = _default("state_url")
    replica_name: str | None = _default("replica_name")
    cache_ttl: float = _default("cache_ttl")
    project_dir: Path | None = None  # unset, as its option says
    allowed_roots: tuple[Path, ...] = _default("allowed_roots")
    memory_dir_name: str = _default("memory_dir_name")
    memory_inject: bool = _default("memory_inject")
    memory_captures: bool = _default("memory_captures")
    memory_nudges: bool = _default("memory_nudges")
    memory_similarity: float = _default("memory_similarity")
    memory_tokenizer: str = _default("memory_tokenizer")
    memory_semantic: str = _default("memory_semantic")
    memory_stable_tokens: int = _default("memory_stable_tokens")
    memory_recall_tokens: int = _default("memory_recall_tokens")
    memory_first_recall_tokens: int = _default("memory_first_recall_tokens")
    nudge_cooldown_turns: int = _default("nudge_cooldown_turns")
    pressure_nudge_tokens: int = _default("pressure_nudge_tokens")
    checkpoints: bool = _default("checkpoints")
    checkpoint_keep: int = _default("checkpoint_keep")
    compaction_prompt: str = _default("compaction_prompt")
    compaction_compress: bool = _default("compaction_compress")
    resume: bool = _default("resume")
    resume_tokens: int = _default("resume_tokens")
    prices: prices.Prices = field(default_factory=lambda: _default("prices"))
    config_file: Path | None = None

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    def upstream_for_prefix(self, prefix: str) -> Upstream | None:
        for upstream in self.upstreams:
            if upstream.prefix == prefix:
                return upstream
        return None


def parse_upstreams(specs: Sequence[str]) -> tuple[Upstream, ...]:
    """Merge ``[NAME=]URL`` specs over the embedded upstreams, by name."""
    table = dict(EMBEDDED_UPSTREAMS)
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = DEFAULT_UPSTREAM_NAME, spec
        name = name.strip().lower()
        url = url.strip().rstrip("/")
        if not UPSTREAM_NAME.match(name):
            raise ConfigError(f"upstream name {name!r}: use lowercase letters, digits, - _ .")
        if name in RESERVED_NAMES:
            raise ConfigError(f"upstream name {name!r} is reserved for the proxy's own routes")
        if not re.match(r"^https?://[^/\s]+", url):
            raise ConfigError(f"upstream {spec!r}: expected an http:// or https:// URL")
        table[name] = url
    return tuple(Upstream(name, url) for name, url in table.items())


def add_arguments(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """Add one flag per option (or per option named in ``only``: a subcommand that reads few
    settings offers only those); unset flags stay absent so lower layers can apply."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"TOML file with settings (env {ENV_PREFIX}CONFIG).",
    )
    for option in OPTIONS if only is None else [OPTIONS_BY_NAME[name] for name in only]:
        text = f"{option.help} (env {option.env}; default: {_describe_default(option)})"
        if option.is_flag:
            parser.add_argument(
                option.flag,
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
                help=text,
            )
        elif option.repeatable:
            parser.add_argument(
                option.flag,
                action="append",
                metavar=option.metavar,
                default=argparse.SUPPRESS,
                help=text,
            )
        else:
            parser.add_argument(
                option.flag, metavar=option.metavar, default=argparse.SUPPRESS, help=text
            )


def _describe_default(option: Option) -> str:
    if option.name == "data_dir":
        return "$XDG_DATA_HOME/deepmem, else ~/.local/share/deepmem"
    if option.name == "upstream":
        return "the embedded upstreams"
    if option.name == "allowed_roots":
        return "the user's home directory"
    if option.name == "allowed_hosts":
        return "loopback names only"
    if option.name == "prices":
        return "the built-in list prices"
    if option.default is None:
        return "unset"
    return str(option.default).lower() if isinstance(option.default, bool) else str(option.default)


_PROSE_DEFAULTS = ("upstream", "allowed_roots", "allowed_hosts", "prices")


def options_markdown() -> str:
    """The configuration table of the README, generated from ``OPTIONS``."""
    rows = ["| key | flag / environment | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        flag = option.flag + (f" {option.metavar}" if option.metavar else "")
        text = option.help.replace("|", "\\|")
        default = _describe_default(option)
        if option.default is not None and option.name not in _PROSE_DEFAULTS:
            default = f"`{default}`"
        rows.append(f"| `{option.name}` | `{flag}`<br>`{option.env}` | {default} | {text} |")
    return "\n".join(rows) + "\n"


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        if path.exists() and not path.is_file():  # a directory, or a FIFO that would block
            raise ConfigError(f"config file {path} is not a regular file")
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc.reason}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - set(OPTIONS_BY_NAME))
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(OPTIONS_BY_NAME)}"
        )
    return data


@dataclass(frozen=True, slots=True)
class Source:
    """Where a setting's value came from: ``kind`` is flag, environment, config file or
    default; ``where`` names the flag, the variable or the file."""

    kind: str
    where: str | None = None

    def __str__(self) -> str:
        return self.kind if self.where is None else f"{self.kind} {self.where}"


DEFAULT_SOURCE = Source("default")


def load_settings(
    flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve every option: flags > environment > config file > defaults."""
    return load_settings_with_sources(flags, environ)[0]


def load_settings_with_sources(
    flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, dict[str, Source]]:
    """``load_settings``, and where each option's value came from (by option name, plus
    ``config`` for the config file itself)."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    config_flag = flags.pop("config", None)
    config_value = config_flag or environ.get(ENV_PREFIX + "CONFIG")
    config_file = Path(config_value).expanduser() if config_value else None
    file_values = _read_config_file(config_file) if config_file else {}
    sources = {"config": DEFAULT_SOURCE}
    if config_flag:
        sources["config"] = Source("flag", "--config")
    elif config_value:
        sources["config"] = Source("environment", ENV_PREFIX + "CONFIG")

    resolved: dict[str, Any] = {}
    for option in OPTIONS:
        layers = (
            ("flag " + option.flag, Source("flag", option.flag), flags.get(option.name)),
            (
                "environment " + option.env,
                Source("environment", option.env),
                environ.get(option.env),
            ),
            (
                f"config file key {option.name!r}",
                Source("config file", str(config_file)),
                file_values.get(option.name),
            ),
        )
        for described, source, raw in layers:
            if raw is None:
                continue
            if option.repeatable and isinstance(raw, list) and source.kind == "flag":
                raw = [part for item in raw for part in parse_list(item)]
            try:
                resolved[option.name] = option.parse(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{described}: {exc}") from exc
            sources[option.name] = source
            break
        else:
            resolved[option.name] = option.default
            sources[option.name] = DEFAULT_SOURCE

    upstream_specs = resolved.pop("upstream")
    data_dir = resolved.pop("data_dir") or _default_data_dir()
    for name in (
        "pressure_thresholds",
        "protected_tools",
        "allowed_hosts",
        "relay_models",
        "relay_sessions",
    ):
        resolved[name] = tuple(resolved[name])
    roots = resolved.pop("allowed_roots") or [str(Path.home())]
    resolved["allowed_roots"] = tuple(Path(root).expanduser() for root in roots)
    project_dir = resolved.pop("project_dir")
    resolved["project_dir"] = Path(project_dir).expanduser() if project_dir else None
    known = {f.name for f in fields(Settings)}
    settings = Settings(
        upstreams=parse_upstreams(upstream_specs),
        data_dir=Path(data_dir).expanduser(),
        config_file=config_file,
        **{name: value for name, value in resolved.items() if name in known},
    )
    return settings, sources


# --- start-up warnings: what a new user gets wrong without an error ----------------------------

# Known providers and the path their API lives under. A base URL without it answers 404 on
# every chat route. DeepSeek is absent on purpose: it serves its API with and without /v1.
PROVIDER_VERSION_PATHS: dict[str, str] = {
    "api.openai.com": "/v1",
    "api.anthropic.com": "/v1",
    "api.moonshot.ai": "/v1",
    "api.moonshot.cn": "/v1",
    "api.mistral.ai": "/v1",
    "api.groq.com": "/openai/v1",
    "openrouter.ai": "/api/v1",
    "generativelanguage.googleapis.com": "/v1beta/openai",
    "api.together.xyz": "/v1",
    "api.x.ai": "/v1",
    "api.fireworks.ai": "/inference/v1",
}


def suggested_upstream_url(url: str) -> str | None:
    """The likely intended base URL when ``url`` names a known provider without the path its
    API lives under (``https://api.openai.com`` → ``https://api.openai.com/v1``); else None."""
    parts = urllib.parse.urlsplit(url)
    expected = PROVIDER_VERSION_PATHS.get((parts.hostname or "").lower())
    if expected is None or parts.path.rstrip("/").endswith(expected):
        return None
    return f"{parts.scheme}://{parts.hostname}{expected}"


def upstream_hint(upstream: Upstream) -> str:
    """What to check when ``upstream`` answers 404 on a chat route."""
    suggestion = suggested_upstream_url(upstream.url)
    if suggestion is not None:
        return (
            f"upstream '{upstream.name}' is {upstream.public_url}; this provider's API "
            f"lives at {suggestion} (set --upstream to that)"
        )
    return (
        f"upstream '{upstream.name}' is {upstream.public_url}; check that it is the "
        "provider's API base URL including its version path (often /v1), as OpenCode's baseURL "
        "would be"
    )


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``DEEP_MEMORY_*`` variable that is no setting (a typo is otherwise
    silently ignored), naming the closest known one."""
    known = sorted({option.name.upper() for option in OPTIONS} | {"CONFIG"})
    warnings = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :] not in known:
            # Compared without the common prefix, which would make any two names look alike.
            close = difflib.get_close_matches(name[len(ENV_PREFIX) :], known, n=1, cutoff=0.6)
            hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
            warnings.append(f"environment variable {name} is not a deepmem setting, ignored{hint}")
    return warnings


def startup_warnings(settings: Settings, environ: Mapping[str, str] | None = None) -> list[str]:
    """Likely mistakes in the settings that are no error: unknown ``DEEP_MEMORY_*``
    variables and upstream URLs of known providers without their version path."""
    warnings = unknown_environment(os.environ if environ is None else environ)
    for upstream in settings.upstreams:
        suggestion = suggested_upstream_url(upstream.url)
        if suggestion is not None:
            named = "" if upstream.name == DEFAULT_UPSTREAM_NAME else upstream.name + "="
            warnings.append(
                f"upstream '{upstream.name}' is {upstream.public_url}, without the path "
                "this provider's API lives under: requests will get 404; did you mean "
                f"--upstream {named}{suggestion}?"
            )
    return warnings
