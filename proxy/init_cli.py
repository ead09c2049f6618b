"""``deepmem init``: route OpenCode's providers through deepmem by editing its config file.

The editing itself is pure (``proxy.opencode_config`` and ``proxy.jsonc``); this module finds
and reads the files, asks which providers to route when it may, and writes atomically after
a backup.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from proxy import jsonc
from proxy.cli_io import error, interactive
from proxy.config import OPTIONS_BY_NAME
from proxy.opencode_config import (
    BACKUP_SUFFIX,
    CUSTOM,
    GLOBAL,
    PROJECT,
    ConfigFile,
    ConfigFileError,
    ConfigPath,
    InitError,
    Plan,
    ProviderInfo,
    Route,
    auth_file,
    config_search_path,
    custom_config_file,
    editable_file,
    global_config_files,
    known_providers,
    logged_in_providers,
    merge_upstreams_toml,
    pick_upstreams,
    plan,
    points_at_proxy,
    project_config_files,
    provider_base_url,
    read_config,
    read_text,
    real_base_url,
    validate_proxy_url,
)

USAGE = 2
FAILED = 1
DEFAULT_PROXY_URL = f"http://127.0.0.1:{OPTIONS_BY_NAME['port'].default}"

DESCRIPTION = f"""\
Route OpenCode's providers through deepmem. For each provider you pick, set
provider.<id>.options.baseURL to {DEFAULT_PROXY_URL}/<id>, and mount deepmem's tools as the
remote MCP server "deepmem" ({DEFAULT_PROXY_URL}/mcp). The edits are merged into the file:
comments, trailing commas and every other setting stay exactly as they are.

Which file: --opencode-config FILE; else, with --project [DIR], the project's opencode.jsonc
or opencode.json; else $OPENCODE_CONFIG; else the global file ($XDG_CONFIG_HOME/opencode/,
else ~/.config/opencode/: opencode.jsonc, opencode.json or config.json; opencode.json is
created when there is none).

Which providers: --provider NAME (repeatable) or --all (every provider your configuration
names, you logged in to with `opencode auth login`, or have a key for in the environment);
without either, it asks on a terminal and fails otherwise. --list shows them.

Upstreams: each provider gets a deepmem upstream of its own name, served at /<id>/ (so one
proxy serves them all; the default /v1 is left alone), whose URL is where the provider really
is: its baseURL before the change, or OpenCode's default for a built-in provider. anthropic
and openai need nothing: deepmem has them built in. For the others it prints the
`upstream = [...]` line for deepmem's TOML file and the matching
`deepmem serve --upstream NAME=URL` flags; with --deepmem-config FILE it merges them into
that file instead (created when missing): then run `deepmem serve --config FILE`.

Safety: every file is written atomically (a temporary file, then a rename), after a copy of
the file as it was before the first `deepmem init` in FILE{BACKUP_SUFFIX}. --dry-run prints
the diff and writes nothing; running it again changes nothing; --undo puts the backups back
(what changed in the files since is lost: --undo --dry-run shows it).
"""


def add_init_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init",
        help="route OpenCode's providers through deepmem (edits opencode.json)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument(
        "--provider",
        metavar="NAME",
        action="append",
        default=[],
        help="an OpenCode provider id to route through deepmem (repeatable)",
    )
    init.add_argument("--all", action="store_true", help="every provider in use (see above)")
    init.add_argument("--list", action="store_true", help="show the providers and stop")
    init.add_argument(
        "--project",
        metavar="DIR",
        nargs="?",
        const=".",
        default=None,
        help="edit the project's opencode.json(c) in DIR (default: the current directory)",
    )
    init.add_argument(
        "--opencode-config", metavar="FILE", type=Path, default=None, help="edit FILE"
    )
    init.add_argument(
        "--proxy-url",
        metavar="URL",
        default=DEFAULT_PROXY_URL,
        help=f"where OpenCode reaches deepmem (default: {DEFAULT_PROXY_URL})",
    )
    init.add_argument(
        "--deepmem-config",
        metavar="FILE",
        type=Path,
        default=None,
        help="merge the upstreams deepmem needs into this TOML file instead of printing them",
    )
    init.add_argument("--no-mcp", action="store_true", help="do not add the MCP entry")
    init.add_argument(
        "--dry-run", action="store_true", help="print the diff of every change; write nothing"
    )
    init.add_argument("--undo", action="store_true", help="put the backups back")


# ---------------------------------------------------------------- files


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` (the file a symlink names, when it is one) with ``text``: a temporary
    file in the same directory, synced, then renamed over it, keeping its permissions."""
    real = Path(os.path.realpath(path))
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = real.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    handle, temporary = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, real)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def backup_path(path: Path) -> Path:
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + BACKUP_SUFFIX)


def _write_with_backup(path: Path, old: str | None, new: str) -> None:
    backup = backup_path(path)
    if not backup.exists():
        # An empty backup stands for "there was no file": --undo then removes it.
        write_atomically(backup, old or "")
    write_atomically(path, new)


def diff(path: Path, old: str | None, new: str | None) -> str:
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        (new or "").splitlines(keepends=True),
        fromfile=f"{path}" if old is not None else "/dev/null",
        tofile=f"{path}" if new is not None else "/dev/null",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


# ---------------------------------------------------------------- which file, which providers


def target_file(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[Path, str]:
    if args.opencode_config is not None:
        return args.opencode_config.expanduser(), "given"
    if args.project is not None:
        directory = Path(args.project).expanduser()
        if not directory.is_dir():
            raise InitError(f"--project {args.project}: no such directory")
        return editable_file(project_config_files(directory)), PROJECT
    custom = custom_config_file(environ)
    if custom is not None:
        return custom, CUSTOM
    return editable_file(global_config_files(environ)), GLOBAL


def load_layers(
    target: Path, project_dir: Path, environ: Mapping[str, str]
) -> tuple[list[ConfigFile], ConfigFile]:
    """OpenCode's config files in load order (only those that exist, plus the target) and
    the target among them."""
    ordered = config_search_path(environ, project_dir)
    real_target = os.path.realpath(target)
    if not any(os.path.realpath(location.path) == real_target for location in ordered):
        ordered.append(ConfigPath(target, "given"))
    layers: list[ConfigFile] = []
    chosen: ConfigFile | None = None
    for path, label in ordered:
        is_target = os.path.realpath(path) == real_target
        if not (is_target or path.exists()):
            continue
        config = read_config(path, label, read_text(path))
        layers.append(config)
        if is_target:
            chosen = config
    assert chosen is not None
    return layers, chosen


def _show(providers: Sequence[ProviderInfo], proxy_url: str) -> None:
    width = max(len(p.name) for p in providers)
    for number, provider in enumerate(providers, 1):
        if provider.base_url and points_at_proxy(provider.base_url, proxy_url):
            where = f"through deepmem ({provider.base_url})"
        else:
            where = provider.base_url or "default URL"
        print(f"{number:>3}. {provider.name:<{width}}  {', '.join(provider.why)}; {where}")


def _ask(providers: Sequence[ProviderInfo], proxy_url: str) -> list[str]:
    _show(providers, proxy_url)
    default = [p.name for p in providers if p.in_use]
    hint = f"Enter for {', '.join(default)}" if default else "none is in use yet"
    print(
        f"Route which providers through deepmem? Numbers or names, comma-separated ({hint}): ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return []
    if not answer:  # end of input (Ctrl-D): no answer is no consent
        print(file=sys.stderr)
        return []
    words = [w for w in answer.replace(",", " ").split() if w]
    if not words:
        return default
    picked = []
    for word in words:
        if word.isdigit() and 1 <= int(word) <= len(providers):
            picked.append(providers[int(word) - 1].name)
        else:
            picked.append(word)
    return picked


def choose(
    args: argparse.Namespace, providers: Sequence[ProviderInfo], proxy_url: str
) -> list[str]:
    if args.provider:
        picked = list(args.provider)
    elif args.all:
        picked = [p.name for p in providers if p.in_use]
        if not picked:
            raise InitError("--all: no provider is in use (none configured, logged in or keyed)")
    elif interactive():
        picked = _ask(providers, proxy_url)
        if not picked:
            raise InitError("no provider picked; nothing changed")
    else:
        names = ", ".join(p.name for p in providers)
        raise InitError(
            f"name the providers to route: --provider NAME (repeatable) or --all; known: {names}"
        )
    known = {p.name for p in providers}
    unknown = [name for name in picked if name not in known]
    if unknown:
        raise InitError(
            f"unknown provider {unknown[0]!r}: it is not in your OpenCode config and not "
            f"built in; known: {', '.join(sorted(known))}"
        )
    return list(dict.fromkeys(picked))


# ---------------------------------------------------------------- running


def run_init(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    if args.deepmem_config is not None:
        args.deepmem_config = args.deepmem_config.expanduser()
    try:
        if args.undo:
            return _undo(args, environ)
        return _init(args, environ)
    except (InitError, ConfigFileError) as exc:
        return error(str(exc), FAILED)
    except jsonc.JsoncError as exc:
        return error(f"cannot edit the file: {exc}", FAILED)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return error(f"cannot write{where}: {exc.strerror or exc}", FAILED)


def _init(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    proxy_url = validate_proxy_url(args.proxy_url)
    target, _ = target_file(args, environ)
    project_dir = Path(args.project).expanduser() if args.project is not None else Path.cwd()
    layers, config = load_layers(target, project_dir, environ)
    logged_in = logged_in_providers(read_text(auth_file(environ)))
    providers = known_providers(layers, logged_in, environ)
    if args.list:
        print(f"OpenCode config: {config.path}" + ("" if config.text is not None else " (new)"))
        _show(providers, proxy_url)
        return 0
    picked = choose(args, providers, proxy_url)
    backup = backup_path(config.path)
    backup_text = read_text(backup)
    backup_config = read_config(backup, "backup", backup_text) if backup_text else None
    effective = {p.name: p.base_url for p in providers}
    real_urls: dict[str, str | None] = {}
    for name in picked:
        base_url = provider_base_url(config.data, name) or effective.get(name)
        try:
            real_urls[name] = real_base_url(name, base_url, backup_config, proxy_url, environ)
        except InitError as exc:
            if base_url and points_at_proxy(base_url, proxy_url):
                real_urls[name] = None  # routed already; deepmem's configuration knows where to
            elif args.all:  # one provider deepmem cannot route does not stop the others
                print(f"deepmem: skipped: {exc}", file=sys.stderr)
            else:
                raise
    picked = [name for name in picked if name in real_urls]
    if not picked:
        raise InitError("--all: deepmem can route none of the providers in use")
    result = plan(config, picked, real_urls, proxy_url, mcp=not args.no_mcp)
    new_text = result.text if result.text != (config.text or "") else None
    toml_old = toml_new = None
    if args.deepmem_config is not None:
        toml_old = read_text(args.deepmem_config)
        merged = merge_upstreams_toml(toml_old, result.routes, args.deepmem_config)
        toml_new = merged if merged != (toml_old or "") else None
    if args.dry_run:
        if new_text is not None:
            sys.stdout.write(diff(config.path, config.text, new_text))
        if toml_new is not None and args.deepmem_config is not None:
            sys.stdout.write(diff(args.deepmem_config, toml_old, toml_new))
    else:
        if new_text is not None:
            _write_with_backup(config.path, config.text, new_text)
        if toml_new is not None and args.deepmem_config is not None:
            _write_with_backup(args.deepmem_config, toml_old, toml_new)
    _report(args, config, result, new_text is not None, toml_new is not None)
    _warn_overrides(layers, config, result.routes, proxy_url)
    return 0


def _report(
    args: argparse.Namespace, config: ConfigFile, result: Plan, changed: bool, toml_changed: bool
) -> None:
    out = sys.stderr if args.dry_run else sys.stdout  # a dry run's stdout is the diff alone
    verb = "would change" if args.dry_run else "changed"
    state = f"{verb} {config.path}" if changed else f"{config.path} already routes them; unchanged"
    print(f"deepmem init: {state}", file=out)
    for route in result.routes:
        done = "" if route.changed else " (already)"
        print(f"  {route.provider}: baseURL {route.base_url}{done}", file=out)
    if result.mcp_url:
        print(f"  mcp: deepmem's tools at {result.mcp_url}", file=out)
    for note in result.notes:
        print(f"  note: {note}", file=out)
    needed = pick_upstreams(result.routes)
    embedded = [r for r in result.routes if r.embedded]
    if embedded:
        names = ", ".join(r.upstream for r in embedded)
        print(f"deepmem has the upstream(s) {names} built in: nothing to configure", file=out)
    unknown = [r for r in result.routes if r.upstream_url is None]
    for route in unknown:
        print(
            f"  {route.provider}: routed through deepmem's upstream '{route.upstream}' already; "
            "its URL is in deepmem's configuration",
            file=out,
        )
    if needed and args.deepmem_config is not None:
        verb = ("would update" if args.dry_run else "updated") if toml_changed else "already has"
        specs = ", ".join(r.spec for r in needed)
        print(f"{args.deepmem_config}: {verb} upstream {specs}", file=out)
        print(f"run: deepmem serve --config {args.deepmem_config}", file=out)
    elif needed:
        print("deepmem needs these upstreams: in its TOML config file (--config FILE)", file=out)
        print("  upstream = [" + ", ".join(f'"{r.spec}"' for r in needed) + "]", file=out)
        flags = " ".join(f"--upstream {r.spec}" for r in needed)
        print(f"or as flags: deepmem serve {flags}", file=out)
    else:
        config_flag = f" --config {args.deepmem_config}" if args.deepmem_config else ""
        print(f"run: deepmem serve{config_flag}", file=out)
    if changed and not args.dry_run:
        print(f"backup: {backup_path(config.path)} (deepmem init --undo puts it back)", file=out)


def _warn_overrides(
    layers: Sequence[ConfigFile], config: ConfigFile, routes: Sequence[Route], proxy_url: str
) -> None:
    """A later config file that sets the same baseURL wins over the one edited: say so."""
    later = layers[layers.index(config) + 1 :]
    for layer in later:
        for route in routes:
            value = provider_base_url(layer.data, route.provider)
            if value is not None and not points_at_proxy(value, proxy_url):
                command = "deepmem init" + (
                    f" --project {layer.path.parent}" if layer.label == PROJECT else ""
                )
                print(
                    f"deepmem: warning: {layer.path} sets provider.{route.provider}.options."
                    f"baseURL to {value}, which wins over {config.path}; run `{command}` for "
                    "it too",
                    file=sys.stderr,
                )


def _undo(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    target, _ = target_file(args, environ)
    paths = [target] + ([args.deepmem_config] if args.deepmem_config is not None else [])
    restored = 0
    for path in paths:
        backup = backup_path(path)
        old = read_text(backup)
        if old is None:
            print(f"deepmem init --undo: nothing to undo for {path} (no {backup})", file=sys.stderr)
            continue
        current = read_text(path)
        if args.dry_run:
            sys.stdout.write(diff(path, current, old or None))
        elif old:
            write_atomically(path, old)
            backup.unlink()
        else:  # the empty backup of a file that did not exist
            Path(os.path.realpath(path)).unlink(missing_ok=True)
            backup.unlink()
        restored += 1
        verb = "would restore" if args.dry_run else "restored"
        what = f"from {backup}" if old else "(removed: it did not exist before)"
        print(f"deepmem init --undo: {verb} {path} {what}", file=sys.stderr)
    return 0 if restored else FAILED
