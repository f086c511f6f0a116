"""The client SDK against a real broker, a real processor and a real action worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from executor_support import WorkerThread
from processor_support import make_settings, running

import processors.demo.actions  # noqa: F401  (registers demo.flaky / demo.search)
from processors.client import (
    BrokerUnavailable,
    DefinitionConflict,
    InvalidDefinition,
    RunClient,
    RunfoldTimeout,
    RunNotFound,
    RunRejected,
    UnknownDefinition,
)
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology
from topology.settings import KafkaSettings, consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"

APPROVAL = {
    "schema": "runfold.workflow/v1",
    "id": "approval",
    "revision": 1,
    "state": {"draft": None, "approved": False},
    "output": {"from": "state", "pointer": "/approved"},
    "entry": ["draft"],
    "nodes": {
        "draft": {"kind": "action", "action": "echo", "writes": {"draft": {"from": "output"}}},
        "review": {
            "kind": "wait",
            "signal": "approval",
            "writes": {"approved": {"from": "signal", "pointer": "/approved"}},
        },
    },
    "routes": {"draft": ["review"]},
}
STRICT = {
    "schema": "runfold.workflow/v1",
    "id": "strict",
    "revision": 1,
    "input_schema": {"type": "object", "required": ["topic"], "properties": {"topic": {"type": "string"}}},
    "entry": ["a"],
    "nodes": {"a": {"kind": "action", "action": "echo"}},
}


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    # kafka_settings is requested for its cleanup (deletes the prefix's topics afterwards)
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    return s


@pytest.fixture
def client(settings: ProcessorSettings) -> Iterator[RunClient]:
    with RunClient(
        KafkaSettings(bootstrap_servers=settings.bootstrap_servers, topic_prefix=settings.topic_prefix),
        timeout_s=10,
    ) as c:
        for name in ("one-step.yaml", "flaky-retry.yaml"):
            c.register(EXAMPLES / name)
        c.register(APPROVAL)
        c.register(STRICT)
        yield c


@pytest.fixture
def system(settings: ProcessorSettings) -> Iterator[None]:
    with running(settings), WorkerThread(Worker(name="client-test", queues=["default", "agents"]), settings):
        yield


def test_start_wait_get_events_and_list(client: RunClient, system: None) -> None:
    run_id = client.start("one-step", {"text": "hello"})
    outcome = client.wait(run_id, timeout=60)
    assert outcome.status == "succeeded" and outcome.output == {"text": "hello"}
    view = client.get(run_id)
    assert view.status == "succeeded" and view.definition_id == "one-step" and view.revision == 1
    assert view.output == {"text": "hello"} and view.sequence == outcome.sequence
    assert view.steps()["echo"]["status"] == "succeeded"
    events = list(client.events(run_id))
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "RunAccepted" and events[-1]["type"] == "RunSucceeded"
    # a client-chosen id, started twice: one run, one terminal event
    client.start("one-step", {"text": "again"}, run_id="my-run-1", labels={"team": "a"})
    client.start("one-step", {"text": "again"}, run_id="my-run-1", labels={"team": "a"})
    assert client.wait("my-run-1", timeout=60).output == {"text": "again"}
    time.sleep(1.0)  # let a duplicate (if any) be processed before counting
    terminal = [
        e
        for e in client.events("my-run-1")
        if e["type"].startswith("Run") and e["type"] in ("RunSucceeded", "RunFailed", "RunCancelled")
    ]
    assert len(terminal) == 1
    listed = {v.run_id: v for v in client.runs()}
    assert listed[run_id].status == "succeeded" and listed["my-run-1"].status == "succeeded"
    # a second client (no remembered offsets) waits on an already finished run: answered from the snapshot
    with RunClient(client.settings, timeout_s=10) as other:
        assert other.wait(run_id, timeout=20).status == "succeeded"


def test_retry_signal_cancel(client: RunClient, system: None) -> None:
    flaky = client.start("flaky-retry", {"fail_times": 2, "key": "k"})
    waiting = client.start("approval", {"text": "draft"})
    doomed = client.start("approval", {"text": "never approved"})
    outcome = client.wait(flaky, timeout=60)
    assert outcome.status == "succeeded"
    kinds = [e["type"] for e in client.events(flaky)]
    assert kinds.count("StepRetryScheduled") == 2 and kinds.count("StepFailed") == 2
    # follow until the run waits for its signal, then approve it
    for ev in client.events(waiting, follow=True, timeout=30):
        if ev["type"] == "RunWaiting":
            break
    assert client.get(waiting).status == "waiting"
    client.signal(waiting, "approval", {"approved": True})
    assert client.wait(waiting, timeout=30).output is True
    client.cancel(doomed, reason="changed my mind")
    cancelled = client.wait(doomed, timeout=30)
    assert cancelled.status == "cancelled"


def test_typed_errors(client: RunClient, settings: ProcessorSettings) -> None:
    with pytest.raises(UnknownDefinition, match="nope"):
        client.start("nope", {})
    with pytest.raises(UnknownDefinition, match="revision 7"):
        client.start("one-step", {}, revision=7)
    bad = {**APPROVAL, "id": "bad", "entry": ["missing"]}
    with pytest.raises(InvalidDefinition, match=r"entry\[0\].*unknown_node"):
        client.register(bad)
    with pytest.raises(InvalidDefinition, match=r"broken\.yaml"):
        path = Path(settings.state_dir).parent / "broken.yaml"
        path.write_text("schema: runfold.workflow/v1\nid: broken\nrevision: 0\nentry: []\nnodes: {}\n")
        client.register(path)
    with pytest.raises(DefinitionConflict, match="approval@1"):
        client.register({**APPROVAL, "state": {"draft": None, "approved": True}})
    assert client.register(APPROVAL)["revision"] == 1  # identical content: a no-op
    with pytest.raises(RunNotFound):
        client.get("no-such-run")
    # no processor running: the command is durable but nothing answers in time
    run_id = client.start("one-step", {"text": "x"}, answer_timeout=0)
    with pytest.raises(RunfoldTimeout, match=run_id):
        client.wait(run_id, timeout=1.5)
    with (
        RunClient(KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="x"), timeout_s=2) as down,
        pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1"),
    ):
        down.start("one-step", {})


def test_rejected_start_raises(client: RunClient, system: None) -> None:
    with pytest.raises(RunRejected) as at_start:  # the processor's answer, where start was called
        client.start("strict", {"no_topic": 1})
    assert at_start.value.code == "InvalidInput"
    run_id = client.start("strict", {"no_topic": 1}, answer_timeout=0)  # not waited for: wait() tells
    with pytest.raises(RunRejected) as err:
        client.wait(run_id, timeout=30)
    assert err.value.code == "InvalidInput"


def test_wait_all_in_one_pass(client: RunClient, system: None) -> None:
    ids = [client.start("one-step", {"text": str(i)}) for i in range(8)]
    rejected = client.start("strict", {}, answer_timeout=0)
    outcomes = client.wait_all([*ids, rejected], timeout=60)
    assert {r: v.status for r, v in outcomes.items()} == {
        **{r: "succeeded" for r in ids},
        rejected: "rejected",
    }
    assert outcomes[ids[3]].output == {"text": "3"} and outcomes[ids[3]].definition_id == "one-step"
    assert outcomes[rejected].failure["code"] == "InvalidInput"
    # finished runs are answered from their snapshots by a client that did not start them
    with RunClient(client.settings, timeout_s=10) as other:
        assert {v.status for v in other.wait_all(ids, timeout=20).values()} == {"succeeded"}


def test_partition_matches_the_producer(client: RunClient, settings: ProcessorSettings) -> None:
    """The client's partition computation agrees with where librdkafka put the command."""
    ids = [f"p-{i}" for i in range(20)]
    for rid in ids:
        client.cancel(rid, answer_timeout=0)  # any command: lands on partition_for(rid)
    consumer = Consumer(consumer_config(settings, "partition-check"))
    parts = [TopicPartition(settings.topics.commands, p, 0) for p in range(settings.partitions)]
    consumer.assign(parts)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while len(seen) < len(ids) and time.monotonic() < deadline:
        for m in consumer.consume(100, 0.5):
            if m.error() is None:
                seen[m.key().decode()] = m.partition()
    consumer.close()
    assert seen == {rid: client.partition_of(rid) for rid in ids}
    assert len(set(seen.values())) == 2  # both partitions are used: the test can fail


def test_get_through_the_owners_query_endpoint(client: RunClient, settings: ProcessorSettings) -> None:
    with (
        running(settings.model_copy(update={"query_port": 0})) as pt,
        WorkerThread(Worker(name="query-test", queues=["default"]), settings),
    ):
        run_id = client.start("one-step", {"text": "q"})
        client.wait(run_id, timeout=60)
        with RunClient(client.settings, query_url=f"http://127.0.0.1:{pt.processor.query_port}") as q:
            view = q.get(run_id)
            assert (view.source, view.status, view.output) == ("query", "succeeded", {"text": "q"})
            from_snapshot = client.get(run_id)
            assert view.sequence == from_snapshot.sequence
            # the same view whichever answers: the engine's whole record (the query's ?view=state)
            assert view.state is not None and from_snapshot.state is not None
            assert view.state["input"] == from_snapshot.state["input"] == {"text": "q"}
            assert view.state["steps"].keys() == from_snapshot.state["steps"].keys()
            with pytest.raises(RunNotFound):  # the owner says 404 and no snapshot exists
                q.get("never-started")
    # the owner is gone: the client falls back to the snapshot topic
    with RunClient(
        client.settings, query_url=f"http://127.0.0.1:{pt.processor.query_port}", timeout_s=5
    ) as q:
        assert q.get(run_id).source == "snapshot"
