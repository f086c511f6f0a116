"""The failure text of an unexpected handler exception: its type and message, then its traceback,
redacted of every secret the worker knows and bounded.

The Avro contract has no traceback field (`ActivationFailed` carries `code`, `message`,
`retryable`; `Failure` the same), so the traceback travels in the message text, inside the
bound the processor keeps of a receipt's message (`MESSAGE_CHARS`, 4,000 characters): what a
worker sends is what `runs events` / `runs get` show, never cut again on the way.

`traceback.format_exception` prints source lines, not values: a secret held in a local
variable appears only through text the exception itself carries (its message, a chained
exception's message), and all of it passes the redactor before it is cut, so a cut cannot
leave part of a secret behind.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from processors.engine.receipts import MESSAGE_CHARS
from processors.executors.redaction import Redactor

# The head ("ZeroDivisionError: division by zero") is kept whole up to this; the rest of the
# processor's bound is the traceback's, its innermost frames kept (they say where it broke).
HEAD_CHARS = 1000
_CUT = "…(outer frames cut)\n"


def head_of(exc: BaseException) -> str:
    try:
        detail = str(exc)
    except Exception:  # an exception whose __str__ raises still fails its step, as traceback prints it
        detail = "<exception str() failed>"
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def traceback_text(exc: BaseException) -> str:
    """The exception's traceback as Python prints it (chained exceptions too)."""
    return "".join(traceback.format_exception(exc))


def bounded_tail(text: str, limit: int) -> str:
    """The last `limit` characters of `text`, from a line start when one is near, marked as cut."""
    if len(text) <= limit:
        return text
    tail = text[len(text) - (limit - len(_CUT)) :]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) // 2:
        tail = tail[newline + 1 :]
    return _CUT + tail


def failure_message(exc: BaseException, redactor: Redactor) -> str:
    """`Type: message` (redacted, at most HEAD_CHARS), a newline, and as much of the end of the
    redacted traceback as fits: at most MESSAGE_CHARS in all."""
    head = redactor.redact(head_of(exc))
    if len(head) > HEAD_CHARS:
        head = head[: HEAD_CHARS - 1] + "…"
    if exc.__traceback__ is None:  # never raised (built and handed over): nothing more to say
        return head
    tb = bounded_tail(redactor.redact(traceback_text(exc)), MESSAGE_CHARS - len(head) - 1)
    return f"{head}\n{tb.rstrip()}"


def log_handler_failure(
    logger: logging.Logger, label: str, activation: dict[str, Any], exc: BaseException, classified: bool
) -> None:
    """Log a handler's exception where the worker runs: an unexpected one at ERROR with its
    traceback, a classified one (`ActionError`, `Cancelled`: the handler said what failed) as one
    WARNING line. Every record is redacted when it is created (log_redaction.py)."""
    lineage = activation.get("lineage") or ""
    where = (
        f"run {activation.get('run_id')!r} node {activation.get('node')!r}"
        f"{f'[{lineage}]' if lineage else ''} attempt {activation.get('attempt')}"
    )
    if classified:
        logger.warning("action %s failed (%s): %s", label, where, head_of(exc))
    else:
        logger.error("action %s raised (%s): %s", label, where, head_of(exc), exc_info=exc)
