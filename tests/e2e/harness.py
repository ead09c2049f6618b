"""Run the real OpenCode CLI through deepmem against the scripted fake LLM, offline.

Two halves:

- in the test process: ``install_opencode`` (npm, into a cache directory, reused) and
  ``run_scenario``, which starts this module as a subprocess — inside a private network
  namespace with only loopback (``unshare -rn``) when the machine allows it, so the run
  proves that nothing but 127.0.0.1 is used;
- in that subprocess (``python -m tests.e2e.harness``): ``Scenario`` builds a scratch git
  repository under a throwaway HOME, starts the fake LLM (in-process) and deepmem (a real
  ``python -m proxy serve`` subprocess), runs ``opencode run`` twice (the second with ``-c``,
  which compacts), then collects what the proxy reports (``/stats``, ``/metrics``, the
  originals behind every marker via ``/expand``) and writes everything to
  ``<work>/result.json`` for the test to judge.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.fake_llm import (
    TURN1_TAG,
    TURN2_TAG,
    FakeLLM,
    Script,
    api_for_path,
    markers_in,
)

OPENCODE_VERSION = "1.18.33"
ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = float(os.environ.get("DEEPMEM_E2E_RUN_TIMEOUT", "180"))
PROMPTS = (
    f"{TURN1_TAG} Read big_module.py, run the build script twice and tell me what failed.",
    f"{TURN2_TAG} Go on from there.",
)
READ_FILE = "big_module.py"
COMMAND = "sh build.sh"


class E2EError(RuntimeError):
    """The end-to-end run could not be set up (not a finding about the proxy)."""


# ---------------------------------------------------------------- installing OpenCode


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deepmem-e2e" / f"opencode-{OPENCODE_VERSION}"


def _probe(binary: Path) -> bool:
    """Does ``binary --version`` print the pinned version? (with a throwaway HOME: even
    ``--version`` creates OpenCode's config and data directories)."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return False
    with tempfile.TemporaryDirectory(prefix="deepmem-e2e-probe-") as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return False
    return done.returncode == 0 and OPENCODE_VERSION in done.stdout


def find_opencode(prefix: Path) -> Path | None:
    """The working OpenCode binary of an ``npm install`` in ``prefix``.

    The npm wrapper's postinstall links the platform binary into ``opencode-ai/bin``; when
    install scripts are blocked that link may be missing or broken, so the platform packages'
    own binaries (``opencode-linux-x64`` …) are tried next.
    """
    modules = prefix / "node_modules"
    candidates = [modules / ".bin" / "opencode", modules / "opencode-ai" / "bin" / "opencode"]
    platform = sorted(modules.glob("opencode-*/bin/opencode"))
    # the plain build first, then the baseline (older CPUs) and musl builds
    platform.sort(key=lambda p: ("baseline" in p.parts[-3], "musl" in p.parts[-3]))
    for candidate in candidates + platform:
        if _probe(candidate):
            return candidate
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install_opencode(npm: str, target: Path | None = None) -> Path:
    """``opencode-ai@OPENCODE_VERSION`` installed in ``target`` (reused when it works)."""
    target = target or cache_dir()
    found = find_opencode(target)
    if found is not None:
        return found
    with _locked(target.with_name(target.name + ".lock")):
        found = find_opencode(target)  # another process may have installed it meanwhile
        if found is not None:
            return found
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".installing-", dir=target.parent))
        try:
            command = [
                npm,
                "install",
                "--prefix",
                str(staging),
                "--no-save",
                "--no-package-lock",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                f"opencode-ai@{OPENCODE_VERSION}",
            ]
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
            )
            if done.returncode != 0:
                raise E2EError(
                    f"`{' '.join(command)}` failed (exit {done.returncode}):\n"
                    f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
                )
            if find_opencode(staging) is None:
                raise E2EError(
                    f"npm installed opencode-ai@{OPENCODE_VERSION} in {staging}, but neither "
                    "its wrapper nor a platform package (node_modules/opencode-*/bin/opencode) "
                    "runs `--version` on this machine"
                )
            if target.exists():
                shutil.rmtree(target)
            staging.chmod(0o755)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    found = find_opencode(target)
    if found is None:
        raise E2EError(f"OpenCode was installed in {target} but does not run")
    return found


# ------------------------------------------------------------ running one scenario


def isolation_available() -> bool:
    """Can we run in a private network namespace (only loopback), as the kit does?"""
    if os.environ.get("DEEPMEM_E2E_ISOLATE", "1") == "0":
        return False
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    try:
        done = subprocess.run(
            ["unshare", "-rn", "sh", "-c", "ip link set lo up"],
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def run_scenario(
    provider: str, opencode: Path, work: Path, runner: str = "tests.e2e.harness"
) -> dict[str, Any]:
    """Run one provider's scenario in a subprocess (isolated when possible); its result.
    ``runner`` is the module that runs it (``main`` with the same arguments as this one's)."""
    work.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        runner,
        "--provider",
        provider,
        "--opencode",
        str(opencode),
        "--work",
        str(work),
    ]
    isolated = isolation_available()
    if isolated:
        # lo is down in a new namespace; bring it up, then run the scenario inside
        command = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    log = work / "runner.log"
    with log.open("wb") as out:
        try:
            done = subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=3 * RUN_TIMEOUT + 120,
            )
        except subprocess.TimeoutExpired as exc:
            raise E2EError(f"the scenario runner timed out; see {log}") from exc
    result_file = work / "result.json"
    if done.returncode != 0 or not result_file.exists():
        tail = log.read_text(errors="replace")[-6000:]
        raise E2EError(f"the scenario runner failed (exit {done.returncode}); {log}:\n{tail}")
    result = json.loads(result_file.read_text())
    result["isolated"] = isolated
    return result


@dataclass(frozen=True, slots=True)
class ProviderSetup:
    """How OpenCode reaches one provider through deepmem."""

    provider_id: str  # OpenCode's provider id
    route: str  # deepmem's upstream name, served at /<route>/...
    model: str
    small_model: str
    extra: dict[str, Any] = field(default_factory=dict)  # more of provider.<id>


PROVIDERS: dict[str, ProviderSetup] = {
    "openai-compatible": ProviderSetup(
        "e2e",
        "compat",
        "e2e/fake-model",
        "e2e/fake-model",
        {
            "npm": "@ai-sdk/openai-compatible",
            "name": "E2E fake LLM via deepmem",
            "models": {
                "fake-model": {
                    "name": "Fake Model",
                    "tool_call": True,
                    "reasoning": True,
                    "limit": {"context": 128000, "output": 4096},
                }
            },
        },
    ),
    "anthropic": ProviderSetup(
        "anthropic", "anthropic", "anthropic/claude-sonnet-4-5", "anthropic/claude-haiku-4-5"
    ),
    "openai": ProviderSetup("openai", "openai", "openai/gpt-5.4", "openai/gpt-5.4"),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with _NO_PROXY.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def big_module() -> str:
    """A 600+ line Python module with many distinct names (deterministic)."""
    lines = [
        '"""Inventory service: stock levels, reservations and restocking rules."""',
        "",
        "from __future__ import annotations",
        "",
        "import dataclasses",
        "import logging",
        "",
        'log = logging.getLogger("inventory")',
        "",
    ]
    for n in range(1, 31):
        lines += [
            "",
            "@dataclasses.dataclass",
            f"class Warehouse{n:02d}:",
            f'    """Stock of warehouse {n:02d} and its reservation rules."""',
            "",
            f'    code: str = "WH-{n:03d}"',
            f"    capacity: int = {1000 + 37 * n}",
            "    reserved: int = 0",
            "",
            f"    def reserve_{n:02d}(self, quantity: int) -> bool:",
            f'        """Reserve ``quantity`` units in warehouse {n:02d}."""',
            "        if quantity <= 0:",
            '            raise ValueError("quantity must be positive")',
            "        if self.reserved + quantity > self.capacity:",
            f'            log.warning("warehouse {n:02d} full: %d + %d", self.reserved, quantity)',
            "            return False",
            "        self.reserved += quantity",
            "        return True",
            "",
            f"    def restock_threshold_{n:02d}(self) -> int:",
            f"        return self.capacity // {2 + n % 5}",
        ]
    lines += ["", "", "def all_warehouses() -> list[object]:", "    return ["]
    lines += [f"        Warehouse{n:02d}()," for n in range(1, 31)]
    lines += ["    ]", ""]
    return "\n".join(lines) + "\n"


BUILD_SCRIPT = r"""#!/bin/sh
# Print the long log of a pretend build and test run.
i=1
while [ "$i" -le 160 ]; do
  printf '[%3d%%] Building C object src/CMakeFiles/inventory.dir/warehouse_%03d.c.o\n' \
    $((i * 100 / 160)) "$i"
  if [ $((i % 23)) -eq 0 ]; then
    printf 'src/warehouse_%03d.c:%d:9: warning: unused variable tmp_%d [-Wunused-variable]\n' \
      "$i" $((i * 7)) "$i"
  fi
  i=$((i + 1))
done
echo "[100%] Linking C shared library libinventory.so"
echo "============================= test session starts =============================="
i=1
while [ "$i" -le 120 ]; do
  printf 'tests/test_warehouse_%03d.py::test_reserve_and_restock PASSED      [%3d%%]\n' \
    "$i" $((i * 100 / 121))
  i=$((i + 1))
done
echo "tests/test_restock.py::test_threshold_for_warehouse_07 FAILED     [100%]"
echo "=================================== FAILURES ==================================="
echo "_______________________ test_threshold_for_warehouse_07 ________________________"
echo "    def test_threshold_for_warehouse_07():"
echo ">       assert Warehouse07().restock_threshold_07() == 422"
echo "E       AssertionError: assert 211 == 422"
echo "tests/test_restock.py:41: AssertionError"
echo "=========================== short test summary info ============================"
echo "FAILED tests/test_restock.py::test_threshold_for_warehouse_07 - AssertionError"
echo "======================== 1 failed, 120 passed in 4.21s ========================="
"""


def _git(repo: Path, home: Path, *args: str) -> None:
    # the user's own git configuration (signing, hooks, templates) stays out
    env = dict(os.environ, HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    subprocess.run(
        ["git", "-c", "user.email=e2e@example.invalid", "-c", "user.name=e2e", *args],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )


class Scenario:
    """One provider's run, inside the (possibly isolated) runner process."""

    def __init__(self, provider: str, opencode: Path, work: Path) -> None:
        self.provider = provider
        self.setup = PROVIDERS[provider]
        self.opencode = opencode
        self.work = work
        self.home = work / "home"
        self.repo = self.home / "project"
        self.data = work / "deepmem-data"
        self.logs = work / "logs"
        self.config = work / "opencode.json"

    # ---- pieces

    def make_repo(self) -> None:
        self.repo.mkdir(parents=True)
        (self.repo / READ_FILE).write_text(big_module())
        (self.repo / "build.sh").write_text(BUILD_SCRIPT)
        (self.repo / "README.md").write_text(
            "# inventory\n\nA demo project for deepmem's e2e test.\n"
        )
        _git(self.repo, self.home, "init", "-q")
        _git(self.repo, self.home, "add", ".")
        _git(self.repo, self.home, "commit", "-qm", "init")

    def opencode_env(self) -> dict[str, str]:
        home = self.home
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "TMPDIR": str(self.work / "tmp"),
            "OPENCODE_CONFIG": str(self.config),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
            # the built-in providers want a key; the fake LLM ignores it
            "ANTHROPIC_API_KEY": "sk-ant-e2e-not-a-secret",
            "OPENAI_API_KEY": "sk-e2e-not-a-secret",
        }
        (self.work / "tmp").mkdir(exist_ok=True)
        # OpenCode npm-installs @opencode-ai/plugin into its config dir in the background
        # unless node_modules and a lock file already list it: a stub keeps it off the network.
        config_dir = home / ".config" / "opencode"
        (config_dir / "node_modules").mkdir(parents=True, exist_ok=True)
        dependencies = {"@opencode-ai/plugin": "*"}
        (config_dir / "package.json").write_text(json.dumps({"dependencies": dependencies}))
        lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": dependencies}}}
        (config_dir / "package-lock.json").write_text(json.dumps(lock))
        return env

    def write_config(self, proxy_port: int) -> None:
        setup = self.setup
        provider = dict(setup.extra)
        provider["options"] = {
            "baseURL": f"http://127.0.0.1:{proxy_port}/{setup.route}",
            "apiKey": "sk-e2e-not-a-secret",
        }
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": setup.model,
            "small_model": setup.small_model,
            "enabled_providers": [setup.provider_id],
            "provider": {setup.provider_id: provider},
            "mcp": {
                "deepmem": {
                    "type": "remote",
                    "url": f"http://127.0.0.1:{proxy_port}/mcp",
                    "enabled": True,
                }
            },
        }
        self.config.write_text(json.dumps(config, indent=2))

    def start_deepmem(self, upstream: str) -> tuple[subprocess.Popen[bytes], int]:
        routes = {setup.route for setup in PROVIDERS.values()}
        log_path = self.logs / "deepmem.log"
        for attempt in range(3):
            port = free_port()
            arguments = ["--port", str(port)]
            for route in sorted(routes):
                arguments += ["--upstream", f"{route}={upstream}"]
            arguments += ["--data-dir", str(self.data), "--allowed-roots", str(self.home)]
            log_path = self.logs / f"deepmem-{attempt}.log"
            process = launch_deepmem(arguments, self.home, self.work, log_path, port)
            if process is not None:
                return process, port
        raise E2EError(f"deepmem did not become healthy:\n{log_tail(log_path)}")

    def run_opencode(self, index: int, prompt: str, cont: bool) -> dict[str, Any]:
        command = [str(self.opencode), "run", "--print-logs", "--log-level", "DEBUG"]
        command += ["--format", "json"] + (["-c"] if cont else [])
        stdout_path = self.logs / f"opencode-run{index}.stdout.jsonl"
        stderr_path = self.logs / f"opencode-run{index}.stderr.log"
        started = time.monotonic()
        timed_out = False
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            # The prompt goes through stdin: `opencode run "a b"` would quote an argument
            # that contains spaces before sending it.
            process = subprocess.Popen(
                command,
                cwd=self.repo,
                env=self.opencode_env(),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                process.communicate(prompt.encode() + b"\n", timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                timed_out = True
                # the run's own process group (not yet reaped): OpenCode and its tool commands
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return {
            "prompt": prompt,
            "continue": cont,
            "returncode": process.returncode,
            "timed_out": timed_out,
            "seconds": round(time.monotonic() - started, 2),
            "stdout": stdout_path.read_text(errors="replace"),
            "stderr_log": str(stderr_path),
            "stderr_tail": stderr_path.read_text(errors="replace")[-3000:],
        }

    def collect(self, port: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        base = f"http://127.0.0.1:{port}"
        _, stats = http_get(base + "/stats")
        _, metrics = http_get(base + "/metrics")
        keys: set[str] = set()
        for record in records:
            if record["api"] is not None:
                with contextlib.suppress(ValueError):
                    for text in _strings(json.loads(record["raw"])):
                        keys.update(markers_in(text))
        expanded: dict[str, str | None] = {}
        for key in sorted(keys):
            status, content = http_get(f"{base}/expand/ccr:{key}")
            expanded[key] = content.decode("utf-8", "surrogateescape") if status == 200 else None
        return {
            "stats": json.loads(stats),
            "metrics": metrics.decode(),
            "expanded": expanded,
        }

    # ---- the whole run

    def run(self) -> dict[str, Any]:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.make_repo()
        script = Script(
            read_path=str(self.repo / READ_FILE),
            command=COMMAND,
            small_read_path=str(self.repo / "README.md"),
        )
        runs: list[dict[str, Any]] = []
        with FakeLLM(script) as fake:
            deepmem, port = self.start_deepmem(fake.url)
            try:
                self.write_config(port)
                for index, prompt in enumerate(PROMPTS):
                    runs.append(self.run_opencode(index + 1, prompt, cont=index > 0))
                    if runs[-1]["returncode"] != 0:
                        break
                records = fake.dump()
                collected = self.collect(port, records)
            finally:
                _stop(deepmem)
        return {
            "provider": self.provider,
            "route": self.setup.route,
            "proxy_port": port,
            "upstream": fake.url,
            "repo": str(self.repo),
            "home": str(self.home),
            "logs": str(self.logs),
            "read_file": READ_FILE,
            "command": COMMAND,
            "runs": runs,
            "records": records,
            **collected,
        }


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def launch_deepmem(
    arguments: list[str], home: Path, cwd: Path, log_path: Path, port: int
) -> subprocess.Popen[bytes] | None:
    """``deepmem serve ARGUMENTS`` with a clean environment (no DEEP_MEMORY_* or proxy
    variables, HOME=home), its output in ``log_path``; the process once /health answers 200
    on ``port``, or None (the process stopped) when it does not within a minute."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DEEP_MEMORY_") and not k.lower().endswith("_proxy")
    }
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "proxy", "serve", *arguments]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            status, _ = http_get(f"http://127.0.0.1:{port}/health", timeout=2)
            if status == 200:
                return process
        time.sleep(0.1)
    _stop(process)
    return None


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--provider", choices=sorted(PROVIDERS), required=True)
    parser.add_argument("--opencode", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    result = Scenario(args.provider, args.opencode, args.work).run()
    (args.work / "result.json").write_text(json.dumps(result, ensure_ascii=False, indent=1))
    counts = {}
    for record in result["records"]:
        kind = (record["plan"] or {}).get("action", "?") if api_for_path(record["path"]) else "?"
        counts[kind] = counts.get(kind, 0) + 1
    print(f"{args.provider}: runs {[r['returncode'] for r in result['runs']]}, requests {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
