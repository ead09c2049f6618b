"""Logging setup and credential redaction. Logs never carry keys; bodies only when asked."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        "openai-organization",
        "openai-project",
    }
)
REDACTED = "<redacted>"
# Key-shaped strings and JSON fields that name a credential.
_SECRET_TEXT = re.compile(
    r"(?P<token>\b(?:sk|pk|rk|sess|ak)-[A-Za-z0-9_\-]{8,}|\bBearer\s+[A-Za-z0-9._\-~+/=]{8,})"
    r"|(?P<field>\"(?:api_?key|apiKey|authorization|x-api-key|access_token|secret)\"\s*:\s*)\"[^\"]*\"",
    re.IGNORECASE,
)
BODY_LOG_LIMIT = 4096


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name: REDACTED if name.lower() in SECRET_HEADERS else value for name, value in headers}


def redact_text(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group("field"):
            return match.group("field") + f'"{REDACTED}"'
        return REDACTED

    return _SECRET_TEXT.sub(replace, text)


def body_for_log(raw: bytes) -> str:
    text = raw[:BODY_LOG_LIMIT].decode("utf-8", "replace")
    suffix = f"… ({len(raw)} bytes)" if len(raw) > BODY_LOG_LIMIT else ""
    return redact_text(text) + suffix


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        return line


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would duplicate ours; its errors still come through.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
