"""A store restored from run-state equals one restored from the log, over generated histories.

A hypothesis state machine drives the runtime's fold (fold_rig: Folder + overlay + RocksDB, no
broker) through starts, receipts (completions, retryable failures), timers that fire and come
back, cancels, resumes and purges (the pass's, with its run-state marker). At the end, stores
are restored both ways: from the whole log (`Folder.fold_committed` of every event), and from
run-state (each run's last record, then the events from an E0 the machine picks: every event
from E0 on is folded or skipped as already in its run's snapshot), also with crashes at the
restore's steps (before the seed batch is written: the store is still new and is seeded again;
after a chunk of run-events: the restore goes on from the store's applied offset).

Equal means: for every run the store still holds (not purged), the same state, timers (id, due,
body) and purge entry; the same runs-per-status counts; and the purged ids, which the log does
not hold, are those the live store purged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
from fold_rig import CODEC, RETENTION, TOPICS, TS, Rig, completed, restore, restore_from_state
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule
from test_runtime_restore_equivalence import begin, failed, resume
from test_runtime_restore_equivalence import rig as make_rig

from processors.engine import load_state, run_status
from processors.runtime.metrics import ProcessorMetrics
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore
from processors.runtime.timers import TimerFirer

DEFINITIONS = ("one", "retry", "state-only", "mapfail")
_METRICS = ProcessorMetrics()


def _table(store: PartitionStore) -> dict[str, Any]:
    """Runs (state, timers, purge entries) and purged ids of a store, by run."""
    runs: dict[str, dict[str, Any]] = {}
    purged: dict[str, str] = {}

    def run(run_id: str) -> dict[str, Any]:
        return runs.setdefault(run_id, {"state": None, "timers": {}, "purges": []})

    it = store.db.iter()
    it.seek_to_first()
    while it.valid():
        key, value = it.key(), it.value()
        kind = key[:1]
        if kind == b"s":
            run(key[1:].decode())["state"] = orjson.loads(value)
        elif kind == b"t":
            body = orjson.loads(value)
            run(body["run_id"])["timers"][body["timer_id"]] = (int.from_bytes(key[1:9], "big"), value)
        elif kind == b"x":
            run(key[9:].decode())["purges"].append((int.from_bytes(key[1:9], "big"), value))
        elif kind == b"g":
            purged[key[1:].decode()] = value.decode()
        it.next()
    return {"runs": runs, "purged": purged}


class RestoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="restore-gen-"))
        self.rig: Rig = make_rig(self.dir / "live")
        self.now = TS
        self.rig.folder._now_ms = lambda: self.now
        self.runs: list[str] = []
        self.n = 0

    def _tx(self, *inputs: tuple[str, dict[str, Any]]) -> None:
        self.rig.transaction(*inputs)

    def _act(self, run_id: str) -> dict[str, Any] | None:
        try:
            return self.rig.activation(run_id)
        except IndexError:
            return None

    @rule(definition=st.sampled_from(DEFINITIONS), again=st.booleans())
    def start(self, definition: str, again: bool) -> None:
        if again and self.runs:  # a StartRun of an id already used (or purged)
            run_id = self.runs[0]
        else:
            run_id = f"r{self.n}"
            self.n += 1
            self.runs.append(run_id)
        kind, msg = begin(run_id, definition)
        self._tx((kind, {**msg, "ts_ms": self.now}))

    @precondition(lambda self: self.runs)
    @rule(i=st.integers(0, 50), ok=st.booleans(), advance=st.integers(1, 5_000))
    def answer(self, i: int, ok: bool, advance: int) -> None:
        act = self._act(self.runs[i % len(self.runs)])
        if act is None:
            return
        self.now += advance
        self._tx(completed(act, self.now) if ok else failed(act, self.now))

    @precondition(lambda self: self.runs)
    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        run_id = self.runs[i % len(self.runs)]
        self._tx(
            (
                "commands",
                {
                    "type": "CancelRun",
                    "run_id": run_id,
                    "ts_ms": self.now,
                    "record_id": f"x{self.now}",
                    "reason": "t",
                },
            )
        )

    @precondition(lambda self: self.runs)
    @rule(i=st.integers(0, 50))
    def resume(self, i: int) -> None:
        self._tx(resume(self.runs[i % len(self.runs)], self.now))

    @rule(advance=st.sampled_from([1_000, 30_000, 3_600_000]))
    def fire_timers(self, advance: int) -> None:
        """Time passes: due timers fire (cleared in their own transaction) and come back."""
        self.now += advance
        fired: list[bytes] = []
        firer = TimerFirer(CODEC, TOPICS.receipts, lambda t, v, k, **kw: fired.append(v), _METRICS, 100)
        ov = PartitionOverlay(self.rig.store)
        firer.fire_due(self.rig.store, ov, self.now)
        ov.write(None)
        for raw in fired:
            self._tx(("receipts", CODEC.decode("receipts", raw)))

    @rule()
    def purge_pass(self) -> None:
        """The retention ends: a purge pass, with each purged run's run-state marker."""
        self.now += RETENTION + 1
        store = self.rig.store
        due = store.due_purges(self.now)
        ov = PartitionOverlay(store)
        for xkey, run_id, status in due:
            if status is not None:
                self.rig._produce(
                    TOPICS.run_state, self.rig.folder.purged_marker(run_id, status), run_id.encode()
                )
            ov.purge(xkey, run_id, status)
        ov.write(None)

    def teardown(self) -> None:
        try:
            self.check()
        finally:
            self.rig.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def check(self) -> None:
        live = _table(self.rig.store)
        from_log = restore(self.rig, self.dir / "log")
        expected = _table(from_log)
        from_log.close()
        purged = set(live["purged"])
        # the log has no purge: its runs come back there; run-state has their markers
        expected_runs = {r: v for r, v in expected["runs"].items() if r not in purged}
        events = self.rig.events()
        n = len(events)
        for e0, crash in ((n, None), (0, None), (n // 2, "after-chunk"), (n // 3, "before-seed")):
            path = self.dir / f"state-{e0}-{crash}"
            store = restore_from_state(self.rig, path, e0, crash)
            assert store.events_from == e0
            got = _table(store)
            counts = {k: v for k, v in store.stats.items() if k.startswith("status.") and v}
            store.close()
            assert got["runs"] == expected_runs, f"E0={e0} crash={crash}"
            assert got["purged"] == live["purged"], f"E0={e0} crash={crash}"
            assert counts == _counts(expected_runs), f"E0={e0} crash={crash}"


def _counts(runs: dict[str, dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in runs.values():
        if v["state"] is not None:
            key = "status." + run_status(load_state(orjson.dumps(v["state"])))
            out[key] = out.get(key, 0) + 1
    return out


RestoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RUNFOLD_RESTORE_EXAMPLES", "12")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_restored_from_run_state_equals_restored_from_the_log = RestoreMachine.TestCase
