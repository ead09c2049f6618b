"""What deepmem knows about OpenCode's configuration, for ``deepmem init`` and ``deepmem
doctor`` alike: which files OpenCode reads, in which order (``config_search_path``), how it
reads them (``read_config``: JSONC) and merges them (``merge_configs``, ``{env:NAME}`` by
``substitute_env``); and the edits ``deepmem init`` plans: which providers a user has, the
upstream deepmem needs for each, the new text of ``opencode.json`` and of deepmem's TOML file.

Apart from finding and reading the files, pure functions over texts and mappings (the command
in ``proxy.init_cli`` writes the files).
"""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from proxy import jsonc
from proxy.config import (
    DEFAULT_PREFIX,
    DEFAULT_UPSTREAM_NAME,
    EMBEDDED_UPSTREAMS,
    RESERVED_NAMES,
    UPSTREAM_NAME,
)

SCHEMA_URL = "https://opencode.ai/config.json"
MCP_NAME = "deepmem"
BACKUP_SUFFIX = ".deepmem-backup"


@dataclass(frozen=True, slots=True)
class BuiltinProvider:
    url: str  # the API base URL OpenCode's provider uses when no baseURL is set
    env: str  # the environment variable that holds its key


# OpenCode's built-in providers whose API deepmem reads (Anthropic messages, OpenAI Responses,
# OpenAI-compatible chat completions), with the base URL each uses by default.
BUILTIN_PROVIDERS: dict[str, BuiltinProvider] = {
    "anthropic": BuiltinProvider(EMBEDDED_UPSTREAMS["anthropic"], "ANTHROPIC_API_KEY"),
    "openai": BuiltinProvider(EMBEDDED_UPSTREAMS["openai"], "OPENAI_API_KEY"),
    "deepseek": BuiltinProvider("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "openrouter": BuiltinProvider("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": BuiltinProvider("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "mistral": BuiltinProvider("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
    "xai": BuiltinProvider("https://api.x.ai/v1", "XAI_API_KEY"),
}


class InitError(ValueError):
    """``deepmem init`` cannot go on; the message says why, in one line."""


class ConfigFileError(ValueError):
    """A file cannot be read, or is not the JSONC object OpenCode's configuration is; the
    message names it and says why (where, for a syntax error), in one line."""


# ---------------------------------------------------------------- where the files are


def global_config_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "opencode"


def global_config_files(environ: Mapping[str, str]) -> list[Path]:
    """The global files OpenCode reads, in its load order (a later one wins)."""
    directory = global_config_dir(environ)
    return [directory / name for name in ("config.json", "opencode.json", "opencode.jsonc")]


def custom_config_file(environ: Mapping[str, str]) -> Path | None:
    value = environ.get("OPENCODE_CONFIG")
    return Path(value).expanduser() if value else None


def project_config_files(directory: Path) -> list[Path]:
    return [directory / "opencode.json", directory / "opencode.jsonc"]


def editable_file(candidates: Sequence[Path]) -> Path:
    """The file to edit among ``candidates`` (load order): the last that exists, so that the
    edit wins; else the ``opencode.json`` to create."""
    existing = [path for path in candidates if path.exists()]
    if existing:
        return existing[-1]
    return next(path for path in candidates if path.name == "opencode.json")


def project_chain(directory: Path) -> list[Path]:
    """The project files OpenCode reads when run in ``directory``: those of each directory
    from the project's root down to ``directory``, farthest first. The root is the git root
    (the nearest directory holding ``.git``), else the filesystem root: outside a repository
    OpenCode's project is ``/``."""
    directory = directory.absolute()
    chain: list[Path] = []
    for each in (directory, *directory.parents):
        chain.append(each)
        if (each / ".git").exists():
            break
    return [path for each in reversed(chain) for path in project_config_files(each)]


class ConfigPath(NamedTuple):
    path: Path
    label: str  # GLOBAL | CUSTOM | PROJECT


GLOBAL, CUSTOM, PROJECT = "global", "OPENCODE_CONFIG", "project"


def config_search_path(environ: Mapping[str, str], workdir: Path) -> list[ConfigPath]:
    """Every file OpenCode reads its configuration from when run in ``workdir``, existing or
    not, in its load order (a later file wins): the global files, ``$OPENCODE_CONFIG``, then
    the project's (``project_chain``). A file reached twice (``$OPENCODE_CONFIG`` naming the
    global file, a symlink) counts once, at its first place."""
    ordered = [ConfigPath(path, GLOBAL) for path in global_config_files(environ)]
    custom = custom_config_file(environ)
    if custom is not None:
        ordered.append(ConfigPath(custom, CUSTOM))
    ordered += [ConfigPath(path, PROJECT) for path in project_chain(workdir)]
    seen: set[str] = set()
    unique: list[ConfigPath] = []
    for location in ordered:
        real = os.path.realpath(location.path)
        if real not in seen:
            seen.add(real)
            unique.append(location)
    return unique


def existing_config_files(environ: Mapping[str, str], workdir: Path) -> list[ConfigPath]:
    """The files of ``config_search_path`` that exist."""
    return [location for location in config_search_path(environ, workdir) if location.path.exists()]


def auth_file(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "~")) / ".local/share")
    return Path(base).expanduser() / "opencode" / "auth.json"


# ---------------------------------------------------------------- providers


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """One of OpenCode's configuration files as read: ``text`` is None when it is absent."""

    path: Path
    label: str  # global | OPENCODE_CONFIG | project
    text: str | None
    data: dict[str, Any] = field(default_factory=dict)


def read_text(path: Path) -> str | None:
    """The file's text, None when it does not exist; ``ConfigFileError`` when it cannot be
    read."""
    try:
        if path.exists() and not path.is_file():
            raise ConfigFileError(f"{path} is not a regular file")
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None
    except OSError as exc:
        raise ConfigFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_config(path: Path, label: str, text: str | None) -> ConfigFile:
    """``text``, the contents of OpenCode's file ``path``, parsed; ``ConfigFileError`` when it
    is not a JSONC object."""
    if text is None or not text.strip():
        return ConfigFile(path, label, text, {})
    try:
        data = jsonc.loads(text)
    except jsonc.JsoncError as exc:
        raise ConfigFileError(f"{path} is not valid JSONC: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: the top level is not an object")
    return ConfigFile(path, label, text, data)


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    name: str
    why: tuple[str, ...]  # where it was found: "global config", "logged in", "ANTHROPIC_API_KEY"
    base_url: str | None  # the baseURL in effect, None when OpenCode's default applies

    @property
    def in_use(self) -> bool:
        return self.why != ("built-in",)


def merge_configs(configs: Sequence[ConfigFile]) -> dict[str, Any]:
    """The configuration OpenCode runs with: ``configs`` (in load order) merged deeply, as it
    merges its files: an object merges key by key, any other value a later file sets replaces
    the earlier one."""
    merged: dict[str, Any] = {}
    for config in configs:
        merged = _merge(merged, config.data)
    return merged


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in override.items():
        earlier = result.get(key)
        if isinstance(earlier, dict) and isinstance(value, dict):
            result[key] = _merge(earlier, value)
        else:
            result[key] = value
    return result


def source_of(configs: Sequence[ConfigFile], path: Sequence[str]) -> ConfigFile | None:
    """The file the merged value at ``path`` comes from: the last that sets it."""
    for config in reversed(configs):
        if jsonc.get_value(config.data, path) is not None:
            return config
    return None


def provider_base_url(data: Mapping[str, Any], name: str) -> str | None:
    """Provider ``name``'s ``options.baseURL`` in a configuration, when it is a string."""
    value = jsonc.get_value(data, ("provider", name, "options", "baseURL"))
    return value if isinstance(value, str) else None


def known_providers(
    configs: Sequence[ConfigFile], logged_in: Sequence[str], environ: Mapping[str, str]
) -> list[ProviderInfo]:
    """The providers in use — named by the configuration, logged in to, or with a key in the
    environment — by name, then the other built-in providers."""
    why: dict[str, list[str]] = {}
    for config in configs:
        providers = config.data.get("provider")
        for name in providers if isinstance(providers, dict) else {}:
            why.setdefault(name, []).append(f"{config.label} config")
    merged = merge_configs(configs)
    base_urls = {name: provider_base_url(merged, name) for name in why}
    for name in logged_in:
        why.setdefault(name, []).append("logged in")
    for name, builtin in BUILTIN_PROVIDERS.items():
        if environ.get(builtin.env):
            why.setdefault(name, []).append(builtin.env)
    found = [
        ProviderInfo(name, tuple(dict.fromkeys(w)), base_urls.get(name)) for name, w in why.items()
    ]
    found.sort(key=lambda p: p.name)
    rest = [
        ProviderInfo(name, ("built-in",), None)
        for name in sorted(BUILTIN_PROVIDERS)
        if name not in why
    ]
    return found + rest


def route_name(provider: str) -> str:
    """The deepmem upstream name (and path segment) for an OpenCode provider id."""
    name = re.sub(r"[^a-z0-9_.-]+", "-", provider.lower()).strip("-_.")[:55] or "provider"
    if name in RESERVED_NAMES:
        name += "-provider"
    if not UPSTREAM_NAME.match(name):
        name = "p-" + name
    return name


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _port(parts: urllib.parse.SplitResult) -> int:
    """The URL's port (its scheme's when it names none); ``ValueError`` when it is no port."""
    return parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    """Where OpenCode's URLs reach deepmem: its port, and the host names that lead there
    (None: any name, as when it binds every address)."""

    port: int
    hosts: frozenset[str] | None

    @classmethod
    def of_url(cls, proxy_url: str) -> ProxyAddress:
        """The address of a URL of deepmem's: its host, or any loopback name for one of them."""
        parts = urllib.parse.urlsplit(proxy_url)
        host = parts.hostname or ""
        return cls(_port(parts), LOOPBACK_NAMES if host in LOOPBACK_NAMES else frozenset({host}))

    def parse(self, url: str) -> urllib.parse.SplitResult | None:
        """``url`` parsed when it is an http(s) URL that reaches deepmem, else None."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = _port(parts)
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or port != self.port:
            return None
        if self.hosts is not None and (parts.hostname or "") not in self.hosts:
            return None
        return parts


def proxy_prefix(url: str, proxy: ProxyAddress) -> str | None:
    """The first segment of ``url``'s path (the upstream prefix deepmem serves it under; "" at
    the root) when ``url`` reaches deepmem, else None."""
    parts = proxy.parse(url)
    return None if parts is None else parts.path.strip("/").partition("/")[0]


def is_proxy_mcp_url(url: str, proxy: ProxyAddress) -> bool:
    """Whether ``url`` is deepmem's MCP endpoint, ``/mcp``."""
    parts = proxy.parse(url)
    return parts is not None and parts.path.rstrip("/") == "/mcp"


def points_at_proxy(url: str, proxy_url: str) -> bool:
    """Whether ``url`` reaches the deepmem at ``proxy_url`` (under any path)."""
    return ProxyAddress.of_url(proxy_url).parse(url) is not None


_ENV_REFERENCE = re.compile(r"\{env:([^}]+)\}")


def substitute_env(text: str, environ: Mapping[str, str]) -> str:
    """OpenCode's ``{env:NAME}`` in ``text``: the variable's value, empty when it is unset."""
    return _ENV_REFERENCE.sub(lambda match: environ.get(match[1], ""), text)


def unset_env(text: str, environ: Mapping[str, str]) -> list[str]:
    """The variables ``text`` names as ``{env:NAME}`` that are unset or empty."""
    return [name for name in _ENV_REFERENCE.findall(text) if not environ.get(name)]


def real_base_url(
    provider: str,
    base_url: str | None,
    backup: ConfigFile | None,
    proxy_url: str,
    environ: Mapping[str, str],
) -> str:
    """The provider's own API base URL: its baseURL when it does not point at deepmem yet,
    else the one the backup of an earlier ``deepmem init`` kept, else the built-in default."""
    candidates = [base_url, provider_base_url(backup.data, provider) if backup else None]
    for candidate in candidates:
        if candidate is None or points_at_proxy(candidate, proxy_url):
            continue
        if "{file:" in candidate:
            raise InitError(
                f"provider {provider}: baseURL {candidate!r} reads a file; write the URL"
            )
        missing = unset_env(candidate, environ)
        if missing:
            raise InitError(
                f"provider {provider}: baseURL {candidate!r} names ${missing[0]}, which is not set"
            )
        url = substitute_env(candidate, environ).rstrip("/")
        if not re.match(r"^https?://[^/\s]+", url):
            raise InitError(f"provider {provider}: baseURL {url!r} is not an http(s) URL")
        return url
    builtin = BUILTIN_PROVIDERS.get(provider)
    if builtin is not None:
        return builtin.url
    raise InitError(
        f"provider {provider} has no options.baseURL and is not a provider deepmem knows; set "
        "its baseURL to the provider's API base URL (with /v1) in opencode.json first"
    )


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Route:
    """One provider through deepmem: OpenCode's baseURL and the upstream deepmem forwards to."""

    provider: str
    upstream: str  # deepmem's upstream name
    upstream_url: str | None  # the provider's own API base URL; None when unknown
    base_url: str  # what OpenCode's baseURL is (now) set to
    changed: bool  # False when the baseURL pointed at deepmem already

    @property
    def embedded(self) -> bool:
        """deepmem serves this upstream with no configuration."""
        return EMBEDDED_UPSTREAMS.get(self.upstream) == self.upstream_url

    @property
    def spec(self) -> str:
        """The ``upstream`` setting for this route, as flags and the TOML file take it."""
        return f"{self.upstream}={self.upstream_url}"


@dataclass(frozen=True, slots=True)
class Plan:
    text: str  # the new text of the OpenCode file (the old one when nothing changes)
    routes: tuple[Route, ...]
    mcp_url: str | None  # the MCP entry's URL, None when it was left out
    notes: tuple[str, ...]


def proxy_route_url(proxy_url: str, upstream: str) -> str:
    return f"{proxy_url.rstrip('/')}/{upstream}"


def plan(
    target: ConfigFile,
    providers: Sequence[str],
    real_urls: Mapping[str, str | None],
    proxy_url: str,
    *,
    mcp: bool = True,
) -> Plan:
    """The target file's new text: each provider's baseURL pointed at deepmem (unless it points
    there already) and deepmem mounted as a remote MCP server (unless an entry reaches its
    ``/mcp`` already). ``real_urls`` holds each provider's own API base URL."""
    text = target.text if target.text and target.text.strip() else None
    if text is None:
        text = '{\n  "$schema": "' + SCHEMA_URL + '"\n}\n'
    data = jsonc.loads(text)
    address = ProxyAddress.of_url(proxy_url)
    routes: list[Route] = []
    notes: list[str] = []
    for provider in providers:
        current = jsonc.get_value(data, ("provider", provider, "options", "baseURL"))
        prefix = proxy_prefix(current, address) if isinstance(current, str) else None
        if isinstance(current, str) and prefix is not None:
            upstream = DEFAULT_UPSTREAM_NAME if prefix in ("", DEFAULT_PREFIX) else prefix
            routes.append(Route(provider, upstream, real_urls[provider], current, changed=False))
            continue
        upstream = route_name(provider)
        base_url = proxy_route_url(proxy_url, upstream)
        text = jsonc.set_value(text, ("provider", provider, "options", "baseURL"), base_url)
        routes.append(Route(provider, upstream, real_urls[provider], base_url, changed=True))
    mcp_url = None
    if mcp:
        mcp_url = proxy_route_url(proxy_url, "mcp")
        entries = data.get("mcp")
        present = [
            name
            for name, entry in (entries.items() if isinstance(entries, dict) else [])
            if isinstance(entry, dict)
            and isinstance(entry.get("url"), str)
            and is_proxy_mcp_url(entry["url"], address)
        ]
        if present:
            mcp_url = jsonc.get_value(data, ("mcp", present[0], "url"))
            if jsonc.get_value(data, ("mcp", present[0], "enabled")) is False:
                notes.append(f"mcp.{present[0]} reaches deepmem's tools but is disabled")
        elif jsonc.get_value(data, ("mcp", MCP_NAME)) is not None:
            text = jsonc.set_value(text, ("mcp", MCP_NAME, "url"), mcp_url)
            text = jsonc.set_value(text, ("mcp", MCP_NAME, "type"), "remote")
        else:
            entry = {"type": "remote", "url": mcp_url, "enabled": True}
            text = jsonc.set_value(text, ("mcp", MCP_NAME), entry)
    _check(target.text, text, routes, mcp_url)
    return Plan(text, tuple(routes), mcp_url, tuple(notes))


def _check(old: str | None, new: str, routes: Sequence[Route], mcp_url: str | None) -> None:
    """The new text parses and says what was planned; a slip of the editor never gets written."""
    data = jsonc.loads(new)
    for route in routes:
        got = jsonc.get_value(data, ("provider", route.provider, "options", "baseURL"))
        if got != route.base_url:
            raise InitError(
                f"internal error: the edited file has baseURL {got!r} for {route.provider}"
            )
    if old and old.strip():
        before = jsonc.loads(old)
        after = jsonc.loads(new)
        for key in set(before) | set(after):
            if key not in ("provider", "mcp") and before.get(key) != after.get(key):
                raise InitError(f"internal error: the edit changed {key!r}")
    if mcp_url is not None and mcp_url not in new:
        raise InitError("internal error: the MCP entry is missing from the edited file")


def pick_upstreams(routes: Sequence[Route]) -> list[Route]:
    """The routes deepmem needs configured: not those its embedded upstreams already serve."""
    return [route for route in routes if route.upstream_url and not route.embedded]


# ---------------------------------------------------------------- deepmem's TOML file


def merge_upstreams_toml(text: str | None, routes: Sequence[Route], path: Path) -> str:
    """deepmem's TOML config with an ``upstream`` entry for each route that needs one.

    An entry of the same name with another URL is replaced in place; new entries are added
    at the end of the ``upstream`` array (created at the end of the file when missing). Other
    lines stay as they are."""
    text = text or ""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InitError(f"{path} is not valid TOML: {exc}") from None
    raw = data.get("upstream", [])
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise InitError(f"{path}: 'upstream' is not a list of strings; edit it by hand")
    existing = dict(_spec(item) for item in raw)
    wanted = [
        route
        for route in routes
        if route.upstream_url is not None
        and existing.get(route.upstream) != route.upstream_url
        and not (route.embedded and route.upstream not in existing)
    ]
    if not wanted:
        return text
    if "upstream" not in data:
        lines = "".join(f'  "{route.spec}",\n' for route in wanted)
        separator = "" if not text or text.endswith("\n") else "\n"
        new = f"{text}{separator}upstream = [\n{lines}]\n"
    else:
        new = _edit_upstream_array(text, wanted, path)
    expected = dict(existing)
    expected.update({r.upstream: r.upstream_url for r in wanted if r.upstream_url is not None})
    merged = tomllib.loads(new)
    got = dict(_spec(item) for item in merged.get("upstream", []))
    others = {key: value for key, value in merged.items() if key != "upstream"}
    if got != expected or others != {k: v for k, v in data.items() if k != "upstream"}:
        raise InitError(f"{path}: could not add the upstreams safely; add them by hand")
    return new


def _spec(spec: str) -> tuple[str, str]:
    """The (name, URL) of an ``upstream`` entry, read as ``proxy.config.parse_upstreams`` does."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = DEFAULT_UPSTREAM_NAME, spec
    return name.strip().lower(), url.strip().rstrip("/")


_KEY_LINE = re.compile(r"""^[ \t]*(?:upstream|"upstream"|'upstream')[ \t]*=[ \t]*""", re.MULTILINE)


def _edit_upstream_array(text: str, wanted: Sequence[Route], path: Path) -> str:
    matches = list(_KEY_LINE.finditer(text))
    if len(matches) != 1 or not text.startswith("[", matches[0].end()):
        raise InitError(
            f"{path}: cannot find the 'upstream = [...]' array; add the upstreams by hand"
        )
    pos = matches[0].end() + 1
    items: list[tuple[int, int, str]] = []  # start, end, value of each string
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if text.startswith("#", pos):
            end = text.find("\n", pos)
            pos = len(text) if end == -1 else end
            continue
        if pos >= len(text):
            raise InitError(f"{path}: the 'upstream' array does not end")
        if text[pos] == "]":
            break
        quote = text[pos]
        if quote not in "\"'" or text.startswith(quote * 3, pos):
            raise InitError(f"{path}: cannot edit this 'upstream' array; add the upstreams by hand")
        end = pos + 1
        while end < len(text) and text[end] != quote:
            end += 2 if quote == '"' and text[end] == "\\" else 1
        end += 1
        items.append((pos, end, tomllib.loads("v = " + text[pos:end])["v"]))
        pos = end
    by_name = {_spec(value)[0]: (start, end) for start, end, value in items}
    edits: list[tuple[int, int, str]] = []
    added: list[str] = []
    for route in wanted:
        quoted = f'"{route.spec}"'
        if route.upstream in by_name:
            start, end = by_name[route.upstream]
            edits.append((start, end, quoted))
        else:
            added.append(quoted)
    if added:
        edits.append(_array_insertion(text, matches[0].end(), pos, items, added))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _array_insertion(
    text: str, opening: int, closing: int, items: Sequence[tuple[int, int, str]], added: list[str]
) -> tuple[int, int, str]:
    """The insertion that appends ``added`` to the TOML array spanning ``opening``..``closing``
    (the offsets of its brackets), in its layout: one item a line, or all on one line."""
    multiline = "\n" in text[opening:closing]
    if not items:
        if multiline:
            return (opening + 1, opening + 1, "".join(f"\n  {item}," for item in added))
        return (opening + 1, opening + 1, ", ".join(added))
    after = items[-1][1]
    rest = text[after:closing]
    comma = ","
    if rest.lstrip(" \t\r\n").startswith(","):
        after = text.index(",", after) + 1
        comma = ""
    if not multiline:
        return (after, after, comma + "".join(f" {item}," for item in added).rstrip(","))
    line_start = text.rfind("\n", 0, items[-1][0]) + 1
    indent = text[line_start : items[-1][0]]
    indent = indent if not indent.strip(" \t") else "  "
    lines = "".join(f"\n{indent}{item}," for item in added)
    line_end = text.find("\n", after)
    tail = text[after:line_end] if 0 <= line_end < closing else None
    if tail is not None and (not tail.strip() or tail.strip().startswith("#")):
        return (after, line_end, comma + tail + lines)
    return (after, after, comma + lines)


def validate_proxy_url(url: str) -> str:
    """``url`` without a trailing slash; ``InitError`` unless it is http(s)://HOST[:PORT]:
    deepmem serves its routes at the root."""
    parts = urllib.parse.urlsplit(url)
    try:
        _port(parts)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    if not valid or parts.path.strip("/") or parts.query or parts.fragment:
        raise InitError(f"--proxy-url {url!r}: expected http://HOST:PORT (deepmem's address)")
    return url.rstrip("/")


def logged_in_providers(text: str | None) -> list[str]:
    """The provider ids of OpenCode's auth.json (only the names; the keys are not read)."""
    if not text:
        return []
    try:
        data = jsonc.loads(text)
    except jsonc.JsoncError:
        return []
    return sorted(data) if isinstance(data, dict) else []
