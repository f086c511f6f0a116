"""Adversarial review of the run processor's runtime against docs/runtime.md: each test quotes the
promise it checks. A real broker (KAFKA_BOOTSTRAP_SERVERS), a topic prefix per test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processor_support import (
    Commands,
    Reader,
    Responder,
    complete_all,
    make_settings,
    running,
    settled_value,
    setup_topology,
    spawn_processor,
    terminal_of,
)

from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    # kafka_settings is requested for its cleanup: it deletes the prefix's topics afterwards.
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s)
    return s


def test_a_start_with_a_run_id_longer_than_the_store_keys_hold_is_charged_not_a_crash(
    settings: ProcessorSettings,
) -> None:
    """docs/runtime.md, "The transaction loop": "Bad input never stops the loop and is never
    skipped silently"; "What is charged to a record": "a value the encoders or the serializer
    refuse ... `unserializable` | command → `RunRejected` `Limit`", and "What stops the processor
    is only what no record caused, and a restart does not repeat it for a record".

    A StartRun whose run id is 70,000 bytes (no rule of docs/contract.md refuses it; the store's
    event keys hold a 2-byte length) must be charged to itself while the partition goes on."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    cmd = Commands(settings)
    long_id = "L" * 70_000
    with running(settings) as pt, Responder(settings, complete_all):
        cmd.start(long_id, "one")
        cmd.start("after-long", "one")
        cmd.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not terminal_of(events.records, "after-long"):
            events.poll()
            assert pt.exit_code is None and pt.thread.is_alive(), (
                f"the processor stopped (exit {pt.exit_code}) on one command's long run id"
            )
        assert terminal_of(events.records, "after-long"), "the partition did not go on"
        rejected = events.of(long_id, "RunRejected")
        assert [e["code"] for e in rejected] == ["Limit"], [e["type"] for e in events.of(long_id)]
        dead.wait_for(lambda d: any(x["key"] == long_id.encode() for x in d), what="its dead letter")
        assert settled_value(pt.processor.metrics.dead_letters.labels("unserializable"), 1) == 1
        assert pt.thread.is_alive()
    events.close()
    dead.close()


def test_a_restore_chunk_the_client_cannot_take_is_refused_as_a_setting_exit_2(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/runtime.md, "Exit codes": `2` "configuration: it cannot start as configured ...
    settings refused (named field by field with the value refused)"; `1` is "an error no retry
    in-process mends" whose supervisor restarts it. `restore_chunk` ("Settings": "bounds per
    iteration") is accepted above what the restore reader's `consume` takes (1,000,000), so the
    processor crashes at its first restore (exit 1, and again at every restart)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    env["RUNFOLD_RESTORE_CHUNK"] = "2000000"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "processors.runtime",
            "--bootstrap-servers",
            settings.bootstrap_servers,
            "--topic-prefix",
            settings.topic_prefix,
            "--instance-id",
            "chunky",
            "--state-dir",
            str(tmp_path / "chunky"),
        ],
        env=env,
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 2, f"exit {proc.returncode}; stderr tail: {err[-1500:]}"
    assert "restore_chunk" in err and "2000000" in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 3, err


def test_a_sleep_armed_before_a_kill_9_fires_once_after_the_restart(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/runtime.md, "Timers": sleeps are timers in the store; "Firing is at-least-once ...
    the engine drops a second `TimerFired` for the same timer"; "State store and restore": a
    restarted instance restores and resumes. A run asleep when its processor is `kill -9`ed wakes
    after the restart, and its run events are each written once (gap-free sequences, one
    terminal event)."""
    log = tmp_path / "proc.log"
    events = Reader(settings, [settings.topics.run_events], "run_events")
    cmd = Commands(settings)
    ids = [f"sleepy-{i}" for i in range(4)]
    with Responder(settings, complete_all):
        proc = spawn_processor(settings, log)
        try:
            for rid in ids:
                cmd.start(rid, "sleepy")
            cmd.flush()
            events.wait_for(
                lambda evs: all(
                    any(e["type"] == "StepSucceeded" and e["node"] == "a" for e in events.of(r)) for r in ids
                ),
                what="every run asleep",
            )
        finally:
            proc.kill()
            proc.wait(10)
        time.sleep(0.6)  # the 400 ms sleeps come due while no processor runs
        proc = spawn_processor(settings, log)
        try:
            events.wait_for(lambda evs: all(terminal_of(evs, r) for r in ids), timeout=45, what="all woke")
            events.drain(1.0)
        finally:
            proc.terminate()
            assert proc.wait(30) == 0, log.read_text()[-2000:]
    for rid in ids:
        mine = events.of(rid)
        assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1)), [e["type"] for e in mine]
        assert [e["type"] for e in terminal_of(mine, rid)] == ["RunSucceeded"]
        assert [e["node"] for e in mine if e["type"] == "StepSucceeded"] == ["a", "s", "b"]
    events.close()


def test_garbage_as_large_as_the_client_sends_is_dead_lettered_and_the_partition_goes_on(
    settings: ProcessorSettings,
) -> None:
    """docs/runtime.md, "The transaction loop": "bytes the codec cannot decode ... → a
    `DeadLetter` (source topic, partition, offset, key, reason, original bytes ...)", and "Output
    too large": "If the broker refuses that transaction too, the dead letter is sent again without
    the original bytes ... Then processing continues". An undecodable record of ~990 KB (its dead
    letter, original bytes and all, is over the producer's 1,000,000-byte limit) must neither stop
    nor jam its partition."""
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    cmd = Commands(settings)
    with running(settings) as pt, Responder(settings, complete_all):
        cmd.raw(settings.topics.commands, b"big-garbage", b"\x00" + b"x" * 989_000)
        cmd.start("big-garbage", "one")  # the same key: the same partition, after it
        cmd.flush()
        events.wait_for(lambda evs: terminal_of(evs, "big-garbage"), timeout=45, what="the run after it")
        dead.wait_for(lambda d: any(x["key"] == b"big-garbage" for x in d), what="its dead letter")
        assert pt.exit_code is None and pt.thread.is_alive()
    mine = [d for d in dead.records if d["key"] == b"big-garbage"]
    assert len(mine) == 1, [(d["error"][:80], len(d["original"] or b"")) for d in mine]
    assert mine[0]["source_topic"] == settings.topics.commands
    events.close()
    dead.close()
