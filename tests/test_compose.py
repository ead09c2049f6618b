"""docs/replicas: the compose file and the balancer's configuration, checked without Docker.

The compose file is read as YAML and held to what the README promises (Redis with a password,
no eviction and no way in from outside; only the balancer published, on loopback; every
setting a real option). HAProxy's own check (``haproxy -c``, Debian's, installed on first
use) reads the balancer configuration; what the replicas do behind it runs in
tests/test_replicas.py against a real Redis server.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import OPTIONS_BY_NAME, unknown_environment
from tests import debian

REPLICAS = Path(__file__).resolve().parent.parent / "docs" / "replicas"


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPLICAS / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_redis_needs_a_password_never_evicts_and_is_not_reachable_from_outside() -> None:
    found = compose()
    redis = found["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert "ports" not in redis and redis["networks"] == ["state"]
    assert found["networks"]["state"]["internal"] is True


def test_only_the_balancer_is_published_and_only_on_loopback() -> None:
    services = compose()["services"]
    published = {name: s["ports"] for name, s in services.items() if "ports" in s}
    assert list(published) == ["balancer"]
    assert all(port.startswith("127.0.0.1:") for port in published["balancer"])
    assert services["balancer"]["networks"] == ["front"]


def test_the_replicas_settings_are_real_options_and_the_state_is_shared() -> None:
    deepmem = compose()["services"]["deepmem"]
    environment = deepmem["environment"]
    assert unknown_environment(environment) == []
    assert "state_url" in OPTIONS_BY_NAME
    url = environment["DEEP_MEMORY_STATE_URL"]
    assert re.fullmatch(r"redis://:\$\{REDIS_PASSWORD:\?[^}]*\}@redis:6379/0", url)
    assert environment["DEEP_MEMORY_ADMIN_TOKEN"].startswith("${DEEPMEM_ADMIN_TOKEN:?")
    assert set(deepmem["networks"]) == {"state", "front"}
    assert "ports" not in deepmem and "container_name" not in deepmem  # it is scaled
    # one data dir for every replica: the memory files' locks and the global memory are there
    assert "${DEEPMEM_DATA:?set DEEPMEM_DATA}:/data" in deepmem["volumes"]


def test_haproxy_accepts_the_balancer_configuration() -> None:
    config = (REPLICAS / "haproxy.cfg").read_text(encoding="utf-8")
    assert "balance roundrobin" in config
    # a degraded replica (503) still relays, so it stays in the rotation
    assert "http-check expect rstatus ^(200|503)$" in config
    haproxy, output = debian.program("haproxy", "haproxy")
    if haproxy is None:
        pytest.skip(f"needs Debian's haproxy and could not install it: {output[-500:]}")
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(REPLICAS / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
