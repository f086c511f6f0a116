"""What the processor checks before it joins its group: a state directory it can write, a
cluster that answers, and a complete, co-partitioned topology. Each failure stops it with
ExitCode.CONFIG (2: it cannot start as configured) and a message that says what is wrong and
what to do, before any partition is assigned (a failure inside a rebalance callback would say
much less)."""

from __future__ import annotations

import os
import threading
import time

from confluent_kafka import Consumer, KafkaException

from processors.kafka.exits import ExitCode, ProcessorStopped, StopRequested, until_stopped
from processors.runtime.settings import ProcessorSettings
from topology.settings import cannot_reach

_TOPICS_APPEAR_S = 5.0  # how long topics just created elsewhere may take to show in the metadata


def check_state_dir(settings: ProcessorSettings) -> None:
    root = settings.store_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ProcessorStopped(
            ExitCode.CONFIG,
            (
                f"state directory {root} is not usable ({e.strerror or e}): set --state-dir or RUNFOLD_STATE_DIR "
                "to a writable directory"
            ),
        ) from e


def check_topology(
    consumer: Consumer, settings: ProcessorSettings, timeout_s: float, stop: threading.Event
) -> int:
    """Every topic the processor reads or writes exists; commands, receipts, run-events and
    run-state have one partition count (co-partitioned). Returns that count. A stop request
    while the cluster does not answer yet ends the wait (StopRequested)."""
    t = settings.topics
    names = [
        t.commands,
        t.receipts,
        t.run_events,
        t.run_state,
        t.dead_letters,
        t.definitions,
        t.child_activations,
        *(t.activations(q) for q in settings.activation_queues),
    ]
    appear_by = time.monotonic() + _TOPICS_APPEAR_S
    while True:
        try:
            meta = until_stopped(lambda t: consumer.list_topics(timeout=t), stop, timeout_s)
        except KafkaException as e:
            raise ProcessorStopped(
                ExitCode.CONFIG,
                cannot_reach(settings.bootstrap_servers, f"{e.args[0].str()}, after {timeout_s:g} s"),
            ) from e
        missing = [n for n in names if n not in meta.topics or meta.topics[n].error is not None]
        if not missing or time.monotonic() >= appear_by:
            break
        # Created a moment ago by another tool: not yet in this broker's metadata, or no leader
        # yet (`runfold topology create` waits for its topics to be visible; others may not).
        if stop.wait(0.25):
            raise StopRequested
    if missing:
        raise ProcessorStopped(
            ExitCode.CONFIG,
            f"missing topics {missing}: run `runfold topology create` "
            f"with topic prefix {settings.topic_prefix!r}",
        )
    counts = {n: len(meta.topics[n].partitions) for n in (t.commands, t.receipts, t.run_events, t.run_state)}
    if len(set(counts.values())) != 1:
        raise ProcessorStopped(
            ExitCode.CONFIG,
            f"topics are not co-partitioned (partition counts {counts}); "
            "commands, receipts, run-events and run-state must match",
        )
    return counts[t.commands]
