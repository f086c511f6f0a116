"""Issue 24, points 2 and 4, against a real broker and processor through the CLI: registration
refuses what it can know (a queue the topology does not serve); deprecate / promote / unpin
travel on the definitions topic and the processor starts what they say; a signal whose payload
fails the wait's payload_schema is refused where it was typed (exit 6, the schema path) and the
run keeps waiting; accept_early: false refuses a signal sent before the wait is reached."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from processor_support import make_settings, running
from test_cli import Cli

from processors.client import RunClient
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WAIT = """schema: runfold.workflow/v1
id: gate
revision: {revision}
state: {{reviewer: null}}
output: {{from: state, pointer: /reviewer}}
entry: [{entry}]
nodes:
  nap: {{kind: sleep, duration_ms: 12000}}
  review: {{kind: wait, signal: approval, accept_early: {early},
           payload_schema: {{type: object, required: [reviewer], properties: {{reviewer: {{type: string}}}}}},
           writes: {{reviewer: {{from: signal, pointer: /reviewer}}}}}}
routes:
  nap: [review]
"""


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


@pytest.fixture
def cli(settings: ProcessorSettings, tmp_path: Path) -> Cli:
    c = Cli(settings)
    defs = tmp_path / "defs"
    defs.mkdir()
    # gate@1: the wait first, early signals kept; gate@2: a sleep first, early signals refused
    (defs / "gate-1.yaml").write_text(WAIT.format(revision=1, entry="review", early="true"))
    (defs / "gate-2.yaml").write_text(WAIT.format(revision=2, entry="nap", early="false"))
    c("defs", "register", str(defs))
    return c


@pytest.fixture
def processor(settings: ProcessorSettings, cli: Cli) -> Iterator[None]:
    with running(settings):
        yield


def status(cli: Cli, run_id: str, wanted: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        got = cli.json("runs", "get", run_id)
        if got["status"] == wanted or time.monotonic() > deadline:
            assert got["status"] == wanted, got
            return got
        time.sleep(0.3)


def started(cli: Cli, target: str, run_id: str) -> int:
    """Start `target` (id or id@rev); the revision the processor pinned."""
    assert cli.json("runs", "start", target, "--run-id", run_id)["answer"] == "accepted"
    return int(cli.json("runs", "get", run_id)["revision"])


def test_register_refuses_a_queue_the_topology_does_not_serve(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "tools.yaml"
    f.write_text(
        "schema: runfold.workflow/v1\nid: tools\nrevision: 1\nentry: [s]\n"
        "nodes: {s: {kind: action, action: echo, queue: tools}}\n"
    )
    out = cli("defs", "register", str(f), code=1)
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"✗ {f}: tools@1: error: nodes.s.queue: unknown queue 'tools'")
    assert "RUNFOLD_ACTIVATION_QUEUES=agents,default,tools" in line and line.endswith("[unknown_queue]")
    assert cli.json("defs", "show", "tools", code=4)["error_type"] == "UnknownDefinition"
    refused = cli.json("defs", "register", str(f), code=1)
    assert refused["definition"] == "tools@1" and refused["ok"] is False, refused
    # a file that fails on its own (before the registry is read) is named the same way; one
    # that names no readable id@revision gets "?"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "schema: runfold.workflow/v1\nid: shop\nrevision: 2\nentry: [a]\nnodes: {a: {kind: nope}}\n"
    )
    (line,) = cli("defs", "register", str(bad), code=1).stderr.strip().splitlines()
    assert line.startswith(f"✗ {bad}: shop@2: error: nodes.a"), line
    bad.write_text("schema: runfold.workflow/v1\nid: 7\nentry: [a]\nnodes: {a: {kind: action, action: x}}\n")
    lines = cli("defs", "register", str(bad), code=1).stderr.strip().splitlines()
    assert lines and all(x.startswith(f"✗ {bad}: ?: error: ") for x in lines), lines
    # the same file, once the topology serves the queue: the check reads RUNFOLD_ACTIVATION_QUEUES
    assert cli.json("defs", "register", str(f), env={"RUNFOLD_ACTIVATION_QUEUES": "default,agents,tools"})[
        "ok"
    ]


def test_a_signal_of_the_wrong_shape_is_refused_and_the_run_keeps_waiting(cli: Cli, processor: None) -> None:
    rid = cli.json("runs", "start", "gate@1", "--run-id", "gate-shape")["run_id"]
    status(cli, rid, "waiting")
    out = cli("runs", "signal", rid, "approval", "--payload", '{"approved": true}', code=6)
    assert "SignalRun to run 'gate-shape' rejected: InvalidInput" in out.stderr
    assert "at $ fails 'required': missing 'reviewer'" in out.stderr
    typed = cli.json("runs", "signal", rid, "approval", "--payload", '{"reviewer": 3}', code=6)
    assert typed["code"] == "InvalidInput" and "$.reviewer fails 'type': expected string" in typed["reason"]
    assert status(cli, rid, "waiting")["failure"] is None
    took = cli.json("runs", "signal", rid, "approval", "--payload", '{"reviewer": "ana"}')
    assert took["answer"] == "accepted" and took["event"] == "SignalReceived"
    assert status(cli, rid, "succeeded")["output"] == "ana"


def test_accept_early_false_refuses_a_signal_before_the_wait_then_takes_one(
    cli: Cli, processor: None
) -> None:
    rid = cli.json("runs", "start", "gate@2", "--run-id", "gate-early")["run_id"]
    early = cli.json("runs", "signal", rid, "approval", "--payload", '{"reviewer": "early"}', code=6)
    assert early["code"] == "Conflict" and "accept_early: false" in early["reason"]
    status(cli, rid, "waiting", timeout=40)  # the 12 s sleep fired, the wait is reached
    assert cli.json("runs", "signal", rid, "approval", "--payload", '{"reviewer": "late"}')["ok"]
    assert status(cli, rid, "succeeded")["output"] == "late"


def test_deprecate_promote_unpin_decide_what_the_processor_starts(cli: Cli, processor: None) -> None:
    assert started(cli, "gate", "l-1") == 2  # the highest
    running_one = cli.json("runs", "start", "gate@1", "--run-id", "l-old")["run_id"]
    status(cli, running_one, "waiting")
    done = cli.json("defs", "deprecate", "gate@1", "--reason", "old prompt")
    assert (done["event"], done["latest"]) == ("deprecated", 2)
    refused = cli("runs", "start", "gate@1", "--run-id", "l-2", code=6)
    assert "rejected: Conflict" in refused.stderr and "gate@1 is deprecated (old prompt)" in refused.stderr
    # a run started before goes on
    assert cli.json("runs", "signal", running_one, "approval", "--payload", '{"reviewer": "x"}')["ok"]
    status(cli, running_one, "succeeded")
    # promote refuses a deprecated revision; reinstate, promote, and gate means gate@1
    assert "reinstate it first" in cli("defs", "promote", "gate@1", code=1).stderr
    cli("defs", "deprecate", "gate@1", "--undo")
    assert cli.json("defs", "promote", "gate@1")["latest"] == 1
    assert started(cli, "gate", "l-3") == 1
    listed = {r["revision"]: r for r in cli.json("defs", "list")}
    assert listed[1]["latest"] and listed[1]["promoted"] and not listed[2]["latest"]
    assert "1 (promoted)" in cli("defs", "list").stdout
    # deprecating the promoted one falls back to the highest live revision; all deprecated: NotFound
    cli("defs", "deprecate", "gate@1")
    assert started(cli, "gate", "l-4") == 2
    cli("defs", "deprecate", "gate@2")
    none_left = cli.json("runs", "start", "gate", "--run-id", "l-5", code=6)
    assert none_left["code"] == "NotFound" and "every revision of gate is deprecated" in none_left["reason"]
    assert "none (all deprecated)" in cli("defs", "list").stdout
    cli("defs", "deprecate", "gate@2", "--undo")
    assert cli.json("defs", "unpin", "gate")["latest"] == 2


def test_a_processor_started_after_the_events_folds_them_at_catch_up(
    cli: Cli, settings: ProcessorSettings
) -> None:
    """The events are on the topic before the processor starts: its catch-up folds them as the
    running processor's poll does, so a processor that starts later agrees."""
    cli("defs", "promote", "gate@1")
    cli("defs", "deprecate", "gate@2")
    with running(settings):
        refused = cli.json("runs", "start", "gate@2", "--run-id", "c-2", code=6)
        assert refused["code"] == "Conflict" and "gate@2 is deprecated" in refused["reason"]
        assert cli.json("runs", "start", "gate", "--run-id", "c-1")["answer"] == "accepted"
        with RunClient(settings, timeout_s=30) as client:
            assert client.get("c-1").revision == 1  # the promoted one, not the highest
