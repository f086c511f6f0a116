"""What the long-running services (processor, worker, child executor) share about start-up and logs:
one log format chosen by a flag or `RUNFOLD_LOG_FORMAT` (`json`, the default, or `human`),
librdkafka's own log lines routed into Python logging with repeats collapsed, and the wait for
a cluster that answers, which ends in one clear line instead of an endless retry.

- **Format.** `configure(level, fmt)` puts one stderr handler on the root logger, so the
  services' records and those of user code (a handler's `logging.getLogger(...)`) look alike.
  JSON lines are the processor's `JsonFormatter` (processors/runtime/logs.py); human lines
  are `2026-01-01T00:00:00.000Z INFO runfold.worker message key=value`.
- **librdkafka.** A client given `logger=kafka_log()` hands its log lines to `KafkaLog`,
  which logs the first of each distinct line (under `runfold.kafka`) and then holds its
  repeats back for 10 s: the next one that passes says how many were held back. A cluster
  that is down made ~30 identical "Connection refused" lines a second per client.
- **Cluster.** `await_cluster` is the processor's pre-flight wait (runtime/preflight.check_topology:
  `until_stopped` over metadata requests, then `topology.settings.cannot_reach`), for any client.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from typing import Any

from processors.kafka.exits import StopRequested, until_stopped
from processors.runtime.logs import JsonFormatter, RepeatThrottle
from topology.settings import cannot_reach

LOG_FORMATS = ("json", "human")
KAFKA_LOGGER_NAME = "runfold.kafka"
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def log_format(flag: str | None = None) -> str:
    """The chosen format: the flag, else RUNFOLD_LOG_FORMAT, else json. ValueError names both."""
    chosen = (flag or os.environ.get("RUNFOLD_LOG_FORMAT") or "json").strip().lower()
    if chosen not in LOG_FORMATS:
        where = "--log-format" if flag else "RUNFOLD_LOG_FORMAT"
        raise ValueError(f"{where} must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


class HumanFormatter(logging.Formatter):
    """`<UTC time> <LEVEL> <logger> <message> key=value ...`, then the exception, if any."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        extra = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
        )
        line = f"{ts} {record.levelname} {record.name} {record.getMessage()}" + (f" {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        return line


class _JsonLines(JsonFormatter):
    """The processor's JSON lines, also for a record whose exception was already formatted
    (the worker's redaction formats it when the record is created, log_redaction.py)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_text and not record.exc_info:
            record.exception = record.exc_text
        return super().format(record)


class _ServiceHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler `configure` installed, so a second call replaces it."""


def configure(level: str = "INFO", fmt: str | None = None) -> None:
    """One stderr handler on the root logger in the chosen format; `runfold` loggers at `level`."""
    chosen = log_format(fmt)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _ServiceHandler):
            root.removeHandler(handler)
    handler = _ServiceHandler(sys.stderr)
    handler.setFormatter(_JsonLines() if chosen == "json" else HumanFormatter())
    root.addHandler(handler)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)  # other libraries: warnings and errors only
    runfold = logging.getLogger("runfold")
    runfold.setLevel(level.upper())
    # the processor's logs.configure gave `runfold` its own JSON handler: one handler, one format
    for old in list(runfold.handlers):
        if isinstance(old.formatter, JsonFormatter):
            runfold.removeHandler(old)
    runfold.propagate = True


# What varies between repeats of one librdkafka line: the thread, the client's name, how long
# ago the state changed, librdkafka's own suppression count.
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")
_VARIES = re.compile(r" \(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
_SYSLOG = {0: 50, 1: 50, 2: 50, 3: 40, 4: 30, 5: 20, 6: 20, 7: 10}  # librdkafka levels (syslog)


def repeat_key(text: str) -> str:
    """A librdkafka line without what varies between its repeats (thread, timing, counts)."""
    return _VARIES.sub("", _THREAD.sub("", text))


class KafkaLog:
    """The `logger` object a librdkafka client calls (`log(level, fmt, facility, client, text)`):
    the first of each distinct line goes to `runfold.kafka`, repeats within `window_s` are held
    back, and the next one let through says how many were. Thread-safe (clients log from
    whichever thread polls them)."""

    def __init__(self, window_s: float = 10.0, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger(KAFKA_LOGGER_NAME)
        self._throttle = RepeatThrottle(window_s)
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, str, str, int]] = {}  # key -> (level, facility, text, count)

    def log(
        self, level: int, fmt: str, facility: str = "", client: str = "", text: str = "", *_: Any
    ) -> None:
        text = repeat_key(str(text))
        key = f"{facility} {text}"
        level = _SYSLOG.get(level, level) if level < 10 else level
        with self._lock:
            held = self._throttle.admit(key, time.monotonic())
            if held is None:  # counted here too, so that flush() can say it at exit
                self._held[key] = (level, facility, text, self._held.get(key, (0, "", "", 0))[3] + 1)
                return
            self._held.pop(key, None)
        suffix = f" (and {held} more like it in the last {self._throttle.window_s:g} s)" if held else ""
        self.logger.log(level, "kafka %s: %s%s", facility, text, suffix, extra={"kafka_client": client})

    def flush(self) -> None:
        """Say how many repeats were held back since each line last passed (at exit)."""
        with self._lock:
            held, self._held = self._held, {}
        for level, facility, text, count in held.values():
            self.logger.log(level, "kafka %s: %s (repeated %d more times)", facility, text, count)


_shared: KafkaLog | None = None


def kafka_log() -> KafkaLog:
    """The process's one KafkaLog: repeats are collapsed across all its clients."""
    global _shared
    if _shared is None:
        _shared = KafkaLog()
    return _shared


class ClusterUnreachable(Exception):
    """No broker answered within the connect timeout; the message says what to do."""


def await_cluster(client: Any, bootstrap: str, timeout_s: float, stop: threading.Event, topic: str) -> None:
    """Return once a metadata request for `topic` through `client` is answered; ClusterUnreachable
    after `timeout_s` (the processor's message), StopRequested when `stop` is set meanwhile."""
    from confluent_kafka import KafkaException

    try:
        until_stopped(lambda t: client.list_topics(topic, timeout=t), stop, timeout_s)
    except KafkaException as e:
        raise ClusterUnreachable(
            cannot_reach(bootstrap, f"{e.args[0].str()}, after {timeout_s:g} s")
        ) from None


__all__ = [
    "LOG_FORMATS",
    "ClusterUnreachable",
    "HumanFormatter",
    "KafkaLog",
    "StopRequested",
    "await_cluster",
    "configure",
    "kafka_log",
    "log_format",
    "repeat_key",
]
