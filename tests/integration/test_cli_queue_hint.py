"""`runs get` and `runs watch` of a run whose step is scheduled on a queue that no worker consumes
say so on stderr (issue 24), and so does the processor (a warning and the
`runfold_processor_queue_unconsumed` gauge); both stop once a consumer group member is
assigned the queue's topic."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from processor_support import Commands, Reader, make_settings, running, setup_topology

from processors.runtime.settings import ProcessorSettings
from topology.settings import consumer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
RUNFOLD = Path(sys.executable).parent / "runfold"
LONELY = {
    "schema": "runfold.workflow/v1",
    "id": "lonely",
    "revision": 1,
    "entry": ["a"],
    "nodes": {"a": {"kind": "action", "action": "echo", "queue": "lonely"}},
}


def _cli(settings: ProcessorSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
    }
    return subprocess.run([str(RUNFOLD), *args], env=env, capture_output=True, text=True, timeout=170)


def test_a_step_on_a_queue_without_consumers_is_pointed_out(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = make_settings(
        kafka_bootstrap, topic_prefix, tmp_path / "state", activation_queues=("default", "agents", "lonely")
    )
    setup_topology(settings, [LONELY])
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    with running(settings) as pt:
        commands.start("alone-1", "lonely", {})
        commands.flush()
        events.wait_for(lambda r: bool(events.of("alone-1", "StepScheduled")), 60, "StepScheduled")
        got = _cli(settings, "runs", "get", "alone-1")
        assert got.returncode == 0, got.stderr
        assert "scheduled" in got.stdout
        assert "queue 'lonely', which no worker consumes" in got.stderr, got.stderr
        assert "runfold worker --queue lonely" in got.stderr
        watched = _cli(settings, "runs", "watch", "alone-1", "--timeout", "1")
        assert "which no worker consumes" in watched.stderr, watched.stderr
        # the processor says so too: a gauge and one warning (its own look runs every 30 s)
        unconsumed = pt.processor.metrics.queue_unconsumed
        assert pt.processor.queue_watch.check() == {"lonely"}
        assert unconsumed.labels("lonely")._value.get() == 1
        assert unconsumed.labels("default")._value.get() == 0  # nothing dispatched there

        member = Consumer(consumer_config(settings, f"{topic_prefix}-someone"))
        member.subscribe([settings.topics.activations("lonely")])
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end and not member.assignment():
                member.poll(0.2)  # joins the group; the activation stays uncommitted
            assert member.assignment()
            served = _cli(settings, "runs", "get", "alone-1")
            assert served.returncode == 0
            assert "no worker consumes" not in served.stderr, served.stderr
            assert pt.processor.queue_watch.check() == set()
            assert unconsumed.labels("lonely")._value.get() == 0
        finally:
            member.close()
    events.close()
