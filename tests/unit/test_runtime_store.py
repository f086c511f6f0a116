"""Store, write overlay, timers index and partitioner of the processor runtime (no broker); the
timer index against a model (hypothesis, stateful) and what clearing timers costs a commit once
many have been cleared; a store killed with SIGKILL keeps every write it made."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from processors.kafka.partitioning import murmur2, partition_for
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import NO_OFFSET, ChangeSet, PartitionStore, timer_ref_key
from processors.runtime.timers import TimerFirer


@pytest.fixture
def store(tmp_path: Path):
    s = PartitionStore(tmp_path / "p0", 0)
    yield s
    s.close()


def _timer(run_id: str, timer_id: str, due: int) -> tuple[dict, bytes]:
    body = {
        "type": "TimerFired",
        "timer_id": timer_id,
        "timer_kind": "sleep",
        "due_ms": due,
        "run_id": run_id,
    }
    return body, orjson.dumps(body)


def test_java_murmur2_vectors() -> None:
    # Vectors from Apache Kafka's UtilsTest.testMurmur2 (signed Java ints).
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


def test_partition_for_is_stable_and_in_range() -> None:
    seen = {partition_for(f"run-{i}", 6) for i in range(200)}
    assert seen == set(range(6))
    assert partition_for("run-1", 6) == partition_for(b"run-1", 6)


def test_overlay_is_invisible_until_written_and_survives_reopen(tmp_path: Path) -> None:
    s = PartitionStore(tmp_path / "p3", 3)
    assert s.applied_offset == NO_OFFSET
    ov = PartitionOverlay(s)
    ov.states["r1"] = {"run_id": "r1", "sequence": 2}
    ov.dumped["r1"] = orjson.dumps(ov.states["r1"])
    ov.add_event("r1", 1, b"e1")
    ov.add_event("r1", 2, b"e2")
    ov.add_event("r1", 0, b"rejected")  # sequence 0 belongs to no run log
    assert s.state_bytes("r1") is None  # nothing before the commit
    ov.write(applied_offset=41)
    assert orjson.loads(s.state_bytes("r1") or b"null")["sequence"] == 2
    assert s.events("r1") == [b"e1", b"e2"]
    assert s.events("r1", since=1) == [b"e2"]
    assert s.applied_offset == 41
    s.close()
    again = PartitionStore(tmp_path / "p3", 3)
    assert again.applied_offset == 41 and again.events("r1") == [b"e1", b"e2"]
    again.close()


def test_events_of_runs_sharing_a_prefix_do_not_mix(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.add_event("a", 1, b"a1")
    ov.add_event("ab", 1, b"ab1")
    ov.add_event("a/child", 1, b"c1")
    ov.write(None)
    assert store.events("a") == [b"a1"]
    assert store.events("ab") == [b"ab1"]
    assert store.events("a/child") == [b"c1"]


def test_overlay_reads_its_own_writes_before_the_store(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.states["r"] = {"run_id": "r", "sequence": 1}
    ov.dumped["r"] = orjson.dumps(ov.states["r"])
    ov.write(None)
    second = PartitionOverlay(store)
    assert second.state("r", orjson.loads)["sequence"] == 1
    second.states["r"] = {"run_id": "r", "sequence": 5}
    assert second.state("r", orjson.loads)["sequence"] == 5
    assert orjson.loads(store.state_bytes("r") or b"null")["sequence"] == 1


def test_due_timers_in_due_order_and_stop_at_now(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    for i, due in enumerate([300, 100, 200, 10_000]):
        body, raw = _timer(f"r{i}", f"t{i}", due)
        ov.set_timer(f"r{i}", body, raw)
    ov.write(None)
    assert store.next_due_ms == 100
    assert store.due_timers(50, 100) == []
    due = store.due_timers(300, 100)
    assert [orjson.loads(v)["due_ms"] for _k, v in due] == [100, 200, 300]
    assert len(store.due_timers(300, 2)) == 2


def test_clear_and_reset_timer_are_o1_via_the_reverse_index(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.write(None)
    # moving a stored timer deletes its old index entry
    ov2 = PartitionOverlay(store)
    body, raw = _timer("r", "t", 500)
    ov2.set_timer("r", body, raw)
    ov2.write(None)
    assert [orjson.loads(v)["due_ms"] for _k, v in store.due_timers(1_000, 10)] == [500]
    assert store.pending_timers() == 1
    ov3 = PartitionOverlay(store)
    ov3.clear_timer("r", "t")
    ov3.write(None)
    assert store.pending_timers() == 0 and store.get(timer_ref_key("r", "t")) is None
    # the bound stays a lower bound until it passes (re-seeking at each clear walked tombstones:
    # test_clearing_timers_costs_a_commit_...); then it moves to the truth: no timer left
    assert store.next_due_ms == 100  # the first timer's old due: moved, then cleared
    assert store.due_timers(1_000, 10) == [] and store.next_due_ms is None


def test_fired_timer_is_not_pending_in_its_transaction(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.write(None)
    ov2 = PartitionOverlay(store)
    ((tkey, _v),) = store.due_timers(100, 10)
    assert ov2.timer_pending(timer_ref_key("r", "t"), tkey)
    ov2.clear_timer("r", "t")
    assert not ov2.timer_pending(timer_ref_key("r", "t"), tkey)
    # dropped overlay (abort): the timer is still stored and due
    assert len(store.due_timers(100, 10)) == 1


def test_set_then_clear_in_one_transaction_leaves_nothing(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.clear_timer("r", "t")
    ov.write(None)
    assert store.pending_timers() == 0


def test_stats_accumulate(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.count("timers_fired", 2)
    ov.write(None)
    ov = PartitionOverlay(store)
    ov.count("timers_fired", 3)
    ov.write(None)
    assert store.stats["timers_fired"] == 5


def test_state_cache_keeps_the_most_recently_written_runs_and_drops_finished_ones(tmp_path: Path) -> None:
    from rocksdict import WriteBatch

    s = PartitionStore(tmp_path / "p0", 0, cache_runs=10)

    def write(*run_ids: str, status: str = "running") -> None:
        s.apply(
            ChangeSet(
                WriteBatch(raw_mode=True), states={r: {"run_id": r, "status": status} for r in run_ids}
            ),
            None,
        )

    write(*(f"r{i}" for i in range(10)))
    write("r0")  # written again: now the most recent
    write("r10")  # one over: the least recently written go, a tenth more than the excess
    assert list(s.cache) == ["r3", "r4", "r5", "r6", "r7", "r8", "r9", "r0", "r10"]
    write("r5", status="succeeded")  # a finished run is not kept
    assert "r5" not in s.cache and len(s.cache) == 8
    s.close()
    none = PartitionStore(tmp_path / "p1", 1, cache_runs=0)
    none.apply(ChangeSet(WriteBatch(raw_mode=True), states={"a": {"run_id": "a", "status": "running"}}), None)
    assert none.cache == {}
    none.close()


def test_recently_written_timer_references_agree_with_the_database(
    store: PartitionStore, monkeypatch
) -> None:
    import processors.runtime.store as store_module

    monkeypatch.setattr(store_module, "TIMER_REF_CACHE", 3)  # evictions happen too
    refs = [timer_ref_key(f"r{i}", "t") for i in range(5)]

    def agree() -> None:
        for rkey in refs:
            assert store.timer_ref(rkey) == store.get(rkey)

    for due in (100, 200):  # arm, then move every timer (the old t-keys go)
        ov = PartitionOverlay(store)
        for i in range(5):
            ov.set_timer(f"r{i}", *_timer(f"r{i}", "t", due + i))
        ov.write(None)
        agree()
        assert store.pending_timers() == 5 and len(store.timer_refs) <= 3
    ov = PartitionOverlay(store)
    ov.clear_timer("r4", "t")  # cleared and re-armed in one transaction: the put wins
    ov.set_timer("r4", *_timer("r4", "t", 900))
    ov.clear_timer("r3", "t")
    ov.write(None)
    agree()
    assert store.timer_ref(refs[3]) is None and store.timer_ref(refs[4]) is not None
    ov = PartitionOverlay(store)  # a purge deletes the run's timers with it
    ov.purge(b"x" + (0).to_bytes(8, "big") + b"r4", "r4", "succeeded")
    ov.write(None)
    agree()
    assert store.timer_ref(refs[4]) is None and store.pending_timers() == 3


RUNS = ("a", "b", "c")
TIMERS = ("lease", "wall", "sleep")
DUE = st.integers(min_value=0, max_value=2_000)


class TimerIndex(RuleBasedStateMachine):
    """Arm, move, clear and fire timers over transactions, reopen the store now and then; the
    store must fire exactly the model's due timers, in due order, and its `next_due_ms` must
    never be later than the earliest stored timer (a bound later than it would fire it late)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="runfold-timers-"))
        self.store = PartitionStore(self.root / "p0", 0)
        self.model: dict[tuple[str, str], int] = {}
        self.now = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        ops=st.lists(
            st.tuples(st.sampled_from(RUNS), st.sampled_from(TIMERS), st.one_of(st.none(), DUE)),
            min_size=1,
            max_size=6,
        )
    )
    def transaction(self, ops: list[tuple[str, str, int | None]]) -> None:
        """One committed transaction: each op arms (or moves) a timer, or clears it (None)."""
        ov = PartitionOverlay(self.store)
        for run_id, timer_id, due in ops:
            if due is None:
                ov.clear_timer(run_id, timer_id)
                self.model.pop((run_id, timer_id), None)
            else:
                body, raw = _timer(run_id, timer_id, self.now + due)
                ov.set_timer(run_id, body, raw)
                self.model[(run_id, timer_id)] = self.now + due
        ov.write(None)

    @rule(advance=st.integers(min_value=0, max_value=1_500), limit=st.integers(min_value=1, max_value=4))
    def fire(self, advance: int, limit: int) -> None:
        """Time passes; the due timers fire (at most `limit` per transaction) and are cleared, as
        TimerFirer does."""
        self.now += advance
        expected = sorted((due, key) for key, due in self.model.items() if due <= self.now)
        if not TimerFirer.any_due(self.store, self.now):
            assert expected == [], f"timers due by {self.now} but the bound says none: {expected}"
            return
        fired = self.store.due_timers(self.now, limit)
        got = [orjson.loads(v) for _k, v in fired]
        assert [(t["due_ms"], (t["run_id"], t["timer_id"])) for t in got] == expected[:limit]
        ov = PartitionOverlay(self.store)
        for t in got:
            assert ov.timer_pending(timer_ref_key(t["run_id"], t["timer_id"]), _tkey(fired, t))
            ov.clear_timer(t["run_id"], t["timer_id"])
            del self.model[(t["run_id"], t["timer_id"])]
        ov.write(None)

    @precondition(lambda self: self.model or self.store.next_due_ms is not None)
    @rule()
    def reopen(self) -> None:
        """A restart: the bound is recomputed from what is stored."""
        self.store.close()
        self.store = PartitionStore(self.root / "p0", 0)
        assert self.store.next_due_ms == (min(self.model.values()) if self.model else None)

    @invariant()
    def bound_is_never_late(self) -> None:
        if self.model:
            assert self.store.next_due_ms is not None
            assert self.store.next_due_ms <= min(self.model.values())
        assert self.store.pending_timers() == len(self.model)


def _tkey(fired: list[tuple[bytes, bytes]], timer: dict[str, object]) -> bytes:
    return next(k for k, v in fired if orjson.loads(v) == timer)


TestTimerIndex = TimerIndex.TestCase
TestTimerIndex.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _commit_cost(store: PartitionStore, first: int, n: int) -> float:
    """Seconds per transaction of one-step runs, one at a time: a start arms the run's lease
    (due in 30 s), its receipt clears it (no other lease is live in between)."""
    t0 = time.perf_counter()
    for i in range(first, first + n):
        ov = PartitionOverlay(store)
        body, raw = _timer(f"run{i}", "lease", 1_000_000 + i * 5 + 30_000)
        ov.set_timer(f"run{i}", body, raw)
        ov.write(None)
        ov = PartitionOverlay(store)
        ov.clear_timer(f"run{i}", "lease")
        ov.write(None)
    return (time.perf_counter() - t0) / (2 * n)


def test_clearing_timers_costs_a_commit_nothing_more_after_many_runs_finished(tmp_path: Path) -> None:
    """Every run arms a wall-time timer 7 days ahead and clears it when it finishes; the
    lease timers of its steps are due in 30 s. The cleared wall-time timers' tombstones lie
    between the lease timers and the live wall-time timers: re-seeking the timer index from
    the bound after each clear walked all of them, on every commit (O(runs finished since
    RocksDB last compacted them): 81 -> 260 us per commit within 2,500 commits of a live
    processor at 190 runs/s). A commit that clears timers must cost the same after 20,000
    finished runs as after none."""
    store = PartitionStore(tmp_path / "p0", 0)
    week = 7 * 24 * 3600 * 1000
    live = PartitionOverlay(store)
    body, raw = _timer("still-running", "wall", 1_000_000 + week + 10**9)
    live.set_timer("still-running", body, raw)
    live.write(None)
    before = min(_commit_cost(store, 1 + 100 * k, 100) for k in range(5))
    for start in range(0, 20_000, 500):  # 20,000 runs finish: their wall timers are cleared
        ov = PartitionOverlay(store)
        for i in range(start, start + 500):
            body, raw = _timer(f"done{i}", "wall", 1_000_000 + week + i)
            ov.set_timer(f"done{i}", body, raw)
        ov.write(None)
        ov = PartitionOverlay(store)
        for i in range(start, start + 500):
            ov.clear_timer(f"done{i}", "wall")
        ov.write(None)
    after = min(_commit_cost(store, 10_000 + 100 * k, 100) for k in range(5))
    store.close()
    # min of 5 batches of 100 commits each: the host's noise moves both sides, not 4x
    assert after < 4 * before, (
        f"{after * 1e6:.0f} us per commit after 20,000 cleared timers, {before * 1e6:.0f} before"
    )


# ---- a kill -9 takes back nothing the store wrote ---------------------------------------------

_CRASH_TRANSACTIONS = 20


def _transaction(store: PartitionStore, k: int) -> None:
    """Transaction k of a partition: a state, an event, a timer armed (and one cleared), a
    counter, and the run-events offset k, as the loop writes them after a commit."""
    ov = PartitionOverlay(store)
    run = f"r{k % 5}"
    state = {"run_id": run, "sequence": k}
    ov.put_state(run, state, orjson.dumps(state), k)
    ov.add_event(run, k, f"event {k}".encode())
    body, raw = _timer(run, f"t{k % 3}", 1_000 + k)
    ov.set_timer(run, body, raw)
    if k % 4 == 0:
        ov.clear_timer(run, f"t{(k + 1) % 3}")
    ov.count("inputs")
    ov.write(applied_offset=k)


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from processors.runtime.store import PartitionStore
from tests.unit.test_runtime_store import _CRASH_TRANSACTIONS, _transaction

store = PartitionStore(Path(sys.argv[1]), 0)
for k in range(1, _CRASH_TRANSACTIONS + 1):
    _transaction(store, k)
os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush: what a kill -9 leaves
"""


def test_a_store_killed_after_its_writes_reopens_with_all_of_them(tmp_path: Path) -> None:
    """Purges write the store with no run-events offset (their only Kafka output is run-state
    tombstones, which restore never reads): a store that lost a committed write would bring
    purged runs back. RocksDB's write-ahead log keeps every write across a kill -9 (a store
    without it reopened empty here). Compared key by key with a store that was closed."""
    killed = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(killed)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    reference = PartitionStore(tmp_path / "reference", 0)
    for k in range(1, _CRASH_TRANSACTIONS + 1):
        _transaction(reference, k)
    expected = dict(reference.db.items())
    reference.close()
    reopened = PartitionStore(killed, 0)
    try:
        assert reopened.applied_offset == _CRASH_TRANSACTIONS
        assert dict(reopened.db.items()) == expected
    finally:
        reopened.close()


# ---- a purge whose commit was never written to the store is redone before input ---------------


def _finished_run(store: PartitionStore, run_id: str, finished_ms: int, purge_ms: int) -> None:
    ov = PartitionOverlay(store)
    state = {"run_id": run_id, "sequence": 3, "status": "failed", "updated_ms": finished_ms}
    ov.put_state(run_id, state, orjson.dumps(state), finished_ms)
    ov.add_event(run_id, 3, b"RunFailed")
    ov.count("status.failed")
    ov.purge_at(run_id, purge_ms, "failed", finished_ms)
    ov.write(applied_offset=7)


def test_a_purge_page_recorded_but_never_written_is_redone_and_owes_its_tombstones(tmp_path: Path) -> None:
    """A purge writes no run event: a crash between its commit and its store write leaves the
    run in the store, and restore (run events only) cannot redo it, so a ResumeRun folded
    before the next pass would resume a purged run. The page is recorded before its
    transaction; a store restored with the record still there purges it before its inputs
    resume, and owes the run-state tombstones (whether its commit happened is unknown)."""
    store = PartitionStore(tmp_path / "p0", 0)
    _finished_run(store, "gone", 1_000, 2_000)
    _finished_run(store, "other", 1_000, 9_000)  # not due: untouched
    page = store.due_purges(5_000)
    assert [(run_id, status) for _, run_id, status in page] == [("gone", "failed")]
    store.mark_purging(page)
    store.close()  # the commit happened, its store write did not (the marker is in the WAL)
    store = PartitionStore(tmp_path / "p0", 0)
    assert store.state_bytes("gone") is not None  # nothing before the partition is restored
    assert store.redo_interrupted_purge() == 1  # runfold_processor_runs_purged_total counts it
    assert store.state_bytes("gone") is None and store.events("gone") == []
    assert store.purged_status("gone") == "failed"  # its id is not reused
    assert store.stats["status.failed"] == 1 and store.state_bytes("other") is not None
    assert store.owed_tombstones == ["gone"]
    assert store.due_purges(5_000) == []
    store.close()
    store = PartitionStore(tmp_path / "p0", 0)
    assert store.owed_tombstones == ["gone"]  # owed until a pass commits them
    assert store.redo_interrupted_purge() == 0  # nothing recorded any more: nothing happens
    assert store.stats["status.failed"] == 1
    ov = PartitionOverlay(store)
    ov.owed_paid = True
    ov.write(None)
    assert store.owed_tombstones == []
    store.close()
    assert PartitionStore(tmp_path / "p0", 0).owed_tombstones == []


def test_a_recorded_purge_page_leaves_a_run_resumed_since(tmp_path: Path) -> None:
    """The record outlives a pass that failed; a later commit resumed one of its runs (its
    purge entry gone, its state running): redoing the page must leave that run alone."""
    store = PartitionStore(tmp_path / "p0", 0)
    _finished_run(store, "back", 1_000, 2_000)
    store.mark_purging(store.due_purges(5_000))
    ov = PartitionOverlay(store)  # the resume, committed after the failed pass
    state = {"run_id": "back", "sequence": 4, "status": "running", "updated_ms": 3_000}
    ov.put_state("back", state, orjson.dumps(state), 3_000)
    ov.unpurge_at("back", 2_000)
    ov.write(applied_offset=8)
    assert store.redo_interrupted_purge() == 0
    assert orjson.loads(store.state_bytes("back") or b"null")["status"] == "running"
    assert store.purged_status("back") is None and store.owed_tombstones == []
    store.redo_interrupted_purge()
    store.close()


def test_with_retention_off_a_recorded_purge_page_keeps_its_runs(tmp_path: Path) -> None:
    """0 keeps finished runs forever, and no pass would send the tombstones a redo owes: a
    processor restarted with retention off keeps the page's runs and forgets the record."""
    store = PartitionStore(tmp_path / "p0", 0)
    _finished_run(store, "kept", 1_000, 2_000)
    store.mark_purging(store.due_purges(5_000))
    store.redo_interrupted_purge(retention_on=False)
    assert store.state_bytes("kept") is not None and store.owed_tombstones == []
    store.redo_interrupted_purge()  # the record is gone: nothing happens
    assert store.state_bytes("kept") is not None and store.purged_status("kept") is None
    store.close()


def test_a_redo_whose_write_fails_owes_nothing_and_keeps_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redo's write raising (a full disk): the run is still stored, so no tombstone may be
    owed for it (a pass would delete a live snapshot from the compacted run-state topic), and the
    record stays for the next start to redo."""
    store = PartitionStore(tmp_path / "p0", 0)
    _finished_run(store, "gone", 1_000, 2_000)
    store.mark_purging(store.due_purges(5_000))

    def full_disk(*_: object, **__: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(store, "apply", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.redo_interrupted_purge()
    assert store.owed_tombstones == [] and store.state_bytes("gone") is not None
    monkeypatch.undo()
    store.redo_interrupted_purge()
    assert store.owed_tombstones == ["gone"] and store.state_bytes("gone") is None
    store.close()
