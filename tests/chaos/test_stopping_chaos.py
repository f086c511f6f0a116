"""Issue 27 under chaos: no two attempts of a step run at once, and "cancelled" means stopped.

Real processor, real subprocess workers running `chaos.spans` (spans_actions.py), which
records every execution's start and end; the proof is read from those records and the
committed run events (stop_checks.py), then checks.prove (one terminal event per run, no
sequence gap, replay --verify clean).

- cancel storm: 80 runs of a mapped step (node timeouts, retries) and a second step on two
  workers; CancelRun at random moments while handlers run, during retry backoffs, twice, racing
  the completion, and at handlers that cannot stop within their worker's grace.
- a worker frozen (SIGSTOP) during a cancel: the run stays `cancelling` until the frozen
  attempt's lease expires (or its shorter stop_timeout passes), then RunCancelled says which;
  a timed-out attempt on the frozen worker is retried only once its lease expired; after
  SIGCONT the worker's late receipts change nothing.

Broker: quiet_broker_bootstrap (KAFKA_BOOTSTRAP_SERVERS when set, else the suite's own).
"""

from __future__ import annotations

import heapq
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stop_checks
from checks import TERMINAL, prove, read_all
from fleet import Fleet
from processor_support import Commands, Reader, make_settings, setup_topology

from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings
from topology.admin import delete_topology

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
WF = "runfold.workflow/v1"
SEED = int(time.time())
SPANS_MODULE = str(Path(__file__).with_name("spans_actions.py"))
CANCEL_GRACE_MS = 1000  # the workers' grace: a handler draining longer is reported stop_unconfirmed


def _node(**extra: Any) -> dict[str, Any]:
    return {"kind": "action", "action": "chaos.spans", "heartbeat_ms": 300, **extra}


STORM = {
    "schema": WF,
    "id": "storm",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "routes": {"a": ["b"]},
    "nodes": {
        "a": _node(
            map={"from": "input", "pointer": "/items"},
            input={"from": "item"},
            lease_ms=4000,
            timeout_ms=2000,
            retry={"max_attempts": 3, "backoff_ms": 400},
            on_failure="continue",
        ),
        "b": _node(
            input={"from": "literal", "value": {"ms": 250, "stop_ms": 50}},
            lease_ms=4000,
            timeout_ms=2000,
            retry={"max_attempts": 2, "backoff_ms": 200},
        ),
    },
}
# a frozen worker's attempt: the lease (3 s) is the first bound (stop_timeout defaults to it)
FROZEN_LEASE = {
    "schema": WF,
    "id": "frozen-lease",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "nodes": {"a": _node(input={"from": "input"}, lease_ms=3000)},
}
# ... a stop_timeout (1.5 s) shorter than the lease (8 s): the bound comes first
FROZEN_BOUND = {
    **FROZEN_LEASE,
    "id": "frozen-bound",
    "nodes": {"a": _node(input={"from": "input"}, lease_ms=8000, stop_timeout_ms=1500)},
}
# ... a node timeout (3 s: the freeze comes before it) on a frozen worker; the retry waits for
# the lease (6 s from the last heartbeat: after the node timeout, before its stop_timeout)
FROZEN_RETRY = {
    **FROZEN_LEASE,
    "id": "frozen-retry",
    "nodes": {
        "a": _node(
            input={"from": "input"},
            lease_ms=6000,
            timeout_ms=3000,
            retry={"max_attempts": 2, "backoff_ms": 100},
        )
    },
}


@pytest.fixture
def stop_settings(quiet_broker_bootstrap: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(
        quiet_broker_bootstrap,
        f"c{uuid.uuid4().hex[:8]}",
        tmp_path / "state",
        commit_interval_ms=50,
        activation_queues=("default", "agents"),  # what the subprocess processor checks for
    )
    setup_topology(s, [STORM, FROZEN_LEASE, FROZEN_BOUND, FROZEN_RETRY])
    yield s
    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {s.topic_prefix} failed: {e}")


def _fleet(s: ProcessorSettings, tmp_path: Path, workers: int) -> tuple[Fleet, Path]:
    spans = tmp_path / "spans"
    spans.mkdir()
    config = tmp_path / "worker.yaml"
    config.write_text(f"cancel_grace_ms: {CANCEL_GRACE_MS}\n")
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    for i in range(1, workers + 1):
        fleet.worker(
            f"w{i}",
            concurrency=16,
            modules=(SPANS_MODULE,),
            config=config,
            env={"CHAOS_SPANS_DIR": str(spans)},
        )
    try:
        fleet.ready()
        fleet.workers_ready(workers)
    except BaseException:
        fleet.stop()  # a fleet that did not start must not outlive the test
        raise
    return fleet, spans


def _terminal(events: Reader) -> set[str]:
    return {e["run_id"] for e in events.records if e["type"] in TERMINAL}


def _prove_stops(s: ProcessorSettings, spans: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The two rules, from the handlers' records and the committed events; returns the events
    and what was seen (for the scenario's summary)."""
    events = read_all(s, f"{s.topic_prefix}.run-events", "run_events")
    execs = stop_checks.executions(spans)
    settled = stop_checks.settlements(events)
    never_ended = [x for x in execs if x.end is None]
    assert not never_ended, f"handlers that never returned (their worker lived): {never_ended[:3]}"
    overlapping, overlaps_excused = stop_checks.overlaps(execs, settled)
    assert not overlapping, f"{len(overlapping)} overlapping attempts, e.g. {overlapping[:3]}"
    running, excused = stop_checks.running_at_terminal(execs, events, settled)
    assert not running, f"{len(running)} handlers still running at RunCancelled, e.g. {running[:3]}"
    seen = {
        "executions": len(execs),
        "stops": stop_checks.stop_counts(events),
        "outlived_run_cancelled_by_stop": dict(excused),
        "overlaps_after_stop": dict(overlaps_excused),
    }
    return events, seen


@pytest.mark.timeout(240)
def test_cancel_storm_while_handlers_run(stop_settings: ProcessorSettings, tmp_path: Path) -> None:
    s, rng = stop_settings, random.Random(SEED)
    fleet, spans = _fleet(s, tmp_path, workers=2)
    events = Reader(s, [s.topics.run_events], "run_events")
    cmd = Commands(s)
    runs = [f"storm-{i:03d}" for i in range(80)]
    t0 = time.monotonic() + 0.5
    starts: list[tuple[float, str, dict[str, Any]]] = []
    cancels: list[tuple[float, str]] = []  # a heap of (when, run)
    triggers: dict[str, tuple[str, float]] = {}  # run -> (the event that sends its cancel, delay)
    plans: Counter[str] = Counter()
    for i, run in enumerate(runs):
        at = t0 + 5.0 * i / len(runs)
        if i % 10 == 0:  # a handler that drains 1.5 s: longer than its worker's 1 s grace
            plan, items = "unstoppable", [{"ms": 1800, "stop_ms": 1500}]
            triggers[run] = ("a:StepStarted", 0.3)
        else:
            items = [_storm_item(rng) for _ in range(rng.randint(2, 3))]
            plan = rng.choices(["none", "timed", "twice", "backoff", "race"], [12, 40, 16, 16, 16])[0]
        plans[plan] += 1
        starts.append((at, run, {"items": items}))
        if plan in ("timed", "twice"):
            first = at + rng.uniform(0.2, 4.0)
            heapq.heappush(cancels, (first, run))
            if plan == "twice":
                heapq.heappush(cancels, (first + rng.uniform(0.0, 0.6), run))
        elif plan == "backoff":  # as soon as a retry waits (else at 6 s, whatever it does then)
            triggers[run] = ("StepRetryScheduled", 0.0)
            heapq.heappush(cancels, (at + 6.0, run))
        elif plan == "race":  # b runs 250 ms: the cancel and its completion cross
            triggers[run] = ("b:StepStarted", rng.uniform(0.15, 0.3))
    sent: Counter[str] = Counter()
    try:
        deadline = t0 + 120
        while not set(runs) <= _terminal(events):
            now = time.monotonic()
            assert now < deadline, f"runs not terminal: {sorted(set(runs) - _terminal(events))[:5]}"
            while starts and starts[0][0] <= now:
                _at, run, run_input = starts.pop(0)
                cmd.start(run, "storm", run_input)
            while cancels and cancels[0][0] <= now:
                _at, run = heapq.heappop(cancels)
                cmd.cancel(run, "storm")
                sent[run] += 1
            for e in events.poll(0.05):
                trigger = triggers.get(e["run_id"])
                if trigger is not None and trigger[0] in (e["type"], f"{e.get('node')}:{e['type']}"):
                    del triggers[e["run_id"]]
                    heapq.heappush(cancels, (time.monotonic() + trigger[1], e["run_id"]))
            cmd.producer.poll(0)
        cmd.flush()
        storm_s = round(time.monotonic() - t0, 1)
    finally:
        codes = fleet.stop()
        events.close()
    assert all(code == 0 for code in codes.values()), (codes, fleet.tails())
    all_events, seen = _prove_stops(s, spans)
    cancelled = {e["run_id"] for e in all_events if e["type"] == "RunCancelled"}
    in_backoff = sum(
        1
        for e in all_events
        if e["type"] == "StepCancelled" and e.get("stop") is None and e["run_id"] in cancelled
    )
    proof = prove(
        "cancel storm: 80 runs, 2 workers, cancels while handlers run",
        s,
        started=set(runs),
        extra={
            "seed": SEED,
            "plans": dict(plans),
            "cancels_sent": sum(sent.values()),
            "runs_cancelled_twice_or_more": sum(1 for n in sent.values() if n > 1),
            "steps_cancelled_holding_nothing": in_backoff,
            # cancels that lost the race to the run's end: answered, the run not reopened
            "cancels_after_the_end": sum(
                1 for e in all_events if e["type"] == "RunRejected" and e["code"] == "Conflict"
            ),
            "storm_s": storm_s,
            **seen,
        },
    )
    stops = seen["stops"]
    # the storm did what it is for: cancels landed on running handlers (confirmed), on handlers
    # that could not stop in time (stop_unconfirmed), and on retry backoffs; attempts retried
    assert stops.get("confirmed", 0) >= 10 and stops.get("stop_unconfirmed", 0) >= 1, stops
    assert in_backoff >= 1 and proof.retried_attempts >= 5, (in_backoff, proof.retried_attempts)
    assert proof.terminal_by_type.get("RunCancelled", 0) >= 40, proof.terminal_by_type


def _storm_item(rng: random.Random) -> dict[str, Any]:
    kind = rng.choices(["quick", "slow", "timeout", "flaky"], [30, 30, 15, 25])[0]
    if kind == "quick":
        return {"ms": rng.randint(100, 600), "stop_ms": rng.randint(0, 150)}
    if kind == "slow":  # within the 2 s node timeout
        return {"ms": rng.randint(900, 1700), "stop_ms": rng.randint(100, 400)}
    if kind == "timeout":  # attempt 1 times out and drains longer than the retry backoff (400 ms)
        return {"ms": 5000, "ms_retry": rng.randint(200, 600), "stop_ms": rng.randint(600, 900)}
    return {"ms": rng.randint(150, 400), "fail_until": rng.randint(1, 2), "stop_ms": 100}  # retried


def _one_per_partition(kind: str, partitions: int) -> list[str]:
    """Run ids of `kind`, one on each partition (activations are keyed by run id, so each lands
    on the worker holding that partition: one of them on the worker the test freezes)."""
    found: dict[int, str] = {}
    for k in range(1000):
        run = f"frz-{kind}-{k}"
        found.setdefault(partition_for(run, partitions), run)
        if len(found) == partitions:
            return [found[p] for p in range(partitions)]
    raise AssertionError("no run id for every partition")


def _lease_of(events: list[dict[str, Any]], run: str, attempt: int, before_seq: int) -> int:
    """The attempt's last lease (StepStarted / StepLeaseExtended) before event `before_seq`."""
    leases = [
        e["lease_expires_ms"]
        for e in events
        if e["run_id"] == run
        and e.get("attempt") == attempt
        and e["type"] in ("StepStarted", "StepLeaseExtended")
        and e["sequence"] < before_seq
    ]
    assert leases, f"{run} attempt {attempt} never started"
    return max(leases)


def _one(events: list[dict[str, Any]], run: str, etype: str, **match: Any) -> dict[str, Any]:
    found = [
        e
        for e in events
        if e["run_id"] == run and e["type"] == etype and all(e.get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (
        f"{run}: {len(found)} {etype} {match}: {[(e['type'], e.get('attempt')) for e in events if e['run_id'] == run]}"
    )
    return found[0]


@pytest.mark.timeout(240)
def test_a_worker_frozen_during_a_cancel(stop_settings: ProcessorSettings, tmp_path: Path) -> None:
    s = stop_settings
    fleet, spans = _fleet(s, tmp_path, workers=2)
    events = Reader(s, [s.topics.run_events], "run_events")
    receipts = Reader(s, [s.topics.receipts], "receipts")
    cmd = Commands(s)
    lease_runs, bound_runs, retry_runs = (
        _one_per_partition(kind, s.partitions) for kind in ("lease", "bound", "retry")
    )
    long = {"ms": 60_000, "ms_retry": 300, "stop_ms": 100}
    try:
        for runs, definition in (
            (lease_runs, "frozen-lease"),
            (bound_runs, "frozen-bound"),
            (retry_runs, "frozen-retry"),
        ):
            for run in runs:
                cmd.start(run, definition, long)
        cmd.flush()
        every = lease_runs + bound_runs + retry_runs
        events.wait_for(
            lambda r: all(events.of(x, "StepStarted") for x in every), 60, "every handler started"
        )
        worker_of = {x: events.of(x, "StepStarted")[0]["worker_id"].split("@")[0] for x in every}
        frozen_name = worker_of[lease_runs[0]]
        frozen = {x for x in every if worker_of[x] == frozen_name}
        # the partition-0 run of each kind is on the frozen worker, the others on the live one
        assert frozen == {lease_runs[0], bound_runs[0], retry_runs[0]}, worker_of
        fleet.procs[frozen_name].send_signal(signal.SIGSTOP)
        frozen_wall = int(time.time() * 1000)
        try:
            time.sleep(0.3)
            for run in lease_runs + bound_runs:
                cmd.cancel(run, "frozen")
            cmd.flush()
            cancel_at = time.monotonic()
            # seen live before either bound (the 1.5 s stop_timeout, the ~3 s lease): cancelling,
            # not cancelled (the committed events prove it below whatever the machine's speed)
            events.wait_for(
                lambda r: all(events.of(x, "RunCancelling") for x in (lease_runs[0], bound_runs[0])),
                10,
                "RunCancelling of the frozen runs",
            )
            live_check_s = round(time.monotonic() - cancel_at, 2)
            if live_check_s < 1.2:
                early = [x for x in (lease_runs[0], bound_runs[0]) if events.of(x, "RunCancelled")]
                assert not early, f"cancelled {live_check_s} s after the cancel, their worker frozen: {early}"
            # then each settles by its first bound, and the frozen retry is scheduled only after
            events.wait_for(
                lambda r: (
                    all(events.of(x, "RunCancelled") for x in lease_runs + bound_runs)
                    and any(e["attempt"] == 2 for e in events.of(retry_runs[0], "StepScheduled"))
                ),
                15,
                "the frozen runs settled by their bounds",
            )
            time.sleep(1.0)  # frozen a while longer: nothing else happens to them meanwhile
        finally:
            fleet.procs[frozen_name].send_signal(signal.SIGCONT)
        thawed_wall = int(time.time() * 1000)
        # the thawed worker's late receipts of its frozen attempts arrive, and change nothing
        late_kinds = ("ActivationCancelled", "ActivationCompleted", "ActivationFailed")

        def late(run: str) -> list[dict[str, Any]]:
            return [
                r
                for r in receipts.records
                if r["run_id"] == run
                and r["type"] in late_kinds
                and r["attempt"] == 1
                and r["worker_id"].startswith(f"{frozen_name}@")
                and r["ts_ms"] >= thawed_wall
            ]

        def settled(_r: Any) -> bool:
            receipts.poll(0.1)
            return bool(events.of(retry_runs[0], "RunSucceeded")) and all(late(x) for x in frozen)

        events.wait_for(settled, 40, "the thawed worker's late receipts and the retried run's end")
        events.wait_for(lambda r: set(every) <= _terminal(events), 40, "every run ended")
        time.sleep(2.0)  # time for the processor to act on any late receipt (it must not)
        events.drain(1.0)
    finally:
        codes = fleet.stop()
        events.close()
        receipts.close()
    assert all(code == 0 for code in codes.values()), (codes, fleet.tails())
    all_events, seen = _prove_stops(s, spans)

    # the frozen worker's cancelled attempts: cancelling until the first bound, which the
    # terminal event names (docs/semantics.md, Stopping: lease_expiry -> lease_expired,
    # stop_timeout -> stop_unconfirmed)
    for run, expected in ((lease_runs[0], "lease_expired"), (bound_runs[0], "stop_unconfirmed")):
        cancelling = _one(all_events, run, "RunCancelling")
        stopping = _one(all_events, run, "StepStopping", attempt=1)
        ended = _one(all_events, run, "RunCancelled")
        lease = _lease_of(all_events, run, 1, ended["sequence"])
        extended = [e["ts_ms"] for e in all_events if e["run_id"] == run and e["type"] == "StepLeaseExtended"]
        assert max(extended, default=0) <= frozen_wall, "a heartbeat made while frozen extended the lease"
        first_bound = min(lease, stopping["due_ms"])
        assert ended["ts_ms"] >= first_bound, (run, ended["ts_ms"], lease, stopping["due_ms"])
        assert (
            cancelling["sequence"]
            < ended["sequence"]
            == max(e["sequence"] for e in all_events if e["run_id"] == run)
        )
        assert ended["stops"] == [{"node": "a", "lineage": "", "attempt": 1, "stop": expected}], ended
        assert (lease < stopping["due_ms"]) == (expected == "lease_expired")
    # the live worker's: confirmed at once
    for run in (lease_runs[1], bound_runs[1]):
        ended = _one(all_events, run, "RunCancelled")
        assert [st["stop"] for st in ended["stops"]] == ["confirmed"], ended
        assert ended["ts_ms"] - _one(all_events, run, "RunCancelling")["ts_ms"] < 2000
    # the frozen worker's timed-out attempt: stopping from its node timeout until its lease
    # expired; the retry is scheduled only then, and succeeds
    run = retry_runs[0]
    stopping = _one(all_events, run, "StepStopping", attempt=1)
    failed = _one(all_events, run, "StepFailed", attempt=1)
    retry = _one(all_events, run, "StepScheduled", attempt=2)
    lease = _lease_of(all_events, run, 1, failed["sequence"])
    assert stopping["cause"] == "timeout" and failed["failure"]["code"] == "Timeout", failed
    assert failed["stop"] == "lease_expired" and failed["ts_ms"] >= lease, (failed, lease)
    assert stopping["sequence"] < failed["sequence"] < retry["sequence"] and retry["ts_ms"] >= failed["ts_ms"]
    after = [
        e["type"]
        for e in all_events
        if e["run_id"] == run and e.get("attempt") == 1 and e["sequence"] > retry["sequence"]
    ]
    assert after == [], f"attempt 1's late receipts changed the run: {after}"
    _one(all_events, run, "RunSucceeded")
    prove(
        "a worker frozen (SIGSTOP) during a cancel and a node timeout",
        s,
        started=set(every),
        extra={
            "late_receipts": {x: sorted({r["type"] for r in late(x)}) for x in sorted(frozen)},
            "frozen_ms": thawed_wall - frozen_wall,
            "cancelling_seen_live_after_s": live_check_s,
            **seen,
        },
    )
