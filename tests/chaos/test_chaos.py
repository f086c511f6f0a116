"""Chaos scenarios against the suite's own broker; each ends with the same proof (checks.prove).

Sizes (CI): processor kill -9 x RUNFOLD_CHAOS_KILLS (5) during RUNFOLD_CHAOS_RUNS (400) 3-step runs;
worker kill -9 x3 during 60 runs of two 300 ms actions (8 at a time); 1,000 garbage records + 200 bad
commands beside 100 good runs; a zombie processor (same instance id) under 200 runs; one
broker restart under 300 runs.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from checks import TERMINAL, Coord, prove
from confluent_kafka import Producer
from fleet import Fleet
from processor_support import CODEC, Commands, Reader, now_ms

from processors.runtime.settings import ProcessorSettings
from topology import local_kafka
from topology.settings import producer_config

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
RUNS = int(os.environ.get("RUNFOLD_CHAOS_RUNS", "400"))
KILLS = int(os.environ.get("RUNFOLD_CHAOS_KILLS", "5"))
SEED = int(time.time())  # printed on failure through the run ids' scenario line


def _terminal(reader: Reader) -> set[str]:
    return {r["run_id"] for r in reader.records if r["type"] in TERMINAL}


def wait_terminal(
    reader: Reader,
    runs: set[str],
    timeout: float,
    fleet: Fleet,
    supervise: bool = False,
    tick: Callable[[], None] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not runs <= _terminal(reader):
        if time.monotonic() > deadline:
            left = sorted(runs - _terminal(reader))
            raise AssertionError(
                f"{len(left)} runs not terminal after {timeout:.0f}s, e.g. {left[:5]}; logs: {fleet.tails()}"
            )
        reader.poll(0.2)
        if supervise:
            fleet.supervise()
        if tick is not None:
            tick()


def send_spread(cmd: Commands, runs: list[str], definition: str, seconds: float) -> threading.Thread:
    """Start `runs` evenly over `seconds` from a thread (the load the faults land in)."""

    def _go() -> None:
        t0 = time.monotonic()
        for i, r in enumerate(runs):
            delay = t0 + seconds * i / len(runs) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            cmd.start(r, definition, {"i": i})
        cmd.flush()

    t = threading.Thread(target=_go, daemon=True)
    t.start()
    return t


@pytest.mark.timeout(300)
def test_processor_kill_9_at_random_moments(chaos_settings: ProcessorSettings, tmp_path: Path) -> None:
    s, rng = chaos_settings, random.Random(SEED)
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    runs = [f"k-{i:04d}" for i in range(RUNS)]
    try:
        sender = send_spread(Commands(s), runs, "noop3", seconds=KILLS * 3.0)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.5))
            events.poll(0)
            fleet.kill9("p1")
            fleet.processor("p1")  # same instance id and store: restore, fence its own zombie txn
            fleet.ready()
        sender.join(60)
        wait_terminal(events, set(runs), 180, fleet)
    finally:
        codes = fleet.stop()
        events.close()
    assert fleet.kills["p1"] == KILLS
    assert codes["p1"] == 0, fleet.tails()
    proof = prove(
        f"processor kill -9 x{KILLS} during {RUNS} runs",
        s,
        started=set(runs),
        extra={"kills": KILLS, "seed": SEED},
    )
    assert proof.terminal_by_type == {"RunSucceeded": RUNS}


@pytest.mark.timeout(240)
def test_worker_kill_9_during_actions(chaos_settings: ProcessorSettings, tmp_path: Path) -> None:
    s, rng = chaos_settings, random.Random(SEED)
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1", concurrency=8)  # ~4 s of queued work: every kill lands on running actions
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    runs = [f"w-{i:03d}" for i in range(60)]
    try:
        cmd = Commands(s)
        for i, r in enumerate(runs):
            cmd.start(r, "slow2", {"i": i})
        cmd.flush()
        for _ in range(3):
            # kill while actions run: after some step has started
            events.wait_for(lambda recs: any(e["type"] == "StepStarted" for e in recs), 60, "a started step")
            time.sleep(rng.uniform(0.1, 0.5))
            fleet.kill9("w1")
            time.sleep(rng.uniform(0.2, 1.0))
            fleet.worker("w1", concurrency=8)
        wait_terminal(events, set(runs), 150, fleet)
    finally:
        fleet.stop()
        events.close()
    proof = prove(
        "worker kill -9 x3 during 60 runs of 2 sleeping actions",
        s,
        started=set(runs),
        extra={"worker_kills": 3, "seed": SEED},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}
    assert proof.retried_attempts > 0, "no activation was retried: the kills hit no running action"


class _Raw:
    """A plain producer that remembers where each record landed (delivery reports)."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.producer = Producer(producer_config(settings, linger_ms=5))
        self.coords: list[Coord] = []
        self.failed: list[str] = []

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.coords.append((msg.topic(), msg.partition(), msg.offset()))
        else:
            self.failed.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self.producer.produce(topic, value, key, on_delivery=self._delivered)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0
        assert not self.failed, self.failed[:3]


def garbage_records(
    rng: random.Random, n: int, topics: list[str]
) -> list[tuple[str, bytes | None, bytes | None]]:
    """Undecodable input of every shape the processor must dead-letter, never choke on."""
    valid = CODEC.encode(
        "commands",
        {
            "type": "StartRun",
            "run_id": "g-owner",
            "ts_ms": now_ms(),
            "record_id": "x",
            "definition_id": "noop3",
            "revision": None,
            "input": {},
        },
    )
    out: list[tuple[str, bytes | None, bytes | None]] = []
    for i in range(n):
        topic = topics[i % len(topics)]
        key = f"g-{i}".encode() if rng.random() < 0.9 else None
        shape = i % 6
        if shape == 0:
            value: bytes | None = rng.randbytes(rng.randint(1, 300))
        elif shape == 1:
            value = b"\xc3\x01" + rng.randbytes(rng.randint(0, 60))  # single-object magic, junk after it
        elif shape == 2:
            value = None  # a tombstone on an input topic
        elif shape == 3:
            value = b""
        elif shape == 4:
            value = valid[: rng.randint(10, len(valid) - 1)]  # truncated valid record
        else:
            value = valid  # a valid StartRun under a key that is not its run id
            key = f"g-{i}".encode()
        out.append((topic, key, value))
    return out


@pytest.mark.timeout(240)
def test_garbage_records_and_bad_commands(chaos_settings: ProcessorSettings, tmp_path: Path) -> None:
    s, rng = chaos_settings, random.Random(SEED)
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    good = [f"good-{i:03d}" for i in range(100)]
    cmd = Commands(s)
    raw = _Raw(s)
    bad: dict[str, str | None] = {}
    dups: list[tuple[str, dict[str, Any]]] = []
    try:
        for i, r in enumerate(good[:30]):
            cmd.start(r, "noop3", {"i": i})
        cmd.flush()
        wait_terminal(events, set(good[:30]), 90, fleet)  # finished runs, to cancel below
        sender = send_spread(cmd, good[30:], "noop3", seconds=3.0)
        for topic, key, value in garbage_records(rng, 1000, [s.topics.commands, s.topics.receipts]):
            raw.send(topic, key, value)
        big = "x" * 300_000
        kinds = ["nodef", "schema", "big", "secret", "signal", "cancel", "dup"]
        for i in range(200):
            kind = kinds[i % len(kinds)]
            j = i // len(kinds)  # 0..28
            if kind == "cancel":
                run, code, body = good[j], "Conflict", {"type": "CancelRun", "reason": "chaos"}
            elif kind == "dup":
                run, code = good[50 + j], "Conflict"
                body = {"type": "StartRun", "definition_id": "noop3", "revision": None, "input": {"other": j}}
            elif kind == "signal":
                run, code, body = (
                    f"bad-signal-{j}",
                    "NotFound",
                    {"type": "SignalRun", "signal": "go", "payload": {}},
                )
            else:
                run = f"bad-{kind}-{j}"
                definition, code, input_ = {
                    "nodef": ("no-such-definition", "NotFound", {}),
                    "schema": ("strict", "InvalidInput", {"n": "not an integer"}),
                    "big": ("noop3", "Limit", {"blob": big}),
                    "secret": ("noop3", "InvalidInput", {"api_key": "sk-live-0123456789abcdef"}),
                }[kind]
                body = {"type": "StartRun", "definition_id": definition, "revision": None, "input": input_}
            bad[run] = code
            if kind == "dup":
                dups.append((run, body))  # sent after the run's own start (below)
                continue
            cmd.send("commands", run, body)
        raw.flush()
        sender.join(30)
        for run, body in dups:
            cmd.send("commands", run, body)
        cmd.flush()
        wait_terminal(events, set(good), 120, fleet)
        events.wait_for(
            lambda recs: len({e["run_id"] for e in recs if e["type"] == "RunRejected"}) >= len(bad),
            90,
            "every bad command rejected",
        )
    finally:
        codes = fleet.stop()
        events.close()
    assert codes["p1"] == 0, fleet.tails()
    assert len(bad) == 200 and len(raw.coords) == 1000
    proof = prove(
        "1,000 garbage records + 200 bad commands", s, started=set(good), garbage=raw.coords, bad=bad
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(good)}
    assert b"sk-live-0123456789abcdef" not in orjson.dumps(events.records), (
        "a secret from a rejected input reached the run events"
    )


@pytest.mark.timeout(240)
def test_zombie_processor_with_the_same_instance_id_is_fenced(
    chaos_settings: ProcessorSettings, tmp_path: Path
) -> None:
    s = chaos_settings
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    runs = [f"z-{i:03d}" for i in range(200)]
    try:
        sender = send_spread(Commands(s), runs, "noop3", seconds=6.0)
        time.sleep(2.0)
        zombie = fleet.procs["p1"]
        fleet.processor("p1-twin", instance_id="p1")  # same transactional id, its own store dir
        zombie_code = zombie.wait(60)
        sender.join(30)
        wait_terminal(events, set(runs), 150, fleet)
    finally:
        codes = fleet.stop()
        events.close()
    assert zombie_code == 3, f"the zombie exited with {zombie_code}, not 3 (fenced): {fleet.tails()}"
    assert "fenced" in fleet.log("p1").read_text()
    assert codes["p1-twin"] == 0
    proof = prove(
        "zombie processor (same instance id) fenced under 200 runs",
        s,
        started=set(runs),
        extra={"zombie_exit_code": zombie_code},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}


@pytest.mark.timeout(360)
def test_broker_restart_in_the_middle_of_the_load(
    chaos_settings: ProcessorSettings, tmp_path: Path, chaos_broker: local_kafka.LocalKafkaConfig
) -> None:
    s = chaos_settings
    assert chaos_broker.port != local_kafka.DEFAULT_PORT and s.bootstrap_servers == chaos_broker.bootstrap
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    runs = [f"b-{i:03d}" for i in range(300)]
    cmd = Commands(s)
    try:
        for i, r in enumerate(runs[:150]):
            cmd.start(r, "noop3", {"i": i})
        cmd.flush()
        time.sleep(1.0)  # the restart lands while these are in flight
        local_kafka.down(chaos_broker)
        time.sleep(2.0)
        local_kafka.up(chaos_broker, timeout=180)
        for i, r in enumerate(runs[150:], 150):  # more load once the broker is back
            cmd.start(r, "noop3", {"i": i})
        cmd.flush()
        events = Reader(s, [s.topics.run_events], "run_events")
        try:
            wait_terminal(events, set(runs), 240, fleet, supervise=True)
        finally:
            events.close()
    finally:
        codes = fleet.stop()
    exits = list(fleet.exits)
    assert all(c == 0 for c in codes.values()), (codes, fleet.tails())
    # the producers that saw the cluster unreachable were replaced before their next transaction,
    # unless the process had to be restarted first (a call in flight when the broker stopped)
    replaced = fleet.log("p1").read_text(errors="replace").count("saw the whole cluster unreachable")
    proof = prove(
        "broker restart under 300 runs",
        s,
        started=set(runs),
        extra={
            "self_exits_restarted": exits,
            "producers_replaced": replaced,
            "commands_resent": cmd.resent,
            "id": uuid.uuid4().hex[:6],
        },
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}
    assert replaced >= 1 or exits, fleet.tails()


@pytest.mark.timeout(360)
def test_the_whole_cluster_lost_for_40_s_under_load_is_waited_out(
    chaos_settings: ProcessorSettings, tmp_path: Path, chaos_broker: local_kafka.LocalKafkaConfig
) -> None:
    """The only broker killed (SIGKILL: no controlled shutdown) while runs are in flight and
    commands keep coming, back 40 s later: longer than every transactional call's timeout (30 s),
    so a producer replaced meanwhile waits for the cluster instead of exiting 1 (it did), and
    nobody restarts anything: no process ends by itself, every run succeeds once."""
    s = chaos_settings
    assert chaos_broker.port != local_kafka.DEFAULT_PORT and s.bootstrap_servers == chaos_broker.bootstrap
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    runs = [f"o-{i:03d}" for i in range(200)]
    cmd = Commands(s)
    try:
        sender = send_spread(cmd, runs, "noop3", 20.0)
        time.sleep(5.0)  # runs in flight
        local_kafka.down(chaos_broker, grace=0)  # SIGKILL right after SIGTERM: a lost host
        lost = time.monotonic()
        while time.monotonic() - lost < 40.0:
            fleet.supervise()  # records (does not hide) any process that ends by itself
            time.sleep(0.5)
        local_kafka.up(chaos_broker, timeout=180)
        sender.join(120)
        events = Reader(s, [s.topics.run_events], "run_events")
        try:
            wait_terminal(events, set(runs), 240, fleet)
        finally:
            events.close()
    finally:
        codes = fleet.stop()
    assert fleet.exits == [], (fleet.exits, fleet.tails())
    assert all(c == 0 for c in codes.values()), (codes, fleet.tails())
    waited = fleet.log("p1").read_text(errors="replace").count("waits for the cluster")
    proof = prove(
        "whole cluster lost 40 s (kill -9) under 200 runs",
        s,
        started=set(runs),
        extra={"producer_waits_logged": waited, "commands_resent": cmd.resent, "id": uuid.uuid4().hex[:6]},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}
