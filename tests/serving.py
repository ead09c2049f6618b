"""The ``deepmem serve`` command line that tests start as a process of its own."""

from __future__ import annotations

import sys
from pathlib import Path


def serve_command(port: int, data_dir: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *flags,
    ]
