"""The processor's store equals the fold of the committed run events: what the live path wrote
(a record at a time, timers fired and coming back, purges) is what a new owner restoring from
`<p>.run-events` builds (no broker; the fold into real RocksDB stores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fold_rig import (
    CODEC,
    RETENTION,
    TOPICS,
    TS,
    Rig,
    completed,
    contents,
    fire,
    purge,
    restore,
    restore_from_state,
    start,
    state,
)

from processors.runtime.overlay import PartitionOverlay
from processors.runtime.timers import TimerFirer
from schemas.run_state import purged_status

WALL = 3_600_000
# `m` maps over state /items, which is null: each activation of the superstep fails the run
# (InvalidInput), fail-fast cancelling `a`, scheduled with a timer in the same record (a sleep:
# nothing in flight, so the run fails at once; an action would first have to stop).
MAPFAIL = {
    "schema": "runfold.workflow/v1",
    "id": "mapfail",
    "revision": 1,
    "entry": ["a", "m"],
    "state": {"items": None},
    "nodes": {
        "a": {"kind": "sleep", "duration_ms": 7_200_000},
        "m": {"kind": "action", "action": "m", "map": {"from": "state", "pointer": "/items"}},
    },
    "budgets": {"wall_time_ms": WALL},
}
RETRY = {
    "schema": "runfold.workflow/v1",
    "id": "retry",
    "revision": 1,
    "entry": ["a"],
    "state": {"a": None},
    "nodes": {
        "a": {
            "kind": "action",
            "action": "a",
            "retry": {"max_attempts": 3, "backoff_ms": 1000},
            "writes": {"a": {"from": "output"}},
        }
    },
}
STATE_ONLY = {
    "schema": "runfold.workflow/v1",
    "id": "state-only",
    "revision": 1,
    "entry": ["s"],
    "state": {"x": None},
    "nodes": {"s": {"kind": "state", "mutations": [{"op": "set", "target": "x", "value": 1}]}},
}


def rig(path: Path) -> Rig:
    r = Rig(path)
    for definition in (MAPFAIL, RETRY, STATE_ONLY):
        r.folder.ctx.catalog.register(definition)
    return r


def begin(run_id: str, definition: str) -> tuple[str, dict[str, Any]]:
    kind, msg = start(run_id)
    return kind, {**msg, "definition_id": definition}


def resume(run_id: str, ts: int) -> tuple[str, dict[str, Any]]:
    return "commands", {
        "type": "ResumeRun",
        "run_id": run_id,
        "ts_ms": ts,
        "record_id": f"resume-{ts}",
        "budgets": None,
        "reason": "again",
    }


def failed(act: dict[str, Any], ts: int) -> tuple[str, dict[str, Any]]:
    return "receipts", {
        "type": "ActivationFailed",
        "run_id": act["run_id"],
        "ts_ms": ts,
        "record_id": f"f-{ts}",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        "code": "ExecutionFailed",
        "message": "no",
        "retryable": True,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0},
    }


def assert_restores_the_same(r: Rig, path: Path) -> dict[str, Any]:
    """From the log and from run-state (the snapshots, then every event again: each is
    skipped as already in its run's snapshot), the store the live path wrote."""
    live = contents(r.store)
    restored = restore(r, path)
    assert contents(restored) == live
    restored.close()
    for events_from in (None, 0):
        seeded = restore_from_state(r, path.with_name(f"{path.name}-state-{events_from}"), events_from)
        assert contents(seeded) == live
        seeded.close()
    return live


def test_a_run_finished_within_its_start_record_keeps_no_timer(tmp_path: Path) -> None:
    # its events arm the wall timer (RunStarted) and clear it (RunSucceeded) in one record
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "state-only"))
    assert state(r.store, "r")["status"] == "succeeded"
    assert assert_restores_the_same(r, tmp_path / "restored")["timers"] == {}


def test_fail_fast_in_the_record_that_scheduled_a_timed_sibling_keeps_no_timer(tmp_path: Path) -> None:
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "mapfail"))
    assert state(r.store, "r")["status"] == "failed"
    assert assert_restores_the_same(r, tmp_path / "restored")["timers"] == {}


def test_a_retry_backoff_timer_that_fired_does_not_come_back_on_restore(tmp_path: Path) -> None:
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "retry"))
    r.transaction(failed(r.activation("r"), TS + 100))  # retry scheduled, due TS + 1100
    [timer] = fire(r, TS + 1100)
    assert timer["timer_kind"] == "retry_backoff"
    r.transaction(("receipts", timer))
    assert r.activation("r")["attempt"] == 2
    live = assert_restores_the_same(r, tmp_path / "restored")
    assert [t for t in live["timers"] if t.startswith("retry_backoff:")] == []
    r.transaction(completed(r.activation("r"), TS + 2000))
    assert assert_restores_the_same(r, tmp_path / "restored2")["timers"] == {}


def test_failed_resumed_and_failed_again_in_one_record_purges_from_the_second_failure(tmp_path: Path) -> None:
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "mapfail"))  # failed at TS
    again = TS + 20_000
    r.transaction(resume("r", again))  # RunResumed ... RunFailed in one record
    assert state(r.store, "r")["status"] == "failed"
    assert assert_restores_the_same(r, tmp_path / "restored")["purges"] == [(again + RETENTION, "r")]
    assert purge(r.store, TS + RETENTION) == 0
    assert purge(r.store, again + RETENTION) == 1
    assert contents(r.store)["status_counts"] == {}  # counted once, nothing negative


def test_two_due_purge_entries_of_one_run_purge_it_once(tmp_path: Path) -> None:
    # e.g. an entry left under an older retention setting next to the current one
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "mapfail"))
    ov = PartitionOverlay(r.store)
    ov.purge_at("r", TS + 5, "failed", TS)
    ov.write(None)
    assert len(contents(r.store)["purges"]) == 2
    assert purge(r.store, TS + RETENTION) == 1
    assert contents(r.store)["purges"] == [] and r.store.stats["status.failed"] == 0
    assert r.store.purged_status("r") == "failed"


def test_a_purge_that_takes_the_earliest_timer_moves_the_due_bound(tmp_path: Path) -> None:
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "retry"))  # running: wall timer due TS + 7 days (the ceiling)
    r.transaction(begin("old", "state-only"))  # finished; give it a leftover timer due first
    ov = PartitionOverlay(r.store)  # (as processors before this fix left some)
    ov.set_timer("old", {"run_id": "old", "timer_id": "wall_time:old:0", "due_ms": TS + 10}, b"{}")
    ov.write(None)
    assert r.store.next_due_ms == TS + 10
    assert purge(r.store, TS + RETENTION) == 1 and list(contents(r.store)["timers"]) == ["wall_time:r:0"]
    assert r.store.next_due_ms == state(r.store, "r")["wall"]["due_ms"]
    assert not TimerFirer.any_due(r.store, TS + RETENTION)  # no empty transaction each iteration


def test_a_purged_run_id_stays_taken_when_retention_is_switched_off(tmp_path: Path) -> None:
    r = rig(tmp_path / "live")
    r.transaction(start("done"))
    r.transaction(completed(r.activation("done"), TS + 500))
    assert purge(r.store, TS + 500 + RETENTION) == 1
    r.folder.finished_retention_ms = 0  # restarted with finished_retention_ms: 0 (keep forever)
    before = len(r.events())
    r.transaction(start("done"))
    [event] = [CODEC.decode("run_events", raw) for raw in r.events()[before:]]
    assert (event["type"], event["code"]) == ("RunRejected", "Conflict")


def test_an_entry_from_a_finish_before_a_resume_under_another_retention_does_not_purge(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path / "live")
    r.transaction(begin("r", "mapfail"))  # failed at TS: entry TS + RETENTION
    r.folder.finished_retention_ms = 10 * RETENTION  # restarted with a longer retention
    again = TS + 20_000
    r.transaction(resume("r", again))  # failed again; the old entry is not where it looks now
    assert len(contents(r.store)["purges"]) == 2
    assert purge(r.store, TS + RETENTION) == 0 and r.store.state_bytes("r") is not None
    assert contents(r.store)["purges"] == [(again + 10 * RETENTION, "r")]  # the stale one went
    assert purge(r.store, again + 10 * RETENTION) == 1


def test_a_purged_run_keeps_its_id_in_run_state_and_a_store_restored_from_it_refuses_the_id(
    tmp_path: Path,
) -> None:
    # the input that meets the run past its retention purges it: its run-state record is a
    # marker, not a tombstone, so a store restored from run-state knows the id
    r = rig(tmp_path / "live")
    r.transaction(start("done"))
    r.transaction(completed(r.activation("done"), TS + 500))
    later = TS + 10 * RETENTION
    r.folder._now_ms = lambda: later
    r.transaction(resume("done", later))
    [(key, marker)] = [(k, v) for t, k, v in r.keyed if t == TOPICS.run_state][-1:]
    assert key == b"done" and marker is not None
    assert purged_status(CODEC.decode("run_state", marker)) == "succeeded"
    live = contents(r.store)
    assert live["purged"] == {"done": "succeeded"} and live["states"] == {}
    seeded = restore_from_state(r, tmp_path / "seeded")
    assert contents(seeded) == live
    seeded.close()
    r.store.close()
    r.store = restore_from_state(r, tmp_path / "seeded2")
    before = len(r.events())
    r.transaction(start("done"))
    [event] = [CODEC.decode("run_events", raw) for raw in r.events()[before:]]
    assert (event["type"], event["code"]) == ("RunRejected", "Conflict")
