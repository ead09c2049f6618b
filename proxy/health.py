"""What makes the proxy degraded: problems its own components report, shown by /health."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("deepmem.health")


class Health:
    def __init__(self) -> None:
        self._problems: dict[str, str] = {}

    def report(self, component: str, problem: str) -> None:
        if self._problems.get(component) != problem:
            log.error("%s: %s", component, problem)
        self._problems[component] = problem

    def clear(self, component: str) -> None:
        if self._problems.pop(component, None) is not None:
            log.info("%s: recovered", component)

    def problems(self) -> dict[str, str]:
        return dict(self._problems)

    def check_writable_dir(self, component: str, path: Path) -> bool:
        """Create ``path`` if needed and prove a file can be written there."""
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            self.report(component, f"{path} is not writable: {exc.strerror or exc}")
            return False
        self.clear(component)
        return True
