"""Log records of a worker process, redacted of every secret value the process knows.

`install()` wraps the logging module's record factory (once per process), so every record, of
any logger (`ctx.log`, a handler's own `logging.getLogger(...)`, asyncio's "exception never
retrieved"), is redacted when it is created: its formatted message, a formatted exception and
stack, and string `extra` fields. Known values are those of the worker's secret store and
every value resolved (`redaction.remember`). Text written to stdout/stderr without logging
(print, a C library) is not covered (docs/security.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from processors.executors.redaction import known_redactor

_installed = False
_lock = threading.Lock()
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_FORMATTER = logging.Formatter()


def _redact_record(record: logging.LogRecord) -> None:
    redactor = known_redactor()
    if not redactor:
        return
    try:
        message = record.getMessage()
    except Exception:  # bad args: logging would print them raw in its error report
        message = f"{record.msg} {record.args!r}"
    record.msg, record.args = redactor.redact(message), None
    if record.exc_info and not record.exc_text:
        record.exc_text = _FORMATTER.formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redactor.redact(record.exc_text)
        record.exc_info = None  # formatters would format it again, unredacted
    if record.stack_info:
        record.stack_info = redactor.redact(record.stack_info)
    for key, value in list(record.__dict__.items()):
        if key not in _STANDARD and isinstance(value, str):
            setattr(record, key, redactor.redact(value))


def install() -> None:
    """Redact every log record this process creates from now on (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True
