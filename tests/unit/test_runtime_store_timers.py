"""The processor store's timer index against a model (hypothesis, stateful), and what clearing
timers costs a commit once many have been cleared (no broker)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, timer_ref_key
from processors.runtime.timers import TimerFirer

RUNS = ("a", "b", "c")
TIMERS = ("lease", "wall", "sleep")
DUE = st.integers(min_value=0, max_value=2_000)


def _body(run_id: str, timer_id: str, due: int) -> tuple[dict[str, object], bytes]:
    body = {
        "type": "TimerFired",
        "timer_id": timer_id,
        "timer_kind": "sleep",
        "due_ms": due,
        "run_id": run_id,
    }
    return body, orjson.dumps(body)


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
                body, raw = _body(run_id, timer_id, self.now + due)
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
        body, raw = _body(f"run{i}", "lease", 1_000_000 + i * 5 + 30_000)
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
    body, raw = _body("still-running", "wall", 1_000_000 + week + 10**9)
    live.set_timer("still-running", body, raw)
    live.write(None)
    before = min(_commit_cost(store, 1 + 100 * k, 100) for k in range(5))
    for start in range(0, 20_000, 500):  # 20,000 runs finish: their wall timers are cleared
        ov = PartitionOverlay(store)
        for i in range(start, start + 500):
            body, raw = _body(f"done{i}", "wall", 1_000_000 + week + i)
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
