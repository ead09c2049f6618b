"""A real Redis server for the tests (``benchmarks.redis_server.RedisServer``): Debian's
redis-server, installed on first use (tests/debian.py), as Chromium is."""

from __future__ import annotations

import os

import pytest

from benchmarks.redis_server import RedisServer
from tests import debian

__all__ = ["RedisServer", "redis_server_program"]


def redis_server_program() -> str:
    """The redis-server program, installed on first use. A test that needs it fails when it
    cannot be installed, unless ``DEEPMEM_REDIS=skip`` says to skip (CI never does)."""
    if os.environ.get("DEEPMEM_REDIS") == "skip":
        pytest.skip("DEEPMEM_REDIS=skip")
    found, output = debian.program("redis-server", "redis-server")
    if found is None:
        pytest.fail(
            "the Redis tests need Debian's redis-server and could not install it: install it "
            "(apt-get install -y --no-install-recommends redis-server), or set "
            f"DEEPMEM_REDIS=skip\n{output[-1500:]}"
        )
    return found
