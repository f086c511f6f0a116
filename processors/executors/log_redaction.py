"""Log records of a worker process, redacted of every secret value the process knows.

`install()` wraps the logging module's record factory (once per process), so every record, of
any logger (`ctx.log`, a handler's own `logging.getLogger(...)`, asyncio's "exception never
retrieved"), is redacted when it is created: its formatted message, a formatted exception and
stack, and its `extra` fields (set by `Logger.makeRecord` after the factory, so that is wrapped
too; a non-text value holding a secret is replaced by its redacted repr). Known values are those
of the worker's secret store and every value resolved (`redaction.remember`). Text written to stdout/stderr without logging
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
    _redact_extras(record)


def _redact_extras(record: logging.LogRecord) -> None:
    """The record's `extra` fields (logging adds them after the record factory has run)."""
    redactor = known_redactor()
    if not redactor:
        return
    for key, value in list(record.__dict__.items()):
        if key in _STANDARD:
            continue
        if isinstance(value, str):
            setattr(record, key, redactor.redact(value))
        elif value is not None and not isinstance(value, bool) and redactor.find(repr(value)):
            # a dict, list, bytes or number in `extra`: the formatters print it (JSON or repr)
            setattr(record, key, redactor.redact(repr(value)))


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
        make_record = logging.Logger.makeRecord

        def make_redacted_record(self: logging.Logger, *args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make_record(self, *args, **kwargs)
            _redact_extras(record)  # `extra` is set on the record after the factory made it
            return record

        logging.Logger.makeRecord = make_redacted_record  # type: ignore[method-assign]
        _installed = True
