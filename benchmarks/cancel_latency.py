"""What the stopping phase adds to a cancel (issue 27): CancelRun to RunCancelled, p50/p99.

A real broker, one processor process and one worker process (the workflow_throughput rig).
Each run is one action (the built-in `sleep`, cancellable) that is running when its CancelRun
is sent. A read_committed reader times, per run, from the moment the CancelRun was sent to the
moment it sees RunCancelling (the decision on the cancel itself: where RunCancelled was before
the stopping phase) and RunCancelled (after the worker joined its handler and its
ActivationCancelled came back). Measures, never asserts.

    .venv/bin/python -m benchmarks.cancel_latency [--runs 60] [--gap-ms 50]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from benchmarks.harness import percentile
from benchmarks.workflow_throughput import CommittedEvents, Rig
from processors.client import RunClient
from topology.settings import KafkaSettings

DEFINITION = {
    "schema": "runfold.workflow/v1",
    "id": "cancel-latency",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "nodes": {
        "a": {
            "kind": "action",
            "action": "sleep",
            "input": {"from": "literal", "value": {"ms": 600_000}},
            "heartbeat_ms": 1000,
            "lease_ms": 10_000,
        }
    },
}


class Seen:
    """When each run's StepStarted, RunCancelling and RunCancelled were read (wall time)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.events = CommittedEvents(settings, "cancel-watch")
        self.at: dict[tuple[str, str], float] = {}

    def poll(self, timeout: float = 0.05) -> None:
        now, events = self.events.poll(timeout)
        for event in events:
            self.at.setdefault((event["run_id"], event["type"]), now)

    def until(self, runs: list[str], etype: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all((run, etype) in self.at for run in runs):
            if time.monotonic() > deadline:
                done = sum((run, etype) in self.at for run in runs)
                raise TimeoutError(f"{done}/{len(runs)} runs have {etype} after {timeout:.0f} s")
            self.poll()


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(percentile(ordered, 0.5), 1),
        "p99_ms": round(percentile(ordered, 0.99), 1),
        "max_ms": round(ordered[-1], 1),
    }


def measure(runs: int, gap_ms: int) -> dict[str, Any]:
    prefix = f"cl{uuid.uuid4().hex[:6]}"
    rig = Rig(prefix, partitions=2, worker_concurrency=max(64, runs))
    with rig, RunClient(rig.settings) as client:
        client.register(DEFINITION)
        time.sleep(3)  # the processor's definitions reader takes it in (a start before: NotFound)
        seen = Seen(rig.settings)
        ids = [f"{prefix}-{i}" for i in range(runs)]
        for run in ids:
            client.start("cancel-latency", run_id=run, answer_timeout=0)
        seen.until(ids, "StepStarted", 120)
        sent: dict[str, float] = {}
        for run in ids:
            sent[run] = time.time()
            client.cancel(run, "measure", answer_timeout=0)
            end = time.monotonic() + gap_ms / 1000
            while time.monotonic() < end:
                seen.poll(0.005)
        seen.until(ids, "RunCancelled", 120)
        seen.events.close()
    to_cancelling = [(seen.at[(r, "RunCancelling")] - sent[r]) * 1000 for r in ids]
    to_cancelled = [(seen.at[(r, "RunCancelled")] - sent[r]) * 1000 for r in ids]
    added = [(seen.at[(r, "RunCancelled")] - seen.at[(r, "RunCancelling")]) * 1000 for r in ids]
    return {
        "bench": "cancel_latency",
        "runs": runs,
        "gap_ms": gap_ms,
        "cancel_to_run_cancelled": _stats(to_cancelled),
        "cancel_to_run_cancelling": _stats(to_cancelling),
        "added_by_stopping": _stats(added),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--gap-ms", type=int, default=50, help="pause between two cancels")
    args = parser.parse_args()
    print(json.dumps(measure(args.runs, args.gap_ms)))


if __name__ == "__main__":
    main()
