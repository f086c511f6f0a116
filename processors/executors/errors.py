"""Typed errors an action handler raises, and how any exception becomes a failure receipt.

A handler signals failure by raising. `ActionError(code, message, retryable)` is the
general form; `RetryableError` / `NonRetryableError` are the two common shorthands.
Any other exception becomes `ExecutionFailed`, **retryable** (an unexpected crash is
treated like a transient fault; the step's retry policy bounds it), with the exception
type and message and its traceback (tracebacks.py: at most 4,000 characters), redacted of every secret resolved for the activation (and of every other
value in the worker's store), in the encodings `redaction.Redactor` knows.
"""

from __future__ import annotations

from collections.abc import Iterable

from processors.engine.vocabulary import FAILURE_CODES
from processors.executors.redaction import Redactor, redactor_for
from processors.executors.tracebacks import failure_message, head_of

MAX_MESSAGE_CHARS = 2000


class ActionError(Exception):
    """A classified failure: `code` is one of FAILURE_CODES (docs/messages.md)."""

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        if code not in FAILURE_CODES:
            raise ValueError(f"unknown failure code {code!r}; expected one of {sorted(FAILURE_CODES)}")
        message = message if isinstance(message, str) else str(message)
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


class RetryableError(ActionError):
    """A transient failure (`ExecutionFailed` unless told otherwise); the processor may retry."""

    def __init__(self, message: str, code: str = "ExecutionFailed") -> None:
        super().__init__(code, message, retryable=True)


class NonRetryableError(ActionError):
    """A permanent failure (`ExecutionFailed` unless told otherwise); the step fails without retry."""

    def __init__(self, message: str, code: str = "ExecutionFailed") -> None:
        super().__init__(code, message, retryable=False)


class Cancelled(Exception):
    """Raised by `ActionContext.check_cancelled()` once the activation is cancelled."""


def redact(text: str, secrets: Iterable[str] | Redactor) -> str:
    """`text` with every secret value (any form, partial runs too) replaced by `[redacted]`;
    long messages truncated after the redaction (a cut cannot leave half a secret behind)."""
    redactor = secrets if isinstance(secrets, Redactor) else redactor_for(secrets)
    text = redactor.redact(text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "…"
    return text


def classify(exc: BaseException, secrets: Iterable[str] | Redactor = ()) -> tuple[str, str, bool]:
    """(code, message, retryable) for an exception a handler raised."""
    if isinstance(exc, ActionError):
        message = exc.message if isinstance(exc.message, str) else head_of(exc)
        return exc.code, redact(message, secrets), exc.retryable
    if isinstance(exc, Cancelled):
        return "Cancelled", "activation cancelled", False
    # unexpected: the type, message and traceback, redacted and bounded (tracebacks.py)
    redactor = secrets if isinstance(secrets, Redactor) else redactor_for(secrets)
    return "ExecutionFailed", failure_message(exc, redactor), True
