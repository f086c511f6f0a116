"""A stopping attempt's two bounds due together: its lease (`lease_expiry`) and its
`stop_timeout` (docs/semantics.md, Stopping: the lease -> `lease_expired`, the bound ->
`stop_unconfirmed`).

When both are due at once the processor fires both in one transaction (timers.py: every due
timer becomes a TimerFired, earliest first), so the engine reads the second TimerFired after
the first settled the attempt, although its effects cleared that timer. Whichever is read first
must win, and be what every record says: the step's StepCancelled / StepFailed `stop`, the
RunCancelled `stops`, the step's state (`stop.how`), a refold of the events; the second
timer and a late ActivationCancelled(confirmed) must change nothing, whether the run has
ended or is still cancelling (another step still stopping), and must never touch a retry's
next attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from engine_harness import RunHarness, definition

from processors.engine import dump_state
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore

LEASE_MS = 5000
ORDERS = {"lease first": ("lease_expiry", "stop_timeout"), "bound first": ("stop_timeout", "lease_expiry")}
WON = {"lease_expiry": "lease_expired", "stop_timeout": "stop_unconfirmed"}


def act(**extra: Any) -> dict[str, Any]:
    # stop_timeout_ms defaults to lease_ms: a cancel in the same ms as the last heartbeat ties them
    return {"kind": "action", "action": "do", "lease_ms": LEASE_MS, "heartbeat_ms": 1000, **extra}


def _armed(h: RunHarness, node: str, attempt: int) -> dict[str, dict[str, Any]]:
    """The attempt's two bounds, as the processor would fire them (copies, due and all)."""
    timers = {
        t["timer_kind"]: dict(t)
        for t in h.timers.values()
        if t["node"] == node and t["attempt"] == attempt and t["timer_kind"] in WON
    }
    assert set(timers) == set(WON), sorted(h.timers)
    return timers


def _tied(h: RunHarness, node: str, attempt: int = 1) -> dict[str, dict[str, Any]]:
    timers = _armed(h, node, attempt)
    assert timers["lease_expiry"]["due_ms"] == timers["stop_timeout"]["due_ms"], timers
    return timers


def _fire_both(h: RunHarness, timers: dict[str, dict[str, Any]], order: tuple[str, str]) -> list[Any]:
    """Both TimerFired, read in `order` at their (common) due, the way one firing batch is."""
    decisions = []
    due = timers[order[0]]["due_ms"]
    for i, kind in enumerate(order):
        h.timers.pop(timers[kind]["timer_id"], None)
        h.send(dict(timers[kind]), advance=max(due - h.now, 0) if i == 0 else 0)
        decisions.append(h.last)
    return decisions


def _consistent(h: RunHarness) -> None:
    assert h.refold() == dump_state(h.state)


@pytest.mark.parametrize("order", ORDERS.values(), ids=ORDERS.keys())
def test_a_cancelled_attempt_both_bounds_due_the_first_read_wins_everywhere(order: tuple[str, str]) -> None:
    h = RunHarness(definition({"a": act()})).start({}).accept("a", lease_ms=LEASE_MS)
    h.send({"type": "CancelRun", "reason": "now"}, advance=0)  # the same ms as the acceptance
    assert h.types == ["StepStopping", "RunCancelling"]
    first, second = _fire_both(h, _tied(h, "a"), order)
    won = WON[order[0]]
    assert [e["type"] for e in first.events] == ["StepCancelled", "RunCancelled"]
    assert first.events[0]["stop"] == won and h.step("a")["stop"]["how"] == won
    assert first.events[1]["stops"] == [{"node": "a", "lineage": "", "attempt": 1, "stop": won}]
    assert second.events == [] and second.dropped == "run finished"  # the other bound: nothing
    h.stopped("a", confirmed=True)  # the worker's proof, too late
    assert h.types == [] and h.last.dropped == "run finished"
    assert h.status == "cancelled" and h.step("a")["stop"]["how"] == won
    _consistent(h)


@pytest.mark.parametrize("order", ORDERS.values(), ids=ORDERS.keys())
def test_while_another_step_still_stops_the_losing_bound_and_a_late_proof_are_dropped(
    order: tuple[str, str],
) -> None:
    h = RunHarness(definition({"a": act(), "b": act(lease_ms=60_000)}, entry=["a", "b"])).start({})
    h.accept("b", lease_ms=60_000).accept("a", lease_ms=LEASE_MS)
    h.send({"type": "CancelRun", "reason": "now"}, advance=0)
    first, second = _fire_both(h, _tied(h, "a"), order)
    won = WON[order[0]]
    assert [e["type"] for e in first.events] == ["StepCancelled"] and first.events[0]["stop"] == won
    assert h.status == "cancelling"  # b still stops: the losing timer is read by a cancelling run
    assert second.events == [] and second.dropped == "stale timer"
    h.stopped("a", confirmed=True)
    assert h.types == [] and h.last.dropped == "step already cancelled"
    h.stopped("b")
    assert h.types == ["StepCancelled", "RunCancelled"]
    assert h.last.events[-1]["stops"] == [
        {"node": "a", "lineage": "", "attempt": 1, "stop": won},
        {"node": "b", "lineage": "", "attempt": 1, "stop": "confirmed"},
    ]
    _consistent(h)


@pytest.mark.parametrize("order", ORDERS.values(), ids=ORDERS.keys())
def test_a_timed_out_attempt_both_bounds_due_then_its_retry_is_untouched(order: tuple[str, str]) -> None:
    retry = {"max_attempts": 3, "backoff_ms": 100}
    h = RunHarness(definition({"a": act(timeout_ms=1000, retry=retry)})).start({})
    node_timeout = next(t for t in h.timers.values() if t["timer_kind"] == "node_timeout")
    # the last heartbeat in the same ms as the node timeout: lease and bound due together
    h.send(
        {"type": "ActivationAccepted", **h.ident("a"), "worker_id": "w1", "lease_ms": LEASE_MS},
        advance=node_timeout["due_ms"] - h.now,
    )
    h.fire("node_timeout", "a")
    assert h.types == ["StepStopping"] and h.last.events[0]["cause"] == "timeout"
    first, second = _fire_both(h, _tied(h, "a"), order)
    won = WON[order[0]]
    assert [e["type"] for e in first.events] == ["StepFailed", "StepRetryScheduled"]
    failed = first.events[0]
    assert failed["stop"] == won and failed["failure"]["code"] == "Timeout"
    assert "timed out after 1000 ms" in failed["failure"]["message"]  # the cause, not the bound
    assert second.events == [] and second.dropped == "stale timer"
    h.stopped("a", confirmed=True, attempt=1)  # while the retry waits
    assert h.types == [] and h.last.dropped == "attempt already stopped"
    h.fire("retry_backoff", "a")
    assert h.types == ["StepScheduled"] and h.step("a")["attempt"] == 2
    h.accept("a", lease_ms=LEASE_MS)
    for kind in order:  # attempt 1's bounds redelivered (at least once) under attempt 2
        h.send(dict(_armed_copy(failed, kind)), advance=0)
        assert h.types == [] and h.last.dropped == "stale timer"
    h.stopped("a", confirmed=True, attempt=1)
    assert h.types == [] and h.last.dropped == "stale attempt"
    assert h.step("a")["status"] == "running" and h.step("a")["attempt"] == 2
    _consistent(h)


def _armed_copy(failed: dict[str, Any], kind: str) -> dict[str, Any]:
    """A TimerFired of the failed attempt's `kind` bound (its exact due no longer matters)."""
    from processors.engine.ids import step_timer_id

    return {
        "type": "TimerFired",
        "timer_id": step_timer_id(kind, failed["dispatch_id"]),
        "timer_kind": kind,
        "due_ms": failed["ts_ms"],
        "node": failed["node"],
        "lineage": failed["lineage"],
        "attempt": failed["attempt"],
        "dispatch_id": failed["dispatch_id"],
    }


def test_the_processor_fires_a_tie_lease_first(tmp_path: Path) -> None:
    """Which order a tie has in the processor: one run's timers due in the same ms fire in timer
    id order (store.py: t<due><run_id>\\x1f<timer_id>), and `lease_expiry:<dispatch>` sorts
    before `stop_timeout:<dispatch>`: a tie reports lease_expired. An earlier due fires first."""
    h = RunHarness(definition({"a": act()})).start({}).accept("a", lease_ms=LEASE_MS)
    h.send({"type": "CancelRun", "reason": "now"}, advance=0)
    timers = _tied(h, "a")
    store = PartitionStore(tmp_path / "p0", 0)
    try:
        overlay = PartitionOverlay(store)
        for kind in ("stop_timeout", "lease_expiry"):  # armed in the other order
            body = {**timers[kind], "run_id": h.run_id}
            overlay.set_timer(h.run_id, body, orjson.dumps(body))
        overlay.write(None)
        due = timers["lease_expiry"]["due_ms"]
        fired = [orjson.loads(v)["timer_kind"] for _k, v in store.due_timers(due, 10)]
        assert fired == ["lease_expiry", "stop_timeout"]
    finally:
        store.close()
