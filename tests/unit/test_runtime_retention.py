"""Finished runs leave the processor's local store after `finished_retention_ms` (no broker)."""

from __future__ import annotations

from pathlib import Path

import orjson
from fold_rig import CODEC, RETENTION, TS, Rig, completed, purge, restore, start, timer_ids

from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, timer_ref_key


def test_a_finished_run_is_purged_after_its_retention_and_a_running_one_is_not(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("done"), start("busy"))
    finished_at = TS + 500
    rig.transaction(completed(rig.activation("done"), finished_at))
    store = rig.store
    assert store.stats["status.succeeded"] == 1 and store.stats["status.running"] == 1
    assert store.state_bytes("done") is not None and len(store.events("done")) >= 4
    assert store.next_purge_ms == finished_at + RETENTION
    assert purge(store, finished_at + RETENTION - 1) == 0  # not yet
    assert store.state_bytes("done") is not None
    assert purge(store, finished_at + RETENTION) == 1
    assert store.state_bytes("done") is None and store.events("done") == []
    assert store.stats["status.succeeded"] == 0 and store.stats["status.running"] == 1
    assert store.next_purge_ms is None and purge(store, finished_at + 10 * RETENTION) == 0
    # the running run, its events and its wall-time timer are untouched
    assert store.state_bytes("busy") is not None and len(store.events("busy")) >= 3
    assert store.get(timer_ref_key("busy", next(iter(timer_ids(store, "busy"))))) is not None
    # its id is not reused: a late duplicate StartRun is rejected, not started afresh
    before = len(rig.events())
    rig.transaction(start("done"))
    [rejected] = [CODEC.decode("run_events", raw) for raw in rig.events()[before:]]
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Conflict"
    assert (
        "already ran (succeeded) and was purged" in rejected["reason"] and store.state_bytes("done") is None
    )
    # the purged counts survive a reopen
    store.close()
    again = PartitionStore(tmp_path / "live", 0)
    assert again.stats["status.succeeded"] == 0 and again.state_bytes("done") is None
    again.close()


def test_a_purge_deletes_key_by_key_and_leaves_a_run_whose_id_extends_it_alone(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("done"), start("done2"))  # "rdone\x1f..." < "rdone2...": neighbours in the store
    finished_at = TS + 500
    rig.transaction(completed(rig.activation("done"), finished_at))
    store = rig.store
    # a timer the finished run still holds (none is expected; the purge must take it anyway)
    body = {
        "type": "TimerFired",
        "timer_id": "stray",
        "timer_kind": "sleep",
        "due_ms": TS + 10**9,
        "run_id": "done",
    }
    ov = PartitionOverlay(store)
    ov.set_timer("done", body, orjson.dumps(body))
    ov.write(None)
    kept_events, kept_timers = store.events("done2"), timer_ids(store, "done2")
    assert kept_events and kept_timers and timer_ids(store, "done") != []
    pending, events = store.pending_timers(), len(store.events("done"))
    deletes = store.db.property_int_value("rocksdb.num-deletes-active-mem-table")
    assert purge(store, finished_at + RETENTION) == 1
    assert store.events("done") == [] and timer_ids(store, "done") == [] and store.state_bytes("done") is None
    assert store.pending_timers() == pending - 1
    assert store.events("done2") == kept_events and timer_ids(store, "done2") == kept_timers
    # Point deletes only (each event, the timer and its reference, the state, the purge entry,
    # and the pass's record of its page): RocksDB rebuilds its list of range tombstones on every
    # iterator it creates, so a range deletion per purged run made every later scan slower.
    assert store.db.property_int_value("rocksdb.num-deletes-active-mem-table") - deletes == events + 5


def test_restore_from_the_events_sets_the_same_purge_time(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("done"))
    rig.transaction(completed(rig.activation("done"), TS + 500))
    restored = restore(rig, tmp_path / "restored")
    assert restored.next_purge_ms == rig.store.next_purge_ms == TS + 500 + RETENTION
    assert purge(restored, TS + 500 + RETENTION) == 1 and restored.state_bytes("done") is None
    restored.close()
    rig.store.close()


def failed(act: dict, ts: int) -> tuple[str, dict]:
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
        "code": "Boom",
        "message": "no",
        "retryable": False,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0},
    }


def resume(run_id: str, ts: int) -> tuple[str, dict]:
    return "commands", {
        "type": "ResumeRun",
        "run_id": run_id,
        "ts_ms": ts,
        "record_id": f"resume-{ts}",
        "budgets": None,
        "reason": "try again",
    }


def test_a_run_resumed_after_it_failed_is_kept_and_then_purged_from_its_second_finish(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "live")
    rig.transaction(start("r"))
    failed_at, done_at = TS + 500, TS + 5 * RETENTION
    rig.transaction(failed(rig.activation("r"), failed_at))
    assert rig.store.stats["status.failed"] == 1 and rig.store.next_purge_ms == failed_at + RETENTION
    rig.transaction(resume("r", failed_at + 1000))
    assert orjson.loads(rig.store.state_bytes("r"))["status"] == "running"
    # the failure's purge entry left with the resume: nothing is due, the running run stays
    assert purge(rig.store, failed_at + RETENTION) == 0 and rig.store.state_bytes("r") is not None
    rig.transaction(completed(rig.activation("r"), done_at))
    assert purge(rig.store, done_at + RETENTION - 1) == 0 and rig.store.state_bytes("r") is not None
    assert purge(rig.store, done_at + RETENTION) == 1 and rig.store.state_bytes("r") is None
    assert {k: v for k, v in rig.store.stats.items() if k.startswith("status.")} == {
        "status.running": 0,
        "status.failed": 0,
        "status.succeeded": 0,
    }
    # restore from the run's events makes the same decisions
    restored = restore(rig, tmp_path / "restored")
    assert restored.next_purge_ms == done_at + RETENTION
    assert purge(restored, done_at + RETENTION) == 1
    restored.close()
    rig.store.close()


def test_a_stale_purge_entry_of_a_live_run_is_dropped_not_acted_on(tmp_path: Path) -> None:
    # e.g. the failure's entry under an older retention setting, which the resume did not find
    rig = Rig(tmp_path / "live")
    rig.transaction(start("r"))
    ov = PartitionOverlay(rig.store)
    ov.purge_at("r", TS + 10, "failed", TS)
    ov.write(None)
    stats = dict(rig.store.stats)
    assert purge(rig.store, TS + 10) == 0
    assert rig.store.state_bytes("r") is not None and rig.store.purged_status("r") is None
    assert rig.store.stats == stats and rig.store.next_purge_ms is None  # the entry is gone


def test_a_stale_purge_entry_first_in_a_page_does_not_keep_the_run_from_its_own(tmp_path: Path) -> None:
    """Retention 1 h, the run fails; a restart with 1 week and a ResumeRun (which looks for the
    1-week entry: the 1-hour one stays, stale); the run fails again. At the second entry's time
    one page holds both: the stale one first. It went, and the run's own entry was taken for a
    second entry of a run already purged: both went, the run stayed for good (found in review)."""
    hour, week = 3_600_000, 7 * 24 * 3_600_000
    rig = Rig(tmp_path / "p")
    rig.folder.finished_retention_ms = hour
    rig.transaction(start("r"))
    first = TS + 500
    rig.transaction(failed(rig.activation("r"), first))
    rig.folder.finished_retention_ms = week
    rig.transaction(resume("r", first + 60_000))
    second = first + 120_000
    rig.transaction(failed(rig.activation("r"), second))
    assert [(run_id, status) for _, run_id, status in rig.store.due_purges(second + week)] == [
        ("r", None),
        ("r", "failed"),
    ]
    assert purge(rig.store, second + week) == 1
    assert rig.store.state_bytes("r") is None and rig.store.purged_status("r") == "failed"
    assert rig.store.stats.get("status.failed", 0) == 0 and rig.store.due_purges(second + 2 * week) == []
