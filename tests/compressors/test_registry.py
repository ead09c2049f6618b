"""How the registry picks compressors for an output."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import compressors.registry as registry
from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.pipeline import CompressionSettings
from compressors.registry import (
    BY_PROGRAM,
    COMPRESSORS,
    FILE_READ,
    GENERIC,
    JSON,
    LISTING,
    SEARCH,
    ToolCompressor,
    candidates,
    compress_on_arrival,
    compress_output,
)
from tests.strategies import ToolCall, large_call
from tests.test_properties import PROPERTY

ARRIVAL_KINDS = (
    CompressionSettings().arrival_kinds,
    frozenset({"file_read"}),
    frozenset({"json", "prose"}),
    frozenset(c.name for c in COMPRESSORS),
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


# Names an output may come under: its own tool's, a shell's running another program, a tool
# the registry does not know (tried by shape only), an editor's.
OTHER_NAMES = (
    ("bash", {"command": "cat notes.txt"}),
    ("bash", {"command": "./run.sh"}),
    ("mcp_fetch", {}),
    ("str_replace_editor", {"command": "view", "path": "/repo/a.py"}),
)


def _outputs(call: ToolCall, other: int) -> list[ToolOutput]:
    name, arguments = OTHER_NAMES[other]
    return [
        ToolOutput(call.output, call.name, orjson.dumps(call.arguments).decode()),
        ToolOutput(call.output, name, orjson.dumps(arguments).decode()),
    ]


@PROPERTY
@given(large_call(), st.integers(0, len(OTHER_NAMES) - 1), st.integers(1, 3))
def test_a_compressor_compresses_only_what_it_recognises(
    call: ToolCall, other: int, level: int
) -> None:
    for output in _outputs(call, other):
        budget = Budget(max(500, len(output.text) // (4 * level)), level)
        for compressor in COMPRESSORS:
            if compressor.compress(output, budget) is not None:
                assert compressor.recognises(output, budget), compressor.name


@PROPERTY
@given(large_call(), st.integers(0, len(OTHER_NAMES) - 1), st.sampled_from(ARRIVAL_KINDS))
def test_on_arrival_an_output_is_compressed_as_usual_unless_another_kind_recognises_it_first(
    call: ToolCall, other: int, kinds: frozenset[str]
) -> None:
    for output in _outputs(call, other):
        budget = Budget(max(500, len(output.text) // 10))
        usual = compress_output(output, budget)
        arrived = compress_on_arrival(output, budget, kinds)
        assert arrived is None or (arrived[0] in kinds and arrived == usual)
        if usual is None or usual[0] not in kinds:
            assert arrived is None
            continue
        tried = candidates(output)
        before = tried[: [c.name for c in tried].index(usual[0])]
        if not any(c.name not in kinds and c.recognises(output, budget) for c in before):
            assert arrived == usual


def test_a_read_file_is_recognised_on_arrival_without_being_compressed() -> None:
    """The file-view compressor tells a read by its shape; its compression (the costly part)
    does not run on arrival, where only listings and logs are compressed."""
    lines = "\n".join(f"{n}: total_{n} = compute_{n}(value_{n - 1})" for n in range(1, 900))
    text = f"<path>/repo/a.py</path>\n<type>file</type>\n<content>\n{lines}\n</content>"
    output = ToolOutput(text, "read", '{"filePath": "/repo/a.py"}')
    budget = Budget(2000)
    assert compress_output(output, budget) is not None
    compressed: list[str] = []

    def counted(compressor: ToolCompressor) -> ToolCompressor:
        def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
            compressed.append(compressor.name)
            return compressor.compress(output, budget)

        return replace(compressor, compress=compress)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "candidates", lambda o: [counted(c) for c in candidates(o)])
        assert compress_on_arrival(output, budget, frozenset({"listing", "shell"})) is None
    assert compressed == []


def test_a_directory_read_is_a_listing_and_compressed_on_arrival() -> None:
    """OpenCode's read of a directory is not a file view: the listing compressor takes it,
    on arrival as always."""
    entries = "\n".join(f"module_{n}.py" for n in range(3000))
    text = f"<path>/repo/src</path>\n<type>directory</type>\n<entries>\n{entries}\n</entries>"
    output = ToolOutput(text, "read", '{"filePath": "/repo/src"}')
    budget = Budget(2000)
    arrived = compress_on_arrival(output, budget, frozenset({"listing", "shell"}))
    assert arrived is not None and arrived[0] == "listing"
    assert arrived == compress_output(output, budget)
