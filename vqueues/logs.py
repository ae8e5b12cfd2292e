"""Structured logs: one line per event, JSON by default.

Call sites log an event name plus key/value context:
`log.info("partition_ready", extra={"partition": 3, "records": 120})`.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from aiohttp.http_exceptions import HttpProcessingError

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ctx = " ".join(f"{k}={v}" for k, v in _context(record).items())
        text = f"{record.levelname.lower():7} {record.name}: {record.getMessage()} {ctx}".rstrip()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class BadRequestLines(logging.Filter):
    """aiohttp logs a request its HTTP parser refused (an empty `Content-Length`, a header that
    is not ASCII) as an error with a traceback: a client's fault, which any client can repeat
    at will. Such a record becomes one `bad_http_request` warning naming the parser's
    complaint, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "bad_http_request", ()
            record.error = (str(exc.message).strip().splitlines() or [""])[0]
            record.exc_info = record.exc_text = None
        return True


def setup(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger once for a process (called by the CLI, never on import)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, BadRequestLines) for f in server.filters):
        server.addFilter(BadRequestLines())
