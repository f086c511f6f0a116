"""kill -9 of a processor subprocess under load, restart, then check with read_committed
readers: exactly one terminal event per run, gap-free sequences, no dispatch twice."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from processor_support import (
    Commands,
    Reader,
    Responder,
    complete_all,
    make_settings,
    setup_topology,
    spawn_processor,
)

from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(170)]
RUNS = 200


def _wait_ready(log: Path, spawned: int, timeout: float = 60) -> None:
    """Until every spawned process so far has logged both partitions ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count('"partition ready"') >= 2 * spawned:
            return
        time.sleep(0.1)
    raise AssertionError(f"processor #{spawned} not ready: {log.read_text()[-2000:]}")


def _terminal_runs(events: list[dict]) -> set[str]:
    return {e["run_id"] for e in events if e["type"] in ("RunSucceeded", "RunFailed", "RunCancelled")}


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s)
    return s


def test_kill_9_under_load_then_restart_gives_exactly_once_outcomes(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    log = tmp_path / "processor.log"
    events = Reader(settings, [settings.topics.run_events], "run_events")
    acts = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    runs = [f"k-{i:03d}" for i in range(RUNS)]
    proc = spawn_processor(settings, log)
    spawned = 1
    kills = 0
    try:
        with Responder(settings, complete_all):
            for i, r in enumerate(runs):
                cmd.start(r, "three", {"i": i})
                if i % 20 == 19:
                    cmd.flush()
                    time.sleep(0.05)
            cmd.flush()
            for threshold in (RUNS // 5, RUNS // 2):
                _wait_ready(log, spawned)
                events.wait_for(
                    lambda evs, n=threshold: len(_terminal_runs(evs)) >= n,
                    timeout=60,
                    what=f"{threshold} terminal runs before kill -9",
                )
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                kills += 1
                proc = spawn_processor(settings, log)
                spawned += 1
            events.wait_for(
                lambda evs: len(_terminal_runs(evs)) >= RUNS,
                timeout=90,
                what="every run terminal after restarts",
            )
        _wait_ready(log, spawned)
        events.drain()
        acts.drain()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        events.close()
        acts.close()
    assert kills == 2
    assert code == 0, f"restarted processor did not stop cleanly: {log.read_text()[-3000:]}"
    terminal = Counter(
        e["run_id"] for e in events.records if e["type"] in ("RunSucceeded", "RunFailed", "RunCancelled")
    )
    assert set(terminal) == set(runs)
    assert all(n == 1 for n in terminal.values()), {r: n for r, n in terminal.items() if n != 1}
    assert {
        e["type"]
        for e in events.records
        if e["type"].startswith("Run")
        and e["run_id"] in terminal
        and e["type"] in ("RunFailed", "RunCancelled")
    } == set()
    by_run: dict[str, list[int]] = {}
    for e in events.records:
        by_run.setdefault(e["run_id"], []).append(e["sequence"])
    for r, seqs in by_run.items():
        assert seqs == list(range(1, len(seqs) + 1)), f"{r}: sequence {seqs}"
    scheduled = Counter(e["dispatch_id"] for e in events.records if e["type"] == "StepScheduled")
    short = {
        r: [e["type"] for e in events.records if e["run_id"] == r]
        for r in runs
        if sum(1 for e in events.records if e["run_id"] == r and e["type"] == "StepScheduled") != 3
    }
    assert not short, f"{len(short)} runs without 3 steps, e.g. {list(short.items())[:2]}"
    assert all(n == 1 for n in scheduled.values()) and len(scheduled) == 3 * RUNS
    dispatched = Counter(a["dispatch_id"] for a in acts.records if a["type"] == "ActionActivation")
    assert all(n == 1 for n in dispatched.values()) and len(dispatched) == 3 * RUNS
