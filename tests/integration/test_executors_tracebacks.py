"""Debuggable failures: a handler's unexpected exception is logged by the worker with its
traceback, and the step's failure carries a bounded, redacted traceback that `runs events`
and `runs get` show. A canary secret, resolved into a local variable and put in the
exception's message (and its cause's), appears nowhere: not in any event, not in the logs."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import orjson
import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running
from test_cli import Cli

from processors.client import RunClient
from processors.engine.receipts import MESSAGE_CHARS
from processors.executors import ActionContext, Worker
from processors.executors.secrets import SecretStore
from processors.executors.settings import WorkerSettings
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CANARY = "tb-canary-" + secrets.token_hex(12)

DEFINITION = {
    "schema": "runfold.workflow/v1",
    "id": "tb-fails",
    "revision": 1,
    "entry": ["risky"],
    "nodes": {
        "risky": {
            "kind": "action",
            "action": "tb.risky",
            "capabilities": ["secret:tbcanary"],
            "retry": {"max_attempts": 1},
        }
    },
}


def _divide(token: str, depth: int) -> float:
    if depth:
        return _descend(token, depth - 1)  # a deep stack: the bound keeps the innermost frames
    return len(token) / 0


def _descend(token: str, depth: int) -> float:
    return _divide(token, depth)  # alternating frames: Python does not fold them into one line


def risky(ctx: ActionContext, input: Any) -> Any:
    token = ctx.secrets.get("tbcanary")  # the canary in a local variable
    try:
        return _divide(token, input.get("depth", 0))
    except ZeroDivisionError as e:
        raise RuntimeError(f"could not use token {token}") from e  # and in the message


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


def test_traceback_in_failure_and_log_without_the_secret(
    settings: ProcessorSettings, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker(
        name="tb-worker",
        settings=WorkerSettings(secrets_policy={"tbcanary": {"definitions": ["tb-*"]}}),
        secrets=SecretStore({"tbcanary": CANARY}, use_env=False),
    )
    worker.action("tb.risky")(risky)
    caplog.set_level(logging.INFO)
    with RunClient(settings, timeout_s=10) as client:
        client.register(DEFINITION)
        with running(settings), WorkerThread(worker, settings):
            shallow = client.start("tb-fails", {"depth": 0}, run_id="tb-shallow")
            deep = client.start("tb-fails", {"depth": 100}, run_id="tb-deep")
            assert client.wait(shallow, timeout=60).status == "failed"
            assert client.wait(deep, timeout=60).status == "failed"
            events = {rid: list(client.events(rid)) for rid in (shallow, deep)}
        cli = Cli(settings)
        shown_events = cli("runs", "events", shallow).stdout + cli("runs", "events", shallow, "--json").stdout
        shown_get = cli("runs", "get", shallow).stdout + cli("runs", "get", shallow, "--json").stdout
    failed = next(e for e in events[shallow] if e["type"] == "StepFailed")["failure"]
    message = failed["message"]
    # the worker's message, after the engine's RetryExhausted prefix (the retries ran out)
    prefix = "risky failed after 1 attempts: "
    assert failed["code"] == "RetryExhausted"
    assert message.startswith(prefix + "RuntimeError: could not use token [redacted]\n")
    assert "Traceback (most recent call last)" in message and "ZeroDivisionError: division by zero" in message
    assert "in _divide" in message and "in risky" in message and "[redacted]" in message
    deep_failure = next(e for e in events[deep] if e["type"] == "StepFailed")["failure"]["message"]
    assert len(deep_failure) <= len(prefix) + MESSAGE_CHARS and "outer frames cut" in deep_failure
    assert len(deep_failure) > MESSAGE_CHARS - 200  # the bound is used, not a guess far below it
    assert deep_failure.rstrip().endswith("RuntimeError: could not use token [redacted]")
    # what the CLI shows: the traceback (runs events cuts its one-line summary; --json is whole)
    assert "Traceback (most recent call last)" in shown_events and "ZeroDivisionError" in shown_get
    # the worker's log: the traceback of the handler's exception, with the run and node
    logged = [r for r in caplog.records if r.name == "runfold.worker" and r.levelno == logging.ERROR]
    assert any("tb.risky" in r.getMessage() and "tb-shallow" in r.getMessage() for r in logged), logged
    text = caplog.text
    assert "Traceback (most recent call last)" in text and "in _divide" in text
    # the canary: nowhere
    for where in (orjson.dumps(events).decode(), shown_events, shown_get, text):
        assert CANARY not in where and CANARY[10:] not in where
