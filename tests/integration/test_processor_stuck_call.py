"""A transactional call that never returns is left behind, not waited for (real broker).

librdkafka's `send_offsets_to_transaction` was seen blocked for good after broker restarts
(librdkafka#5456, #5511). The producer given here is the real one, except that its first
`send_offsets_to_transaction` blocks until the test ends: the processor must abandon it, go
on with a new producer (whose init_transactions aborts the stuck transaction at the
coordinator), and still give every run exactly one outcome.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from processor_support import (
    Commands,
    ProcessorThread,
    Reader,
    Responder,
    complete_all,
    make_settings,
    setup_topology,
)

from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _FirstSendOffsetsNeverReturns:
    def __init__(self, real: Any, release: threading.Event) -> None:
        self._real = real
        self._release = release
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            self._release.wait()  # "never": until the test is over
            return None
        return self._real.send_offsets_to_transaction(*args)


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    # a short transaction timeout: the call is given up after it + 5 s
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", transaction_timeout_ms=2_000)
    setup_topology(s)
    return s


def test_a_send_offsets_that_never_returns_is_abandoned_and_every_run_ends_once(
    settings: ProcessorSettings,
) -> None:
    release = threading.Event()
    pt = ProcessorThread(settings)
    new_producer = pt.processor.producers.new
    stuck: list[_FirstSendOffsetsNeverReturns] = []

    def first_one_sticks(slot: int, stop: threading.Event | None = None) -> Any:
        producer = new_producer(slot, stop)
        if stuck:
            return producer
        stuck.append(_FirstSendOffsetsNeverReturns(producer, release))
        return stuck[0]

    pt.processor.producers.new = first_one_sticks  # type: ignore[method-assign]
    events = Reader(settings, [settings.topics.run_events], "run_events")
    activations = Reader(settings, [settings.topics.activations("default")], "activations")
    cmd = Commands(settings)
    runs = [f"stuck-{i}" for i in range(10)]
    try:
        pt.start()
        pt.wait_owned(2)
        with Responder(settings, complete_all):
            for r in runs:
                cmd.start(r, "three")
            cmd.flush()
            events.wait_for(
                lambda evs: all(
                    any(e["type"] == "RunSucceeded" and e["run_id"] == r for e in evs) for r in runs
                ),
                timeout=60,
                what="every run succeeded",
            )
        assert pt.stop() == 0
    finally:
        release.set()
    p = pt.processor
    assert stuck[0].calls == 1 and [a for a, _ in p.producers._abandoned] == [stuck[0]]
    assert p.metrics.producers_replaced.labels("call_abandoned")._value.get() == 1
    # exactly once, as a read_committed reader sees it: the abandoned transaction was aborted
    assert Counter(e["type"] for e in events.records if e["type"].startswith("Run")) == {
        "RunAccepted": len(runs),
        "RunStarted": len(runs),
        "RunSucceeded": len(runs),
    }
    for r in runs:
        seqs = [e["sequence"] for e in events.of(r)]
        assert seqs == list(range(1, len(seqs) + 1)), (r, seqs)
    activations.drain()
    dispatched = Counter(a["dispatch_id"] for a in activations.records if a["type"] == "ActionActivation")
    assert len(dispatched) == 3 * len(runs) and set(dispatched.values()) == {1}
    events.close()
    activations.close()
