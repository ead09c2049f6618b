"""Running the ``deepmem`` command line inside a test and reading what it printed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def run(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> Result:
    code = main(list(argv))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)
