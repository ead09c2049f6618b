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

from dataclasses import dataclass, field

from compressors.markers import ccr_key, marker
from compressors.outputs import ToolOutput
from compressors.pipeline import CompressionSettings
from compressors.registry import compress_output, is_protected
from compressors.tokens import estimate_tokens
from compressors.transcript_grammar import Label, blocks, conversation_span, tool_call


@dataclass(slots=True)
class TranscriptResult:
    text: str
    originals: dict[str, str] = field(default_factory=dict)
    compressed: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


def compress_transcript(text: str, settings: CompressionSettings) -> TranscriptResult:
    """``text`` with the large tool results inside its ``<conversation>`` block compressed."""
    result = TranscriptResult(text)
    span = conversation_span(text)
    if span is None:
        return result
    body_start, body_end = span
    body = text[body_start:body_end]
    found = blocks(body)
    if not found:
        return result
    pieces = [body[: found[0].start]]
    call = ToolOutput("")
    level = len(settings.level_ratios)
    for block in found:
        piece = body[block.start : block.end]
        if block.label is Label.TOOL_CALL:
            call = ToolOutput("", *tool_call(block.text))
        elif block.label is Label.TOOL_RESULT:
            piece = _compress_block(block.text, call, settings, level, result)
        pieces.append(piece)
    result.text = text[:body_start] + "".join(pieces) + text[body_end:]
    return result


def _compress_block(
    content: str,
    call: ToolOutput,
    settings: CompressionSettings,
    level: int,
    result: TranscriptResult,
) -> str:
    """A ``[Tool result]`` block, its ``content`` compressed when that pays off."""
    block = Label.TOOL_RESULT.head + content
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
    return Label.TOOL_RESULT.head + replacement + trailing
