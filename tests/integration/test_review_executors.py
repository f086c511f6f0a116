"""An adversarial review of the workers against the real broker: a handler whose exception
cannot be printed, an action that echoes an agent provider's API key before any agent step ran,
a model that echoes it, worker settings that cannot serve, and where /metrics listens.

Each test quotes the promise it checks; those marked "failed before the fix" did."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_stand_in import Answer, StandIn
from executor_support import TERMINAL, ReceiptReader, WorkerThread, activation, produce
from leaks import leaks

from processors.executors import ActionContext, Worker, WorkerSettings
from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _terminal_by_run(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in records if r["type"] in TERMINAL}


def test_an_unprintable_exception_fails_its_step_and_frees_its_slot(kafka_settings: KafkaSettings) -> None:
    """docs/executors.md, "Writing actions": "Any other exception is `ExecutionFailed`,
    retryable"; "Receipts and leases": "handler raised | `ActivationFailed`". (Failed before the
    fix: describing the exception raised inside the runner, so no receipt was sent, the slot was
    never freed and, at concurrency 1, the next activation never ran.)"""
    create_topology(kafka_settings)
    worker = Worker(name="review", queues=["default"], concurrency=1, backlog=4)

    @worker.action("review.unprintable")
    def unprintable(ctx: ActionContext, input: Any) -> Any:
        raise _Unprintable()

    topic = TopicNames(kafka_settings.topic_prefix).activations("default")
    produce(
        kafka_settings,
        topic,
        "activations",
        [activation("r-bad", "review.unprintable"), activation("r-bad", "echo", {"ok": 1}, node="m")],
    )
    reader = ReceiptReader(kafka_settings)
    try:
        with WorkerThread(worker, kafka_settings) as wt:
            records = reader.poll_until(lambda rs: len([r for r in rs if r["type"] in TERMINAL]) >= 2, 30)
            assert wt.stop() == 0
    finally:
        reader.close()
    ends = {r["node"]: r for r in records if r["type"] in TERMINAL}
    assert set(ends) == {"n", "m"}, [(r["node"], r["type"]) for r in records]
    assert (ends["n"]["type"], ends["n"]["code"], ends["n"]["retryable"]) == (
        "ActivationFailed",
        "ExecutionFailed",
        True,
    )
    assert ends["n"]["message"].startswith("_Unprintable")
    assert ends["m"]["type"] == "ActivationCompleted"


def test_an_agent_provider_api_key_is_refused_in_outputs_before_any_agent_step(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/security.md, "What is enforced where": "every output ... checked (refused as
    `InvalidOutput` on a match), for every secret value the process knows: ... the agent
    providers' API keys". (Failed before the fix: until an agent step built the provider, the
    worker did not know its key and an action returning it completed.) Then a model that echoes
    the key in its answer: refused too (held)."""
    create_topology(kafka_settings)
    key = "LLMkey-" + secrets.token_hex(
        16
    )  # no `sk-` prefix: the secret-literal check must not be what refuses it
    var = f"REVIEW_KEY_{secrets.token_hex(4).upper()}"
    monkeypatch.setenv(var, key)
    with StandIn([Answer(text=f"my key is {key}")]) as model:
        settings = WorkerSettings.load(
            name="review",
            queues=["default", "agents"],
            agents={
                "providers": {"llm": {"kind": "openai", "base_url": model.base_url, "api_key_env": var}},
                "routes": {"*": "llm"},
            },
        )
        worker = Worker(settings=settings)

        @worker.action("review.env")
        def env(ctx: ActionContext, input: Any) -> Any:
            return {"debug": os.environ.get(var)}

        names = TopicNames(kafka_settings.topic_prefix)
        reader = ReceiptReader(kafka_settings)
        try:
            with WorkerThread(worker, kafka_settings) as wt:
                produce(
                    kafka_settings,
                    names.activations("default"),
                    "activations",
                    [activation("r-env", "review.env")],
                )
                reader.poll_until(lambda rs: "r-env" in _terminal_by_run(rs), 30)
                agent = activation(
                    "r-model",
                    "",
                    None,
                    queue="agents",
                    kind="agent",
                    agent={
                        "agent": "writer",
                        "model": "m",
                        "prompt": "say hi",
                        "output_schema": None,
                        "structured_output_attempts": 1,
                    },
                )
                produce(kafka_settings, names.activations("agents"), "activations", [agent])
                records = reader.poll_until(lambda rs: "r-model" in _terminal_by_run(rs), 30)
                assert wt.stop() == 0
        finally:
            reader.close()
    ends = _terminal_by_run(records)
    assert (ends["r-env"]["type"], ends["r-env"].get("code")) == ("ActivationFailed", "InvalidOutput"), ends[
        "r-env"
    ]
    assert (ends["r-model"]["type"], ends["r-model"].get("code")) == ("ActivationFailed", "InvalidOutput")
    assert (
        model.requests
        and model.requests[0].headers.get("Authorization", model.requests[0].headers.get("authorization"))
        == f"Bearer {key}"
    )
    for r in records:
        assert leaks(repr(r), key) == [], r


def _worker_cli(
    kafka_settings: KafkaSettings, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "RUNFOLD_WORKER_CONNECT_TIMEOUT_MS": "3000",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "processors.cli", "worker", "--log-format", "human", *args],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=40,
    )


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"RUNFOLD_WORKER_QUEUES": '["a b"]'}, ()),
        ({"RUNFOLD_WORKER_QUEUES": "[]"}, ()),
        ({}, ("--queue", "Tools/X")),
    ],
    ids=["space", "empty", "slash-option"],
)
def test_a_queue_that_cannot_be_served_is_refused_with_one_line_and_exit_2(
    kafka_settings: KafkaSettings, env: dict[str, str], args: tuple[str, ...]
) -> None:
    """docs/executors.md, "Child-run executor", **Exit codes**: "2 configuration (settings
    refused, ...: fix it before restarting)"; the worker serves `<prefix>.activations.<queue>`.
    (Failed before the fix: `[]` was a 60-line traceback and exit 1; "a b" and "Tools/X" never
    exited, logging consumer errors.)"""
    started = time.monotonic()
    done = _worker_cli(kafka_settings, env, *args)
    assert done.returncode == 2, (done.returncode, done.stderr[-800:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "queue" in lines[0], lines
    assert time.monotonic() - started < 30


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_worker_metrics_endpoint_listens_on_loopback_unless_told(kafka_settings: KafkaSettings) -> None:
    """docs/security.md, "HTTP endpoints": "They listen on `127.0.0.1` by default
    (`RUNFOLD_WORKER_METRICS_HOST`, ...)" (held)."""
    create_topology(kafka_settings)
    worker = Worker(name="review", queues=["default"], metrics_port=0)
    with WorkerThread(worker, kafka_settings) as wt:
        end = time.monotonic() + 20
        while wt.runner.metrics_port is None and time.monotonic() < end:
            time.sleep(0.05)
        port = wt.runner.metrics_port
        assert port
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
        other = _non_loopback_address()
        if other is not None:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{other}:{port}/metrics", timeout=5)
        assert wt.stop() == 0
