"""The Dockerfile, checked without Docker.

No Docker engine is needed: the Dockerfile is parsed, and what its instructions run is
replayed on this machine. A fresh virtual environment stands in for the image: the files the
Dockerfile COPYs are staged into a build context of their own, installed with the same
``pip install --no-cache-dir ".[semantic]"`` (non-editable), and the ENTRYPOINT and
HEALTHCHECK commands are then run from that environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.config import unknown_environment

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_PORT = 8787
PIP_TIMEOUT = 600.0
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    value: str  # the rest of the instruction, continuation lines joined


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, backslash continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue  # Docker also drops comment lines inside a continuation
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line:
            continue
        keyword, _, value = line.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip()))
    assert not pending, f"Dockerfile ends inside a continuation: {pending!r}"
    return instructions


def values(instructions: list[Instruction], keyword: str) -> list[str]:
    return [i.value for i in instructions if i.keyword == keyword]


def last(instructions: list[Instruction], keyword: str) -> str:
    found = values(instructions, keyword)
    assert found, f"Dockerfile has no {keyword} instruction"
    return found[-1]


def exec_form(value: str, what: str) -> list[str]:
    try:
        argv = json.loads(value)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{what} is not in exec (JSON array) form: {value!r}") from exc
    assert isinstance(argv, list), f"{what} is not a JSON array: {value!r}"
    assert argv, f"{what} is an empty array"
    assert all(isinstance(arg, str) for arg in argv), f"{what} has non-string items: {argv!r}"
    return argv


def parse_env(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for value in values(instructions, "ENV"):
        tokens = shlex.split(value)
        if tokens and "=" not in tokens[0]:  # legacy form: ENV KEY the rest
            env[tokens[0]] = value.partition(" ")[2].strip()
            continue
        for token in tokens:
            key, sep, val = token.partition("=")
            assert sep, f"ENV item without '=': {token!r}"
            env[key] = val
    return env


@dataclass(frozen=True)
class Image:
    """What the Dockerfile declares, as far as this test relies on it."""

    entrypoint: list[str]
    healthcheck: list[str]
    exposed: list[str]
    user: str
    env: dict[str, str]
    volumes: list[str]
    copy_sources: list[list[str]]  # one list per COPY instruction


def read_image() -> Image:
    instructions = parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))
    assert instructions[0].keyword in {"FROM", "ARG"}, "Dockerfile must start with FROM"

    health = last(instructions, "HEALTHCHECK")
    match = re.fullmatch(r"((?:--\S+\s+)*)CMD\s+(.+)", health, flags=re.DOTALL)
    assert match, f"HEALTHCHECK is not '[OPTIONS] CMD [...]': {health!r}"

    volumes: list[str] = []
    for value in values(instructions, "VOLUME"):
        volumes += json.loads(value) if value.startswith("[") else value.split()

    copy_sources: list[list[str]] = []
    for value in values(instructions, "COPY"):
        tokens = [t for t in shlex.split(value) if not t.startswith("--")]
        assert len(tokens) >= 2, f"COPY needs a source and a destination: {value!r}"
        copy_sources.append(tokens[:-1])

    return Image(
        entrypoint=exec_form(last(instructions, "ENTRYPOINT"), "ENTRYPOINT"),
        healthcheck=exec_form(match.group(2), "HEALTHCHECK CMD"),
        exposed=[p for v in values(instructions, "EXPOSE") for p in v.split()],
        user=last(instructions, "USER"),
        env=parse_env(instructions),
        volumes=volumes,
        copy_sources=copy_sources,
    )


def test_dockerfile_declares_what_the_image_needs() -> None:
    image = read_image()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]

    assert image.entrypoint == ["deepmem", "serve", "--host", "0.0.0.0"]
    assert image.entrypoint[0] in scripts, "ENTRYPOINT must be a console script of the package"
    assert f"{IMAGE_PORT}" in image.exposed or f"{IMAGE_PORT}/tcp" in image.exposed
    assert image.user.split(":")[0] not in {"root", "0", ""}, f"USER is root: {image.user!r}"
    assert image.env.get("DEEP_MEMORY_DATA_DIR") == "/data"
    # Only state is a volume: a forgotten project mount must not become an anonymous volume.
    assert image.volumes == ["/data"]
    assert "DEEP_MEMORY_ALLOWED_ROOTS" not in image.env
    assert any(f"127.0.0.1:{IMAGE_PORT}/health" in arg for arg in image.healthcheck)
    assert "curl" not in " ".join(image.healthcheck), "the slim image has no curl"
    for sources in image.copy_sources:
        copied_files(sources)  # asserts that `docker build` would find them


@dataclass(frozen=True)
class RunExample:
    """The `docker run` example of the Dockerfile's header."""

    mounts: list[tuple[str, str]]  # (host, container)
    env: dict[str, str]
    published: list[str]
    user: str | None
    image_args: list[str]  # after the image name: appended to the ENTRYPOINT


def header_run_example() -> RunExample:
    header = []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    text = "\n".join(header).replace("\\\n", " ")
    command = next(line for line in text.splitlines() if line.startswith("docker run "))
    argv = shlex.split(command)[2:]
    mounts, env, published, user = [], {}, [], None
    takes_value = {"-v", "--volume", "-e", "--env", "-p", "--publish", "--user", "-u", "--name"}
    while argv[0].startswith("-"):
        flag = argv.pop(0)
        if flag not in takes_value:
            continue
        value = argv.pop(0)
        if flag in ("-v", "--volume"):
            host, _, container = value.partition(":")
            mounts.append((host, container))
        elif flag in ("-e", "--env"):
            key, _, val = value.partition("=")
            env[key] = val
        elif flag in ("-p", "--publish"):
            published.append(value)
        elif flag in ("--user", "-u"):
            user = value
    assert argv and argv[0] == "deepmem", f"the example runs another image: {argv!r}"
    return RunExample(mounts, env, published, user, argv[1:])


def test_the_header_example_gives_project_memory_and_admin_access_from_the_host() -> None:
    example = header_run_example()
    # Published on the host's loopback only.
    assert example.published == [f"127.0.0.1:{IMAGE_PORT}:{IMAGE_PORT}"]
    # The project is mounted at the path the host (and OpenCode's working directory) uses,
    # so resume and handoff paths are host paths, and that path is an allowed root.
    assert ("$PWD", "$PWD") in example.mounts
    assert example.env["DEEP_MEMORY_ALLOWED_ROOTS"] == "$PWD"
    # /data is a directory of the user's, writable under --user.
    assert any(container == "/data" for _, container in example.mounts)
    assert example.user is not None
    # From the host, admin requests arrive from the Docker bridge: they need the token.
    assert example.env["DEEP_MEMORY_ADMIN_TOKEN"]
    assert unknown_environment(example.env) == []
    assert example.image_args[0] == "--upstream"


async def test_health_is_degraded_when_the_project_is_not_mounted(
    start_proxy, client, tmp_path: Path
) -> None:
    """What the header example gives when `-v "$PWD:$PWD"` is forgotten: $PWD is no path in
    the container; and a configured project_dir that is refused is a problem, not a log line."""
    host_project = tmp_path / "home" / "me" / "project"  # never created: not mounted
    proxy = await start_proxy(allowed_roots=str(host_project))
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        health = await response.json()
    assert health["status"] == "degraded"
    assert health["problems"]["allowed_roots"].startswith(
        f"no allowed root exists here ({host_project}): every project directory is refused"
    )

    roots = tmp_path / "root"
    roots.mkdir()
    proxy = await start_proxy(allowed_roots=str(roots), project_dir="/workspace")
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        problems = (await response.json())["problems"]
    assert set(problems) == {"project_dir"}
    assert problems["project_dir"].startswith(
        "the configured project directory '/workspace' refused: "
    )
    assert problems["project_dir"].endswith("project memory is off for every request")

    mounted = roots / "project"
    mounted.mkdir()
    proxy = await start_proxy(allowed_roots=str(roots), project_dir=str(mounted))
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 200 and (await response.json())["problems"] == {}


def copied_files(sources: list[str]) -> list[str]:
    """What one COPY takes from the build context, as paths relative to the repository.

    Like docker build: a plain source must exist, a wildcard source may match nothing (the
    `README.md*` idiom for an optional file), but the COPY as a whole must match something.
    """
    found: list[str] = []
    for source in sources:
        pattern = source.rstrip("/")
        if any(char in pattern for char in "*?["):
            found += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
        else:
            assert (ROOT / pattern).exists(), (
                f"COPY {source}: not in the repository, docker build would fail"
            )
            found.append(pattern)
    assert found, f"COPY {' '.join(sources)}: matches nothing, docker build would fail"
    return found


def stage_build_context(image: Image, context: Path) -> None:
    """Copy exactly what the Dockerfile COPYs, minus what .dockerignore keeps out anyway.

    Installing from a staged copy rather than from the work tree proves the COPY list is
    enough to build the package, and keeps pip's in-tree build (build/, *.egg-info) out of
    the repository.
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.py[cod]", "*.egg-info")
    context.mkdir()
    for source in [name for sources in image.copy_sources for name in copied_files(sources)]:
        src, dest = ROOT / source, context / source
        if src.is_dir():
            shutil.copytree(src, dest, ignore=ignore)
        else:
            shutil.copy2(src, dest)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would leak the dev venv or config."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
        and not key.startswith("DEEP_MEMORY_")
    }
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def output_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return text[-4000:]


def wait_until_serving(proc: subprocess.Popen[bytes], url: str, stderr: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        code = proc.poll()
        assert code is None, (
            f"deepmem serve exited with {code} before serving:\n{output_of(stderr)}"
        )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers; whether the answer is healthy is the healthcheck's business
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"deepmem serve did not answer {url} in time:\n{output_of(stderr)}")


@pytest.mark.slow
def test_image_commands_work_in_a_fresh_venv(tmp_path: Path) -> None:
    image = read_image()

    context = tmp_path / "context"
    stage_build_context(image, context)

    venv = tmp_path / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=180,
        env=clean_env(),
    )
    assert made.returncode == 0, f"python -m venv failed:\n{made.stderr}"
    bin_dir = venv / "bin"
    python = bin_dir / "python"

    # The Dockerfile's install step, from the build context
    assert 'RUN pip install --no-cache-dir ".[semantic]"' in DOCKERFILE.read_text(encoding="utf-8")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-cache-dir", ".[semantic]"],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        env=clean_env(),
    )
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-2000:]}\n{pip.stderr[-4000:]}"

    workspace = tmp_path / "workdir"  # WORKDIR /home/deepmem
    workspace.mkdir()
    data_dir = tmp_path / "data"  # stands in for ENV DEEP_MEMORY_DATA_DIR=/data
    # The header's `docker run` example: its project mount ("$PWD:$PWD") makes the host's
    # project directory exist at the same path, which the example allows.
    example = header_run_example()
    project = tmp_path / "home" / "me" / "project"
    project.mkdir(parents=True)
    example_env = {key: value.replace("$PWD", str(project)) for key, value in example.env.items()}
    env = clean_env(**{**image.env, **example_env, "DEEP_MEMORY_DATA_DIR": str(data_dir)})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"

    where = subprocess.run(
        [str(python), "-c", "import proxy; print(proxy.__file__)"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), (
        f"the venv imports proxy from {where.stdout.strip()}, not from its own install"
    )

    # The ENTRYPOINT, run from the venv, on a free port instead of the image's 8787.
    port = free_port()
    argv = [str(bin_dir / image.entrypoint[0]), *image.entrypoint[1:], *example.image_args]
    argv += ["--port", str(port)]
    # The HEALTHCHECK as the image would run it, with two substitutions: `python` is the
    # venv's interpreter, and the image's port 8787 becomes the port chosen above.
    health_argv = [str(python) if image.healthcheck[0] == "python" else image.healthcheck[0]]
    health_argv += [arg.replace(f":{IMAGE_PORT}", f":{port}") for arg in image.healthcheck[1:]]
    assert health_argv[1:] != image.healthcheck[1:], "the healthcheck names no :8787 to retarget"

    stdout_path, stderr_path = tmp_path / "serve.out", tmp_path / "serve.err"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=workspace, env=env, stdout=out, stderr=err)
    try:
        wait_until_serving(proc, f"http://127.0.0.1:{port}/health", stderr_path)

        health = subprocess.run(
            health_argv, cwd=workspace, capture_output=True, text=True, timeout=30, env=env
        )
        assert health.returncode == 0, (
            f"HEALTHCHECK exited {health.returncode}:\n{health.stderr}\n"
            f"server log:\n{output_of(stderr_path)}"
        )
        assert data_dir.is_dir(), "the server did not create DEEP_MEMORY_DATA_DIR"
        token = example.env["DEEP_MEMORY_ADMIN_TOKEN"]
        stats = urllib.request.Request(
            f"http://127.0.0.1:{port}/stats", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(stats, timeout=5) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert json.loads(answer.read())["problems"] == {}

        proc.send_signal(signal.SIGTERM)  # what `docker stop` sends to the ENTRYPOINT process
        try:
            code = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"deepmem serve ignored SIGTERM for {STOP_TIMEOUT}s:\n{output_of(stderr_path)}"
            ) from None
        assert code == 0, f"deepmem serve exited {code} on SIGTERM:\n{output_of(stderr_path)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)

    # With nothing listening, the same healthcheck must report the container unhealthy.
    dead = subprocess.run(
        health_argv, cwd=workspace, capture_output=True, text=True, timeout=30, env=env
    )
    assert dead.returncode != 0, "the healthcheck passed with the server stopped"
