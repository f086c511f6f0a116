"""Structured logs: one JSON line per lifecycle event (never one per record)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

LOGGER_NAME = "runfold.processor"
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts": ..., "level": ..., "logger": ..., "event": <msg>, **extra}` per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class RepeatThrottle:
    """Lets the first of each distinct message through, then at most one per `window_s`, saying
    how many were held back in between. librdkafka reports a down cluster (or one broker) to
    the error callback of every client many times a second: hundreds of identical lines a
    minute would bury the one that says why."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._seen: dict[str, tuple[float, int]] = {}  # message -> (last let through, held back since)

    def admit(self, message: str, now: float) -> int | None:
        """None to hold `message` back; else how many repeats of it were held back before."""
        last = self._seen.get(message)
        if last is not None and now - last[0] < self.window_s:
            self._seen[message] = (last[0], last[1] + 1)
            return None
        if len(self._seen) > 256:  # distinct texts (broker names, addresses) stay few; bound it anyway
            self._seen.clear()
        self._seen[message] = (now, 0)
        return last[1] if last is not None else 0


def configure(level: str = "INFO") -> None:
    """Route runfold loggers to stderr as JSON lines (idempotent)."""
    root = logging.getLogger("runfold")
    root.setLevel(level.upper())
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
        root.propagate = False


def get_logger(name: str = LOGGER_NAME) -> logging.Logger:
    return logging.getLogger(name)
