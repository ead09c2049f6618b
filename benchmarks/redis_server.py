"""A Redis server of one's own: Debian's ``redis-server`` on a free loopback port, in a given
directory, without persistence. The replica tests and the benchmarks start it;
``tests/redis_server.py`` installs the program on first use."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from benchmarks.overhead import free_port


class RedisServer:
    """``start``, ``stop`` and ``start`` again on the same port (an empty server then)."""

    def __init__(self, program: str, directory: Path, password: str | None = None) -> None:
        self.program = program
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        command = [
            self.program,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        log = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{tail}")
            time.sleep(0.02)
        return self

    def _answers(self) -> bool:
        """Whether the server answers PING (NOAUTH counts: it is up)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as connection:
                connection.sendall(b"PING\r\n")
                return connection.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def command(self, *words: str) -> str:
        """One redis-cli command's output, for looking at the server from outside."""
        cli = shutil.which("redis-cli") or "redis-cli"
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        done = subprocess.run(
            [cli, "-p", str(self.port), *auth, *words],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return done.stdout.strip()
