"""runfold's driver for `runfold bench peers`: the client side of the no-op workflows.

The processor and the `noop` worker run as their own processes (benchmarks.workflow_throughput's
`Rig`); this process is the client: it produces StartRun commands (`noop-3`, `noop-1`) and reads
`<prefix>.run-events` read_committed, a run being complete when its terminal event arrives (the
run id carries nothing but a counter: completion is matched by key). Same ops and marks as the
other peers (benchmarks/peers/_drive.py), environment as the rig's processes
(KAFKA_BOOTSTRAP_SERVERS, RUNFOLD_TOPIC_PREFIX).

    python -m benchmarks.peers.runfold_workflow
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Producer

from benchmarks.peers import _drive
from benchmarks.workflow_throughput import CODEC, EventWatch
from topology.settings import KafkaSettings, producer_config


class Driver:
    def __init__(self) -> None:
        self.settings = KafkaSettings()
        self.producer = Producer(producer_config(self.settings, linger_ms=0))
        self.enc = CODEC.encoder("commands")
        self.topic = f"{self.settings.topic_prefix}.commands"
        self.watch = EventWatch(self.settings, offset_reset="latest")
        self.watch.wait_assigned()
        self.tag = uuid.uuid4().hex[:6]
        self.n = 0
        self.sent: dict[str, float] = {}  # run id -> planned start (monotonic)
        # the first StartRun of a new producer waits for its producer id: not the workflow's time
        self._start(1, time.monotonic())
        while self.sent:
            self._poll(0.1, [])

    def _start(self, steps: int, planned: float) -> None:
        self.n += 1
        rid = f"{self.tag}-{self.n}"
        value = self.enc(
            {
                "type": "StartRun",
                "run_id": rid,
                "ts_ms": time.time_ns() // 1_000_000,
                "record_id": uuid.uuid4().hex,
                "definition_id": f"noop-{steps}",
                "revision": None,
                "input": {},
            }
        )
        self.sent[rid] = planned
        while True:
            try:
                self.producer.produce(self.topic, value, rid.encode())
                break
            except BufferError:
                self.producer.poll(0.01)
        self.producer.poll(0)

    def _poll(self, timeout: float, out: list[tuple[float, float]]) -> None:
        """Completions as (seen at, planned start), monotonic."""
        self.watch.poll(timeout)
        if self.watch.terminal:
            now = time.monotonic()
            for rid in self.watch.terminal:
                planned = self.sent.pop(rid, None)
                if planned is not None:
                    out.append((now, planned))
            self.watch.terminal.clear()

    def throughput(self, concurrency: int, seconds: float, warmup_s: float, steps: int) -> dict[str, Any]:
        done: list[tuple[float, float]] = []
        t_warm = time.monotonic()
        t0 = t1 = float("inf")
        while True:
            now = time.monotonic()
            # the window opens after warmup_s and a full cycle (as _drive.warm_until)
            if t0 == float("inf") and (
                now - t_warm >= warmup_s and (len(done) >= concurrency or now - t_warm >= warmup_s + 30)
            ):
                _drive.mark("start")
                t0, t1 = now, now + seconds
            if now >= t1:
                break
            while len(self.sent) < concurrency:
                self._start(steps, now)
            self._poll(0.005, done)
        _drive.mark("end")
        drain = time.monotonic() + 60
        while self.sent and time.monotonic() < drain:
            self._poll(0.05, [])
        n = sum(1 for seen, _ in done if t0 <= seen < t1)
        return {"concurrency": concurrency, "completed": n, "workflows_per_s": round(n / seconds, 2)}

    def latency(self, rate: float, seconds: float, steps: int) -> dict[str, Any]:
        n = max(1, int(rate * seconds))
        done: list[tuple[float, float]] = []
        t0 = time.monotonic() + 0.05
        _drive.mark("start")
        i = 0
        while i < n:
            now = time.monotonic()
            while i < n and now >= t0 + i / rate:
                self._start(steps, t0 + i / rate)
                i += 1
            # block only until the next start is due (the reader takes what is buffered)
            self._poll(max(0.0, min(0.005, t0 + i / rate - time.monotonic())), done)
        _drive.mark("end")
        drain = time.monotonic() + 60
        while self.sent and time.monotonic() < drain:
            self._poll(0.005, done)
        return _drive.latency_summary([(seen - planned) * 1000 for seen, planned in done], n, seconds)

    def handle(self, op: dict[str, Any]) -> dict[str, Any]:
        if op["op"] == "throughput":
            return self.throughput(
                op["concurrency"], op["seconds"], op.get("warmup_s", 1.0), op.get("steps", 3)
            )
        if op["op"] == "latency":
            return self.latency(op["rate"], op["seconds"], op.get("steps", 1))
        raise ValueError(f"unknown op {op['op']!r}")


def main() -> None:
    driver = Driver()
    try:
        _drive.serve(driver.handle)
    finally:
        driver.producer.flush(10)
        driver.watch.close()


if __name__ == "__main__":
    main()
