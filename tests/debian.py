"""Debian packages the tests need (Chromium, redis-server, HAProxy), installed on first use
with apt-get, as root or through sudo, the way the e2e tests install OpenCode with npm."""

from __future__ import annotations

import os
import shutil
import subprocess


def install(package: str) -> str:
    """``apt-get install`` the package; the output of the attempt (for a failure message)."""
    prefix = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if prefix is None or shutil.which("apt-get") is None:
        return "not root, no sudo, or no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log = []
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", package],
    ):
        done = subprocess.run(
            prefix + command, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        log.append(done.stdout[-2000:] + done.stderr[-2000:])
        if done.returncode != 0:
            break
    return "\n".join(log)


def program(name: str, package: str) -> tuple[str | None, str]:
    """The program's path, installing its package when it is missing; with the install's
    output when it still cannot be found."""
    found = shutil.which(name)
    if found is not None:
        return found, ""
    output = install(package)
    return shutil.which(name), output
