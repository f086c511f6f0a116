"""When the processor reads the definitions topic up to now before deciding a StartRun that
names a definition its catalog lacks (loop.py `_definition_missing`): only for a command
newer than the last complete read, at most once per 10 ms (a flood of starts of unknown
definitions costs a watermark query per 10 ms, not one per command)."""

from __future__ import annotations

import time

from processors.runtime.loop import Processor
from processors.runtime.settings import ProcessorSettings
from processors.runtime.txn import now_ms


class _Reader:
    def __init__(self, reaches_end: bool = True) -> None:
        self.reads = 0
        self.reaches_end = reaches_end

    def read_to_now(self, timeout_s: float) -> bool:
        self.reads += 1
        return self.reaches_end


def _processor(reader: _Reader) -> Processor:
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1"))
    proc._definitions = reader  # type: ignore[assignment]
    return proc


def test_a_command_newer_than_the_last_read_reads_once_and_older_ones_do_not() -> None:
    reader = _Reader()
    proc = _processor(reader)
    proc._definition_missing(now_ms())
    assert reader.reads == 1
    proc._definitions_read_at = -1e9  # the 10 ms spacing is not what stops the next ones
    proc._definition_missing(now_ms() - 1_000)  # produced before that read began: known missing
    assert reader.reads == 1
    time.sleep(0.002)
    proc._definition_missing(now_ms() + 5)  # produced after it: it may have been registered since
    assert reader.reads == 2


def test_a_flood_reads_at_most_once_per_10_ms() -> None:
    reader = _Reader()
    proc = _processor(reader)
    t0 = time.monotonic()
    for _ in range(1_000):
        proc._definition_missing(-1)  # no timestamp: always a candidate
    spent = time.monotonic() - t0
    assert 1 <= reader.reads <= 1 + spent / 0.01  # one, or one per 10 ms on a slow host
    time.sleep(0.011)
    proc._definition_missing(-1)
    assert reader.reads == 2


def test_a_read_that_did_not_reach_the_end_proves_nothing() -> None:
    reader = _Reader(reaches_end=False)
    proc = _processor(reader)
    ts = now_ms()
    proc._definition_missing(ts)
    proc._definitions_read_at = -1e9
    proc._definition_missing(ts)  # still newer than any complete read: read again
    assert reader.reads == 2
