"""Log records of a worker process, redacted of every secret value the process knows.

`install()` wraps the logging module's record factory (once per process), so every record, of
any logger (`ctx.log`, a handler's own `logging.getLogger(...)`, asyncio's "exception never
retrieved"), is redacted when it is created: its formatted message, a formatted exception and
stack, and its `extra` fields (set by `Logger.makeRecord` after the factory, so that is wrapped
too; a non-text value holding a secret is replaced by its redacted text), and its own names
(logger, thread, function, file). Known values are those of the worker's secret store and every
value resolved (`redaction.remember`). What Python itself would write to stderr (an exception a
thread did not catch, "Exception ignored in ...", warnings) is routed through logging, so it is
redacted too. Text written to stdout/stderr without logging (print, a C library) is not covered
(docs/security.md).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import orjson

from processors.executors.redaction import known_redactor

_installed = False
_lock = threading.Lock()
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_FORMATTER = logging.Formatter()
_NAMED = ("name", "threadName", "processName", "funcName", "module", "filename", "pathname", "taskName")
_hooks = logging.getLogger("runfold.worker.uncaught")


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
    # The record's own text fields: a logger or a thread named after a value prints it too.
    names = [getattr(record, key, None) for key in _NAMED]
    if redactor.find("\0".join(n for n in names if isinstance(n, str))):
        for key, value in zip(_NAMED, names, strict=True):
            if isinstance(value, str):
                setattr(record, key, redactor.redact(value))
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
        elif value is not None and not isinstance(value, bool):
            # a dict, list, bytes, number or object in `extra`: the formatters print it as JSON
            # (`str` of what JSON cannot hold, inside containers too) or by its `str`; its repr
            # may differ from both
            texts = _printed(value)
            if redactor.find("\0".join(texts)):
                setattr(record, key, redactor.redact(texts[0]))


def _printed(value: Any) -> list[str]:
    """How a formatter may print `value`: str, repr and JSON (default=str); any that fails is left out."""
    texts: list[str] = []
    for render in (str, repr, lambda v: orjson.dumps(v, default=str).decode()):
        try:
            texts.append(render(value))
        except Exception:  # a value that cannot be printed one way is printed another
            continue
    return texts or ["<unprintable>"]


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
        _route_python_output()
        _installed = True


def _thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    _hooks.error("exception in thread %s", name, exc_info=args.exc_value or True)


def _unraisable(args: Any) -> None:
    try:
        what = repr(args.object)
    except Exception:  # a hook that raised would have Python print the original, unredacted
        what = f"<{type(args.object).__name__} object>"
    _hooks.error("%s: %s", args.err_msg or "Exception ignored in", what, exc_info=args.exc_value)


def _route_python_output() -> None:
    """What Python itself writes to stderr about the process goes through logging (so it is
    redacted): an exception a thread did not catch (a thread a handler started), an exception
    in `__del__` or a callback ("Exception ignored in"), and warnings. Not `print`, not writes
    to stderr, not C libraries (docs/security.md)."""
    if threading.excepthook is threading.__excepthook__:  # a hook the application set is its own
        threading.excepthook = _thread_exception
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _unraisable
    logging.captureWarnings(True)
