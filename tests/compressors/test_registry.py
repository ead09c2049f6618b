"""How the registry picks compressors for an output."""

from __future__ import annotations

import orjson

from compressors.outputs import ToolOutput
from compressors.registry import (
    BY_PROGRAM,
    COMPRESSORS,
    FILE_READ,
    GENERIC,
    JSON,
    LISTING,
    SEARCH,
    candidates,
)


def test_each_program_names_one_compressor_of_the_list() -> None:
    owners = [c for c in COMPRESSORS for _ in c.programs]
    assert len(owners) == len(BY_PROGRAM)  # no program claimed twice
    assert BY_PROGRAM["rg"] is SEARCH and BY_PROGRAM["ls"] is LISTING
    assert BY_PROGRAM["sed"] is FILE_READ


def test_a_shell_call_tries_its_programs_compressor_first_and_generic_last() -> None:
    call = orjson.dumps({"command": "cd repo && rg -n TODO src"}).decode()
    found = candidates(ToolOutput("src/a.py:1: TODO", "bash", call))
    assert found[0] is SEARCH and found[1] is JSON and found[-1] is GENERIC
    assert len(found) == len(set(found)) == len(COMPRESSORS)
