"""Stalls, not crashes: a processor frozen past its session timeout, a broker frozen long
enough to fence itself (KRaft broker lease) and to time out every client's group session.

After each stall the processor must carry on by itself (no supervisor restart): runs started
after the stall complete, runs in flight complete, and the usual proof holds.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from checks import prove
from confluent_kafka import Consumer, TopicPartition
from fleet import Fleet
from processor_support import Commands, Reader
from test_chaos import wait_terminal

from processors.runtime.settings import ProcessorSettings
from topology import local_kafka
from topology.settings import consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
SESSION_S = 20.0  # ProcessorSettings.session_timeout_ms default: what Fleet's processors run with


def _wait_all(events: Reader, runs: set[str], timeout: float, fleet: Fleet) -> None:
    try:
        wait_terminal(events, runs, timeout, fleet)
    except AssertionError as e:
        seen = Counter(r["type"] for r in events.records)
        raise AssertionError(
            f"run events so far {dict(seen)}; offsets {_offsets(fleet.settings)}; {e}"
        ) from None


def _offsets(s: ProcessorSettings) -> dict[str, object]:
    """Where the input stands (log end, committed end, the processor group's offsets): a stall's shape."""
    out: dict[str, object] = {}
    c = Consumer(consumer_config(s, s.group, client_id="stall-diagnosis"))
    u = Consumer(consumer_config(s, s.group, read_committed=False))
    try:
        t = s.topics
        for topic in (t.commands, t.receipts, t.run_events, t.activations("default")):
            for p in range(s.partitions):
                tp = TopicPartition(topic, p)
                committed = (
                    c.committed([tp], timeout=10)[0].offset if topic in (t.commands, t.receipts) else None
                )
                out[f"{topic.split('.', 1)[1]}[{p}]"] = (
                    u.get_watermark_offsets(tp, timeout=10)[1],
                    c.get_watermark_offsets(tp, timeout=10)[1],
                    committed,
                )
    except Exception as e:
        out["error"] = str(e)
    finally:
        c.close()
        u.close()
    return out


def _start(cmd: Commands, runs: list[str]) -> None:
    for i, r in enumerate(runs):
        cmd.start(r, "noop3", {"i": i})
    cmd.flush()


@pytest.mark.timeout(300)
def test_processor_frozen_past_its_session_timeout_carries_on(
    chaos_settings: ProcessorSettings, tmp_path: Path
) -> None:
    s = chaos_settings
    fleet = Fleet(s, tmp_path)
    proc = fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    before, during, after = (
        [f"{k}-{i:03d}" for i in range(n)] for k, n in (("f0", 40), ("f1", 40), ("f2", 40))
    )
    cmd = Commands(s)
    try:
        _start(cmd, before)
        wait_terminal(events, set(before), 60, fleet)
        _start(cmd, during[:20])
        time.sleep(0.05)  # freeze it with work in flight (often inside a transaction)
        proc.send_signal(signal.SIGSTOP)
        try:
            _start(cmd, during[20:])  # these queue while it is frozen
            time.sleep(SESSION_S + 5.0)  # the broker expires its session and its generation
        finally:
            proc.send_signal(signal.SIGCONT)
        _start(cmd, after)
        _wait_all(events, set(before + during + after), 120, fleet)
        assert proc.poll() is None, f"the processor exited ({proc.returncode}) instead of carrying on"
    finally:
        codes = fleet.stop()
        events.close()
    assert codes["p1"] == 0, fleet.tails()
    runs = set(before + during + after)
    proof = prove(
        f"processor frozen (SIGSTOP) {SESSION_S + 5.0:g} s, past its {SESSION_S:g} s session timeout",
        s,
        started=runs,
        extra={"frozen_s": SESSION_S + 5.0},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}


@pytest.mark.timeout(300)
def test_broker_frozen_until_it_fences_itself(
    chaos_settings: ProcessorSettings, tmp_path: Path, chaos_broker: local_kafka.LocalKafkaConfig
) -> None:
    s = chaos_settings
    assert chaos_broker.port != local_kafka.DEFAULT_PORT and s.bootstrap_servers == chaos_broker.bootstrap
    pid = local_kafka.get_status(chaos_broker).pid
    assert pid is not None
    fleet = Fleet(s, tmp_path)
    proc = fleet.processor("p1")
    fleet.worker("w1")
    fleet.ready()
    events = Reader(s, [s.topics.run_events], "run_events")
    before, after = [f"g0-{i:03d}" for i in range(60)], [f"g1-{i:03d}" for i in range(40)]
    cmd = Commands(s)
    try:
        _start(cmd, before)
        time.sleep(0.3)  # the freeze lands while these are in flight
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(SESSION_S + 3.0)  # > broker.session.timeout.ms (9 s) and the group session
        finally:
            os.killpg(pid, signal.SIGCONT)
        _start(cmd, after)
        _wait_all(events, set(before + after), 120, fleet)
        assert proc.poll() is None, f"the processor exited ({proc.returncode}) instead of carrying on"
    finally:
        codes = fleet.stop()
        events.close()
    assert codes["p1"] == 0, fleet.tails()
    runs = set(before + after)
    proof = prove(
        f"broker frozen (SIGSTOP) {SESSION_S + 3.0:g} s: fences itself, group sessions time out",
        s,
        started=runs,
        extra={"commands_resent": cmd.resent},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(runs)}
