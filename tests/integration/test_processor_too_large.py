"""An input whose outputs the broker refuses as too large is dead-lettered, not retried forever,
and its run is told: a terminal receipt becomes a non-retryable InvalidOutput failure of its step,
a command becomes a `Limit` rejection, a fired timer fails its run (`Limit`).

The engine's ceilings (256 KiB outputs) sit under Kafka's default record limit; here the limits
are lowered below them so outputs the engine accepts are still refused: the run-events topic
takes at most 20,000 bytes (the broker refuses the batch) and the processor's producer at most
200,000 (produce() refuses it at once).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from processor_support import (
    CODEC,
    DEFINITIONS,
    Commands,
    Reader,
    Responder,
    action,
    complete_all,
    make_settings,
    running,
    settled_value,
    setup_topology,
    terminal_of,
    workflow,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC_LIMIT = 20_000
PRODUCER_LIMIT = 200_000


def _incompressible(n: int) -> str:
    return base64.b64encode(os.urandom(n * 3 // 4)).decode()  # lz4 finds little to shrink


def _limit_topic(bootstrap: str, topic: str, max_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])]
    ).values():
        future.result(30)


def test_input_with_too_large_output_goes_to_dead_letters_its_run_is_told_and_the_partition_moves_on(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> None:
    # kafka_settings is requested for its cleanup: it deletes the prefix's topics afterwards.
    clients = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    settings = make_settings(
        kafka_bootstrap,
        topic_prefix,
        tmp_path / "state",
        query_port=0,
        client_overrides={"message.max.bytes": str(PRODUCER_LIMIT)},
    )
    setup_topology(clients)
    _limit_topic(kafka_bootstrap, clients.topics.run_events, TOPIC_LIMIT)
    events = Reader(clients, [clients.topics.run_events], "run_events")
    dead = Reader(clients, [clients.topics.dead_letters], "dead_letters")
    activations = Reader(clients, [clients.topics.activations("default")], "activations")
    cmd = Commands(clients)
    runs = ["big-broker", "big-client", "ok-1", "ok-2", "ok-3"]
    with running(settings):
        for run_id in runs:
            cmd.start(run_id, "one")
        cmd.flush()
        activations.wait_for(lambda acts: {a["run_id"] for a in acts} >= set(runs), what="5 activations")
    # The processor is stopped: all receipts wait in the topic, so the restarted processor folds
    # them in one transaction and must find the two culprits among them.
    # big-broker: its events (40 KB) pass the engine and the producer, the topic refuses them;
    # big-client: its StepSucceeded (240 KB, under the engine's 256 KiB) is over the producer's limit.
    outputs = {"big-broker": _incompressible(40_000), "big-client": _incompressible(240_000)}
    for act in activations.records:
        cmd.complete(act, {"text": outputs.get(act["run_id"], "small")})
    # big-start: its RunAccepted (30 KB of input, under the engine's 256 KiB) is over the topic's limit
    cmd.start("big-start", "one", {"text": _incompressible(30_000)})
    cmd.flush()
    with running(settings) as pt:
        events.wait_for(
            lambda evs: (
                all(terminal_of(evs, r) for r in runs)
                and any(e["type"] == "RunRejected" for e in evs if e["run_id"] == "big-start")
            ),
            timeout=90,
            what="every run to finish, big-start to be rejected",
        )
        dead.wait_for(lambda d: len(d) >= 3, timeout=90, what="3 dead letters")
        # the partition is not jammed: a new run goes through (the responder reads every
        # activation from the beginning: it answers only the new run's)
        with Responder(clients, lambda c, act: complete_all(c, act) if act["run_id"] == "after" else None):
            cmd.start("after", "one")
            cmd.flush()
            events.wait_for(lambda evs: terminal_of(evs, "after"), what="the next run to finish")
        assert settled_value(pt.processor.metrics.dead_letters.labels("output_too_large"), 3) == 3
        # the poison receipts' own effects were never applied; their steps failed in their place
        base = f"http://127.0.0.1:{pt.processor.query_port}"
        for run_id in ("big-broker", "big-client"):
            body = httpx.get(f"{base}/runs/{run_id}", params={"view": "state"}, timeout=5).json()
            step = body["state"]["steps"]["a"]
            assert body["status"] == "failed" and step["status"] == "failed" and step["output"] is None
            assert step["failure"]["code"] == "InvalidOutput" and not step["failure"]["retryable"]
    activation_of = {a["run_id"]: a for a in activations.records}
    assert {d["key"] for d in dead.records} == {b"big-broker", b"big-client", b"big-start"}
    start_dead = next(d for d in dead.records if d["key"] == b"big-start")
    assert start_dead["source_topic"] == clients.topics.commands and start_dead["original"]
    [rejected] = events.of("big-start")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Limit"
    assert "larger than the broker accepts" in rejected["reason"] and rejected["command_type"] == "StartRun"
    for d in (d for d in dead.records if d["key"] != b"big-start"):
        assert d["source_topic"] == clients.topics.receipts and d["producer"] == "processor"
        assert d["error"].startswith("output too large: ") and d["source_offset"] >= 0
        run_id = d["key"].decode()
        assert d["source_partition"] == activation_of[run_id]["_partition"]  # co-partitioned with its run
    by_run = {d["key"].decode(): d["error"] for d in dead.records}
    assert "too large" in by_run["big-start"].lower()
    assert "run-events record of" in by_run["big-client"] and "refused" in by_run["big-client"]  # produce()
    # the dead letter keeps the poison input's bytes, unless that made the dead letter itself too large
    big_broker = next(d for d in dead.records if d["key"] == b"big-broker")
    assert CODEC.decode("receipts", big_broker["original"])["output"] == {"text": outputs["big-broker"]}
    assert next(d for d in dead.records if d["key"] == b"big-client")["original"] == b""
    assert "too large" in by_run["big-broker"].lower() and "record of" not in by_run["big-broker"]  # broker
    for run_id in ("big-broker", "big-client"):
        assert not events.of(run_id, "StepSucceeded") and not events.of(run_id, "StepRetryScheduled")
        [failed] = events.of(run_id, "StepFailed")
        assert (
            failed["failure"]["code"] == "InvalidOutput"
            and "larger than the broker accepts" in failed["failure"]["message"]
        )
        assert [e["type"] for e in terminal_of(events.records, run_id)] == ["RunFailed"]
    for run_id in ("ok-1", "ok-2", "ok-3", "after"):
        assert [e["type"] for e in terminal_of(events.records, run_id)] == ["RunSucceeded"]
        mine = events.of(run_id)
        assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1))
    for reader in (events, dead, activations):
        reader.close()


def test_a_fired_timer_whose_outputs_are_refused_fails_its_run_instead_of_leaving_it_asleep(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> None:
    # A sleep wakes into an activation carrying the run's input (15 KB), over the activation
    # topic's limit (10,000 bytes); the run's events (unlimited) still take that input.
    settings = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", query_port=0)
    sleep_then_act = workflow(
        "sleep-then-act", {"s": {"kind": "sleep", "duration_ms": 200}, "b": action("b")}, {"s": ["b"]}
    )
    setup_topology(settings, [*DEFINITIONS, sleep_then_act])
    _limit_topic(kafka_bootstrap, settings.topics.activations("default"), 10_000)
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    cmd = Commands(settings)
    with running(settings) as pt, Responder(settings, complete_all):
        cmd.start("sleeper", "sleep-then-act", {"text": _incompressible(15_000)})
        cmd.start("small", "sleep-then-act", {"text": "small"})
        cmd.flush()
        events.wait_for(
            lambda evs: terminal_of(evs, "sleeper") and terminal_of(evs, "small"), what="both runs to finish"
        )
        dead.wait_for(lambda d: len(d) >= 1, what="the timer's dead letter")
        assert settled_value(pt.processor.metrics.dead_letters.labels("output_too_large"), 1) == 1
        body = httpx.get(
            f"http://127.0.0.1:{pt.processor.query_port}/runs/sleeper", params={"view": "state"}, timeout=5
        ).json()
        assert body["status"] == "failed" and body["state"]["steps"]["s"]["status"] == "cancelled"
    [letter] = dead.records
    assert letter["key"] == b"sleeper" and letter["source_topic"] == settings.topics.receipts
    assert CODEC.decode("receipts", letter["original"])["type"] == "TimerFired"
    assert letter["error"].startswith("output too large: ")
    [failed] = terminal_of(events.records, "sleeper")
    assert failed["type"] == "RunFailed" and failed["failure"]["code"] == "Limit"
    assert failed["failure"]["message"].startswith(
        "the outputs of this timer are larger than the broker accepts"
    )
    assert not events.of("sleeper", "StepSucceeded")  # the wake-up itself was never applied
    assert [e["type"] for e in terminal_of(events.records, "small")] == ["RunSucceeded"]
    for reader in (events, dead):
        reader.close()
