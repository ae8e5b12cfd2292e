"""Structured logs (vqueues/logs.py)."""

import json
import logging

from aiohttp.http_exceptions import BadHttpMessage

from vqueues.logs import BadRequestLines, JsonFormatter


def _record(exc: BaseException | None) -> logging.LogRecord:
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                             "Error handling request from %s", ("127.0.0.1",),
                             (type(exc), exc, None) if exc else None)


def test_a_request_the_http_parser_refused_is_one_warning_line_without_a_traceback():
    record = _record(BadHttpMessage("Empty Content-Length:\n\n  b'0: '\n    ^"))
    assert BadRequestLines().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["event"], line["error"]) == (
        "warning", "bad_http_request", "Empty Content-Length:")
    assert "exc" not in line


def test_other_errors_keep_their_level_and_traceback():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        record = _record(exc)
        record.exc_info = (ValueError, exc, exc.__traceback__)
    assert BadRequestLines().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "error" and "Traceback" in line["exc"]
