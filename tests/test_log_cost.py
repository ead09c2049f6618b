"""The access log's cost (issue 16): every line is still redacted exactly as before, but the
patterns that look for a credential's name run only where such a name can be."""

from __future__ import annotations

import json
import logging
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import logs
from proxy.logs import JsonFormatter, TextFormatter, redact_text

# Fragments that make the patterns' cases likely: names of credentials in any case, the
# characters around JSON fields and query parameters, token shapes, and letters that match
# ASCII ones case-insensitively (the Kelvin sign, the long s, the dotless i).
FRAGMENTS = st.sampled_from(
    [
        "api_key",
        "ApiKey",
        "x-api-key",
        "SECRET",
        "password",
        "passwd",
        "access-token",
        "id_token",
        "Authorization",
        "signature",
        "key",
        "token",
        "sig",
        "auth",
        "\u212aey",
        "\u017fig",
        "\u017fecret",
        "s\u0131g",
        '"',
        '": "',
        ":",
        "?",
        "&",
        "=",
        " ",
        "://user:pw@",
        "sk-abcdefgh12345678",
        "Bearer abcdefgh1234",
        "session",
        "ms",
    ]
)
TEXTS = st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=14).map("".join)


def _every_pattern(text: str) -> str:
    """The redaction as it was: all four patterns on every line."""
    for pattern, replacement in logs._REDACTIONS + logs._NAMED_REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


@given(TEXTS)
def test_redaction_is_that_of_every_pattern(text: str) -> None:
    assert redact_text(text) == _every_pattern(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"api_key": "abc"}',
        '{"Token" : "abc"}',
        "https://host/v1?sig=abc&x=1",
        '{"\u212aey": "abc"}',  # the Kelvin sign matches k case-insensitively
        '{"\u017fecret": "abc"}',
    ],
)
def test_credential_names_are_still_redacted(text: str) -> None:
    assert "abc" not in redact_text(text)


class _CountingPattern:
    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern, self.runs = pattern, 0

    def sub(self, replacement: str, text: str) -> str:
        self.runs += 1
        return self.pattern.sub(replacement, text)


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_an_access_line_without_credential_names_skips_the_name_patterns(
    formatter: logging.Formatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = [(_CountingPattern(p), r) for p, r in logs._NAMED_REDACTIONS]
    monkeypatch.setattr(logs, "_NAMED_REDACTIONS", tuple(counting))
    fields = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "upstream": "default",
        "route": "chat",
        "ms": 1.25,
        "session": "ses_abc123",
        "kind": "agent",
        "outcome": "rewritten",
        "bytes_back": 1234,
    }
    record = logging.LogRecord("deepmem.access", logging.INFO, __file__, 1, "request", (), None)
    record.fields = fields
    line = formatter.format(record)
    assert all(pattern.runs == 0 for pattern, _ in counting)
    if isinstance(formatter, JsonFormatter):
        shown = json.loads(line)
        assert {key: shown[key] for key in fields} == fields
    else:
        assert line.endswith(" ".join(f"{key}={value}" for key, value in fields.items()))
    record.fields = {**fields, "path": "/v1/chat?api_key=hunter2"}
    assert "hunter2" not in formatter.format(record)
    assert all(pattern.runs == 1 for pattern, _ in counting)
