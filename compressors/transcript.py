"""Compress the tool results inside a compaction request's transcript.

OpenCode hands its summarizer the whole conversation as text inside ``<conversation>``:

    [User]: …
    [Assistant reasoning]: …
    [Assistant tool call]: read({"filePath": "/repo/a.py"})
    [Tool result]: …

The summarizer needs what a summary keeps (errors, paths, decisions), not every line of every
file it read, so each large ``[Tool result]`` block goes through the same per-tool compressors
as a request's tool outputs, at the deepest level, with the usual marker: the summary may carry
the key forward, and the original stays expandable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from compressors.markers import ccr_key, marker
from compressors.outputs import ToolOutput
from compressors.pipeline import CompressionSettings
from compressors.registry import compress_output, is_protected
from compressors.tokens import estimate_tokens

OPEN, CLOSE = "<conversation>", "</conversation>"
_BLOCK_START = re.compile(
    r"^\[(?:User|Assistant|Assistant reasoning|Assistant tool call|Tool result|Tool error)\]: ",
    re.MULTILINE,
)
_CALL = re.compile(r"^\[Assistant tool call\]: (?P<tool>[\w.-]+)\((?P<args>.*)\)\s*$", re.DOTALL)
_RESULT = "[Tool result]: "


@dataclass(slots=True)
class TranscriptResult:
    text: str
    originals: dict[str, str] = field(default_factory=dict)
    compressed: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


def compress_transcript(text: str, settings: CompressionSettings) -> TranscriptResult:
    """``text`` with the large tool results inside its ``<conversation>`` block compressed."""
    start = text.find(OPEN)
    end = text.rfind(CLOSE)
    result = TranscriptResult(text)
    if start < 0 or end <= start:
        return result
    body_start = start + len(OPEN)
    body = text[body_start:end]
    cuts = [m.start() for m in _BLOCK_START.finditer(body)]
    if not cuts:
        return result
    pieces = [body[: cuts[0]]]
    call = ToolOutput("")
    level = len(settings.level_ratios)
    for begin, stop in zip(cuts, [*cuts[1:], len(body)], strict=True):
        block = body[begin:stop]
        found = _CALL.match(block.rstrip("\n"))
        if found:
            call = ToolOutput("", found.group("tool"), found.group("args"))
        elif block.startswith(_RESULT):
            block = _compress_block(block, call, settings, level, result)
        pieces.append(block)
    result.text = text[:body_start] + "".join(pieces) + text[end:]
    return result


def _compress_block(
    block: str,
    call: ToolOutput,
    settings: CompressionSettings,
    level: int,
    result: TranscriptResult,
) -> str:
    content = block[len(_RESULT) :]
    trailing = content[len(content.rstrip("\n")) :]
    output = content[: len(content) - len(trailing)]
    tokens = estimate_tokens(output)
    output_with_call = ToolOutput(output, call.tool, call.arguments)
    if tokens < settings.min_output_tokens or is_protected(
        output_with_call, settings.protected_tools
    ):
        return block
    outcome = compress_output(output_with_call, settings.budget(output, level))
    if outcome is None:
        return block
    _, compressed = outcome
    key = ccr_key(output)
    replacement = marker(compressed.omitted, key) + "\n" + compressed.text
    after = estimate_tokens(replacement)
    if not settings.pays_off(tokens, after):
        return block
    result.originals[key] = output
    result.compressed += 1
    result.tokens_before += tokens
    result.tokens_after += after
    return _RESULT + replacement + trailing
