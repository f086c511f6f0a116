"""A hostile review of docs/security.md against the real broker: a processor that must refuse
secret literals an object with a `from` key or a secret-looking key hid, and whose query port
must not answer a foreign host name without a token; a `runfold worker` process whose handlers
leak a canary through what Python itself writes (a thread's uncaught exception, a warning,
`__del__`, a logger named after it), searched for in its stderr.

Each test quotes the promise it checks; each failed before its fix (see the review's report)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from executor_support import TERMINAL, ReceiptReader, WorkerThread, activation, produce
from leaks import leaks
from processor_support import (
    Commands,
    Reader,
    Responder,
    action,
    make_settings,
    running,
    setup_topology,
    workflow,
)

from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology, delete_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
KEY_LITERAL = "sk-live-" + secrets.token_hex(8)


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    # kafka_settings is requested for its cleanup: it deletes the prefix's topics afterwards.
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", query_port=0)
    setup_topology(s, [workflow("rvs-one", {"a": action("a")})])
    return s


def _answer(commands: Commands, act: dict[str, Any]) -> None:
    if act["type"] == "ActionActivation":
        # a custom executor's output: `from` is a key like any other in run data
        commands.complete(act, {"reply": {"from": "upstream", "access_token": "tok-12345678"}})


def test_the_processor_refuses_secret_literals_hidden_by_a_from_key_or_used_as_keys(
    settings: ProcessorSettings,
) -> None:
    """docs/security.md, "What is enforced where": "run inputs, signal payloads and action outputs
    holding a secret-looking literal (...: keys such as `api_key`, `password`, values such as
    `Bearer ...`, `sk-...`) are refused, naming the path, never the value". Before the fix the
    two inputs were accepted (the runs started) and the output completed the step."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    with running(settings), Responder(settings, _answer):
        cmd.start("rvs-from", "rvs-one", {"login": {"from": "form", "password": "hunter2hunter2"}})
        cmd.start("rvs-key", "rvs-one", {"keys": {KEY_LITERAL: "prod"}})
        cmd.start("rvs-out", "rvs-one", {"fine": True})
        cmd.flush()
        events.wait_for(
            lambda evs: all(
                any(
                    e["run_id"] == r and e["type"] in ("RunRejected", "RunSucceeded", "RunFailed")
                    for e in evs
                )
                for r in ("rvs-from", "rvs-key", "rvs-out")
            ),
            what="an end for each run",
        )
    [from_rejected] = events.of("rvs-from")
    assert from_rejected["type"] == "RunRejected", from_rejected
    assert from_rejected["code"] == "InvalidInput" and "input.login.password" in from_rejected["reason"]
    [key_rejected] = events.of("rvs-key")
    assert key_rejected["type"] == "RunRejected" and key_rejected["code"] == "InvalidInput", key_rejected
    for event in events.records:
        assert leaks(repr(event), KEY_LITERAL) == [], event
        assert "hunter2h" not in repr(event) and "tok-1234" not in repr(event)
    [failed] = events.of("rvs-out", "StepFailed")
    assert failed["failure"]["code"] == "InvalidOutput", failed
    assert "output.reply.access_token" in failed["failure"]["message"]
    events.close()


def test_the_query_port_without_a_token_answers_loopback_names_only(settings: ProcessorSettings) -> None:
    """docs/security.md, "Settings": "The defaults are meant to be safe on a laptop ... nothing
    listens beyond this machine". A page elsewhere re-pointed at 127.0.0.1 (DNS rebinding) sends
    its own name as Host; before the fix the processor's tokenless query port answered it the
    run's whole state (input included)."""
    cmd = Commands(settings)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    with running(settings) as pt, Responder(settings, lambda c, a: c.complete(a, {"ok": 1})):
        cmd.start("rvs-q", "rvs-one", {"customer": "ada-lovelace-1815"})
        cmd.flush()
        events.wait_for(lambda evs: any(e["type"] == "RunSucceeded" for e in evs), what="the run to succeed")
        port = pt.processor.query_port
        base = f"http://127.0.0.1:{port}"
        own = httpx.get(f"{base}/runs/rvs-q", params={"view": "state"}, timeout=10)
        assert own.status_code == 200 and "ada-lovelace-1815" in own.text
        for name in (f"rebind.example:{port}", f"localhost.rebind.example:{port}"):
            answer = httpx.get(
                f"{base}/runs/rvs-q", params={"view": "state"}, headers={"Host": name}, timeout=10
            )
            assert answer.status_code == 403, (name, answer.status_code)
            assert "ada-lovelace" not in answer.text
    events.close()


_LEAKY_ACTIONS = """
import gc
import logging
import threading
import warnings

from processors.executors import ActionContext, action


@action("rvs.thread")
def in_thread(ctx: ActionContext, input):
    secret = ctx.secrets.get("rvs")

    def crash():
        raise ValueError("a helper thread could not use " + secret)

    helper = threading.Thread(target=crash, name="rvs-helper")
    helper.start()
    helper.join()
    return {"ok": True}


@action("rvs.warn")
def warn(ctx: ActionContext, input):
    warnings.warn("deprecated token " + ctx.secrets.get("rvs"))
    return {"ok": True}


class _Closing:
    def __init__(self, secret):
        self.secret = secret

    def __del__(self):
        raise RuntimeError("closing the session of " + self.secret)


@action("rvs.del")
def gone(ctx: ActionContext, input):
    _Closing(ctx.secrets.get("rvs"))
    gc.collect()
    return {"ok": True}


@action("rvs.logger")
def named(ctx: ActionContext, input):
    logging.getLogger("client." + ctx.secrets.get("rvs")).warning("a logger named after the token")
    return {"ok": True}
"""


@pytest.mark.parametrize("fmt", ["json", "human"])
def test_what_python_writes_about_a_worker_holds_no_secret(
    kafka_settings: KafkaSettings, tmp_path: Path, fmt: str
) -> None:
    """docs/security.md: "every failure message, cancel reason, log record (any logger of the
    worker process, with its exception and stack) ... is redacted ... for every secret value the
    process knows". Before the fix the worker's stderr held the canary four times: Python's own
    report of a thread's uncaught exception, of a warning and of an exception in `__del__`
    (none through logging), and a log record of a logger named after it."""
    create_topology(kafka_settings)
    canary = "CaNaRyW4-" + secrets.token_urlsafe(18)
    (tmp_path / "rvs_leaky_actions.py").write_text(_LEAKY_ACTIONS)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "PYTHONPATH": str(tmp_path),
        "RUNFOLD_SECRET_RVS": canary,
        "RUNFOLD_WORKER_SECRETS_POLICY": '{"rvs": {"definitions": ["test"]}}',
    }
    args = [sys.executable, "-m", "processors.cli", "worker", "--module", "rvs_leaky_actions"]
    args += ["--queue", "default", "--log-format", fmt, "--log-level", "INFO"]
    stderr = tmp_path / "worker.err"
    names = ["rvs.thread", "rvs.warn", "rvs.del", "rvs.logger"]
    reader = ReceiptReader(kafka_settings)
    with stderr.open("wb") as err:
        worker = subprocess.Popen(args, env=env, cwd=ROOT, stderr=err, stdout=subprocess.DEVNULL)
        try:
            acts = [
                activation(f"rvs-{i}", name, {}, capabilities=["secret:rvs"]) for i, name in enumerate(names)
            ]
            produce(
                kafka_settings,
                TopicNames(kafka_settings.topic_prefix).activations("default"),
                "activations",
                acts,
            )
            records = reader.poll_until(
                lambda rs: len({r["run_id"] for r in rs if r["type"] in TERMINAL}) >= len(names), 60
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
            reader.close()
    ends = {r["run_id"]: r for r in records if r["type"] in TERMINAL}
    assert all(end["type"] == "ActivationCompleted" for end in ends.values()), ends
    text = stderr.read_text()
    for said in (
        "a helper thread could not use",
        "deprecated token",
        "closing the session of",
        "a logger named",
    ):
        assert said in text, (said, text[-3000:])  # written, so the search below is not vacuous
    assert leaks(text, canary) == [], text[-3000:]
    for r in records:
        assert leaks(repr(r), canary) == [], r


def test_an_activation_cannot_claim_another_queue_or_a_lookalike_capability(
    kafka_settings: KafkaSettings, request: pytest.FixtureRequest
) -> None:
    """docs/security.md: the policy's queue "is the topic the activation came from", and the
    capability is `secret:<name>`. On the `default` topic, an activation whose record says
    `queue: tools` is not served as tools; capabilities in another case, with spaces or a
    Cyrillic letter grant nothing; the real one on the `tools` topic does (held)."""
    from processors.executors import SecretStore, Worker
    from processors.executors.settings import SecretRule

    kafka_settings = kafka_settings.model_copy(update={"activation_queues": ("default", "agents", "tools")})
    create_topology(kafka_settings)
    request.addfinalizer(lambda: delete_topology(kafka_settings))  # the fixture's cleanup has no tools
    value = "tools-only-" + secrets.token_hex(8)
    worker = Worker(
        name="review",
        queues=["default", "tools"],
        secrets=SecretStore({"api": value}, use_env=False),
        secrets_policy={"api": SecretRule(queues=["tools"])},
    )

    @worker.action("review.use")
    def use(ctx: Any, input: Any) -> Any:
        ctx.secrets.get("api")
        return {"used": True}

    names = TopicNames(kafka_settings.topic_prefix)
    claims = {
        "rvs-claims-tools": ("default", ["secret:api"]),
        "rvs-case": ("tools", ["Secret:api", "secret:API"]),
        "rvs-space": ("tools", [" secret:api", "secret:api "]),
        "rvs-lookalike": ("tools", ["secret:\u0430pi"]),  # Cyrillic a
        "rvs-granted": ("tools", ["secret:api"]),
    }
    reader = ReceiptReader(kafka_settings)
    try:
        with WorkerThread(worker, kafka_settings) as wt:
            for run_id, (topic_queue, caps) in claims.items():
                act = activation(run_id, "review.use", {}, queue="tools", capabilities=caps)
                produce(kafka_settings, names.activations(topic_queue), "activations", [act])
            records = reader.poll_until(
                lambda rs: len({r["run_id"] for r in rs if r["type"] in TERMINAL}) >= len(claims), 60
            )
            assert wt.stop() == 0
    finally:
        reader.close()
    ends = {r["run_id"]: r for r in records if r["type"] in TERMINAL}
    assert ends["rvs-granted"]["type"] == "ActivationCompleted", ends["rvs-granted"]
    for run_id in set(claims) - {"rvs-granted"}:
        assert (ends[run_id]["type"], ends[run_id]["code"]) == ("ActivationFailed", "PermissionDenied"), ends[
            run_id
        ]
    assert "queue 'default'" in ends["rvs-claims-tools"]["message"]
    for r in records:
        assert leaks(repr(r), value) == [], r
