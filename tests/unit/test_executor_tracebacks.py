"""The traceback a failure carries: bounded, redacted before it is cut (tracebacks.py)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine.receipts import MESSAGE_CHARS
from processors.executors.errors import RetryableError, classify
from processors.executors.redaction import redactor_for
from processors.executors.tracebacks import failure_message, log_handler_failure

SECRET = "s3cr3t-canary-value-0123456789"


def _raised(message: str, depth: int = 0) -> BaseException:
    def inner(n: int) -> None:
        if n:
            outer(n - 1)
        raise ValueError(message)

    def outer(n: int) -> None:
        inner(n)

    try:
        outer(depth)
    except ValueError as e:
        return e
    raise AssertionError("not raised")


def test_unexpected_exception_carries_its_traceback_classified_one_does_not() -> None:
    code, message, retryable = classify(_raised(f"bad {SECRET}"), [SECRET])
    assert (code, retryable) == ("ExecutionFailed", True)
    assert message.startswith("ValueError: bad [redacted]\nTraceback (most recent call last):")
    assert "in inner" in message and SECRET not in message
    assert classify(RetryableError("upstream 503"), [SECRET])[1] == "upstream 503"
    never_raised = failure_message(KeyError("k"), redactor_for([]))
    assert never_raised == "KeyError: 'k'"


@settings(max_examples=60, deadline=None)
@given(
    before=st.text(max_size=3000),
    after=st.text(max_size=3000),
    depth=st.integers(0, 60),
)
def test_bounded_and_no_part_of_the_secret_survives_the_cut(before: str, after: str, depth: int) -> None:
    message = failure_message(_raised(before + SECRET + after, depth), redactor_for([SECRET]))
    assert len(message) <= MESSAGE_CHARS
    for start in range(len(SECRET) - 8 + 1):
        assert SECRET[start : start + 8] not in message


def test_the_log_line_names_the_run_and_keeps_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("runfold.worker.test")
    act = {"run_id": "r-1", "node": "n", "lineage": "3", "attempt": 2}
    with caplog.at_level(logging.INFO, logger.name):
        log_handler_failure(logger, "x.y", act, _raised("boom"), classified=False)
        log_handler_failure(logger, "x.y", act, RetryableError("later"), classified=True)
    bad, told = caplog.records
    assert bad.levelno == logging.ERROR and "run 'r-1' node 'n'[3] attempt 2" in bad.getMessage()
    # the traceback rides on the record (exc_text once the worker's redaction formatted it)
    assert bad.exc_info is not None or "in inner" in (bad.exc_text or "")
    assert "in inner" in caplog.text
    assert told.levelno == logging.WARNING and not told.exc_info and not told.exc_text
    assert "later" in told.getMessage()
