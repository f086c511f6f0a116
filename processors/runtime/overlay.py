"""The write overlay: one open transaction's changes to one partition's store.

Records of the same run can arrive several times in one batch; each sees the
state the previous one left in the overlay. Nothing here touches RocksDB until
`to_batch` is called after the Kafka transaction committed; an abort simply
drops the overlay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rocksdict import WriteBatch

from processors.runtime.store import (
    LOST_STATUS,
    ChangeSet,
    PartitionStore,
    event_prefix,
    purge_key,
    purged_key,
    state_key,
    timer_key,
    timer_ref_key,
)

RunState = dict[str, Any]


@dataclass(slots=True)
class Outcome:
    """What one input record does to its run, computed (and encoded) before anything is
    produced (runtime/fold.py): the state before and after, the last event's ts_ms, each
    event's (sequence, Avro bytes), each message's (topic, bytes), timer id -> its (body,
    JSON) to arm or None to clear (in event order: a timer armed then cleared ends cleared,
    as restore folds it), and the state's dump_state bytes (None: the run has no state)."""

    before: RunState | None
    state: RunState | None
    ts_ms: int
    events: list[tuple[int, bytes]]
    messages: list[tuple[str, bytes]]
    timers: dict[str, tuple[dict[str, Any], bytes] | None]
    raw: bytes | None


class PartitionOverlay:
    __slots__ = (
        "absent",
        "dumped",
        "event_ts",
        "events",
        "lost",
        "marked",
        "min_new_due",
        "owed_paid",
        "purged",
        "purged_here",
        "purges",
        "states",
        "stats",
        "store",
        "timer_dels",
        "timer_puts",
        "unpurges",
    )

    def __init__(self, store: PartitionStore) -> None:
        self.store = store
        self.states: dict[str, RunState | None] = {}
        # Runs the store has no state for: a new run's state is read twice (the purged-id
        # check, then the decision), and the store does not change until this overlay is written.
        self.absent: set[str] = set()
        self.event_ts: dict[str, int] = {}  # run_id -> ts_ms of its last event in this transaction
        self.dumped: dict[str, bytes] = {}  # run_id -> dump_state bytes, filled at commit time
        self.events: list[tuple[bytes, bytes]] = []  # (event key, Avro bytes)
        self.timer_puts: dict[bytes, tuple[bytes, bytes]] = {}  # ref key -> (t-key, body)
        self.timer_dels: dict[bytes, bytes] = {}  # ref key -> stored t-key to delete
        self.min_new_due: int | None = None
        self.purges: list[
            tuple[int, str, str, int]
        ] = []  # (purge_ms, run_id, status, finished_ms) of runs finished here
        self.purged: list[tuple[bytes, str, str | None]] = []  # (x-key, run_id, status) of runs purged here
        # run_id -> status of the runs an input found past their retention (purge_overdue)
        self.purged_here: dict[str, str] = {}
        self.unpurges: list[bytes] = []  # x-keys of finished runs resumed here
        self.owed_paid = False  # the store's owed run-state tombstones are in this transaction
        self.lost: set[str] = set()  # runs whose beginning the log no longer holds: their ids stay taken
        self.marked: dict[
            str, str
        ] = {}  # run_id -> final status of purged runs a restore read from run-state
        self.stats: dict[str, int] = {}

    # ---- run states ------------------------------------------------------------------------
    def state(self, run_id: str, load: Any) -> RunState | None:
        """The run's latest state: this transaction's, else the committed one."""
        if run_id in self.states:
            return self.states[run_id]
        cache = self.store.cache
        state = cache.get(run_id)
        if state is None and run_id not in self.absent:
            raw = self.store.state_bytes(run_id)
            if raw is None:
                self.absent.add(run_id)
            else:
                state = load(raw)
                cache[run_id] = state
        return state

    def add_event(self, run_id: str, sequence: int, value: bytes) -> None:
        self.add_events(run_id, [(sequence, value)])

    def add_events(self, run_id: str, events: list[tuple[int, bytes]]) -> None:
        """One record's (sequence, value) events for the run's log, keyed as `event_key`
        (its prefix computed once)."""
        prefix = None  # not made for a RunRejected alone: its run id may not fit a key
        append = self.events.append
        for sequence, value in events:
            if sequence > 0:  # a RunRejected (sequence 0) belongs to no run's log
                if prefix is None:
                    prefix = event_prefix(run_id)
                append((prefix + sequence.to_bytes(8, "big"), value))

    def apply(self, run_id: str, outcome: Outcome) -> None:
        """A record's outcome for its run: the events for its log, its timers, its state."""
        self.add_events(run_id, outcome.events)
        for tid, timer in outcome.timers.items():
            if timer is None:
                self.clear_timer(run_id, tid)
            else:
                self.set_timer(run_id, *timer)
        self.put_state(run_id, outcome.state, outcome.raw, outcome.ts_ms)

    def put_state(self, run_id: str, state: RunState | None, raw: bytes | None, ts_ms: int | None) -> None:
        """The run's new state (None: it has none, only once it had one here), with its
        dump_state bytes when known (a restore serializes at the end, `Folder.dump_all`) and
        its last event's time."""
        if state is None and run_id not in self.states:
            return
        self.states[run_id] = state
        if ts_ms is not None:
            self.event_ts[run_id] = ts_ms
        if raw is not None:
            self.dumped[run_id] = raw
        else:
            self.dumped.pop(run_id, None)

    # ---- timers ----------------------------------------------------------------------------
    def _stored_tkey(self, rkey: bytes) -> bytes | None:
        if rkey in self.timer_dels:
            return self.timer_dels[rkey]
        return self.store.timer_ref(rkey)

    def set_timer(self, run_id: str, body: dict[str, Any], encoded: bytes) -> None:
        due = int(body["due_ms"])
        timer_id = str(body["timer_id"])
        rkey = timer_ref_key(run_id, timer_id)
        tkey = timer_key(due, run_id, timer_id)
        # A run the store has no state for has no stored timers either (its timers are only
        # ever written with its state, and purged with it): a new run's timer needs no read.
        stored = None if run_id in self.absent else self._stored_tkey(rkey)
        if stored is not None and stored != tkey:
            self.timer_dels[rkey] = stored
        self.timer_puts[rkey] = (tkey, encoded)
        if self.min_new_due is None or due < self.min_new_due:
            self.min_new_due = due

    def clear_timer(self, run_id: str, timer_id: str) -> None:
        rkey = timer_ref_key(run_id, timer_id)
        self.timer_puts.pop(rkey, None)
        stored = self._stored_tkey(rkey)
        if stored is not None:
            self.timer_dels[rkey] = stored

    def clear_fired_timer(self, run_id: str, timer_id: str, due_ms: int) -> None:
        """A TimerFired came back as input: that firing of the timer is done (no refire), but
        a timer re-armed under the same id since (a lease extended by a heartbeat that was
        folded first) is another firing and stays."""
        rkey = timer_ref_key(run_id, timer_id)
        put = self.timer_puts.get(rkey)
        if (put[0] if put is not None else self._stored_tkey(rkey)) == timer_key(due_ms, run_id, timer_id):
            self.clear_timer(run_id, timer_id)

    def timer_pending(self, rkey: bytes, tkey: bytes) -> bool:
        """False when a stored timer was cleared or fired in this transaction."""
        put = self.timer_puts.get(rkey)
        if put is not None:
            return put[0] == tkey
        return self.timer_dels.get(rkey) != tkey

    def purge_at(self, run_id: str, purge_ms: int, status: str, finished_ms: int) -> None:
        self.purges.append((purge_ms, run_id, status, finished_ms))

    def unpurge_at(self, run_id: str, purge_ms: int) -> None:
        """The run left the finished set (a resume): its pending purge is off."""
        for i, (ms, rid, _, _) in enumerate(self.purges):
            if ms == purge_ms and rid == run_id:
                del self.purges[i]
                return
        self.unpurges.append(purge_key(purge_ms, run_id))

    def purge(self, xkey: bytes, run_id: str, status: str | None) -> None:
        """Remove a finished run whose retention ended (store.due_purges) at this commit;
        status None: the run is not finished now (a stale purge entry), only the entry goes."""
        self.purged.append((xkey, run_id, status))
        if status is not None:
            self.count(f"status.{status}", -1)

    def purge_overdue(self, run_id: str, status: str, purge_ms: int) -> None:
        """Purge a finished run whose retention ended, found by an input before a purge pass
        did: at this commit, as a pass would (Folder.purge_overdue); for the rest of this
        transaction it has no state and its id reads as purged."""
        self.purge(purge_key(purge_ms, run_id), run_id, status)
        self.states[run_id] = None
        self.dumped.pop(run_id, None)
        self.purged_here[run_id] = status

    def purged_status(self, run_id: str) -> str | None:
        """The final status of a purged run (this transaction's purges included), or None."""
        status = self.purged_here.get(run_id)
        return status if status is not None else self.store.purged_status(run_id)

    def count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    # ---- commit ----------------------------------------------------------------------------
    def is_empty(self) -> bool:
        return not (
            self.states
            or self.events
            or self.timer_puts
            or self.timer_dels
            or self.stats
            or self.purges
            or self.purged
            or self.unpurges
            or self.owed_paid
            or self.lost
            or self.marked
        )

    def change_set(self) -> ChangeSet:
        """What the store applies once the transaction committed."""
        # what the batch leaves each timer reference pointing to (a put after a delete wins)
        refs: dict[bytes, bytes | None] = dict.fromkeys(self.timer_dels)
        for rkey, (tkey, _) in self.timer_puts.items():
            refs[rkey] = tkey
        return ChangeSet(
            batch=self.to_batch(),
            states={run_id: self.states[run_id] for run_id in self.dumped},
            stats=self.stats,
            purged=self.purged,
            owed_paid=self.owed_paid,
            timer_refs=refs,
            min_new_due=self.min_new_due,
            min_new_purge=min((p[0] for p in self.purges), default=None),
        )

    def to_batch(self) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        for rkey, tkey in self.timer_dels.items():
            batch.delete(tkey)
            batch.delete(rkey)
        for rkey, (tkey, body) in self.timer_puts.items():
            batch.put(tkey, body)
            batch.put(rkey, tkey)
        for key, value in self.events:
            batch.put(key, value)
        for run_id, raw in self.dumped.items():
            batch.put(state_key(run_id), raw)
        for xkey in self.unpurges:
            batch.delete(xkey)
        for purge_ms, run_id, status, finished_ms in self.purges:
            batch.put(purge_key(purge_ms, run_id), f"{status} {finished_ms}".encode())
        for run_id in self.lost:  # as a purged run's marker: a StartRun of the id is refused
            batch.put(purged_key(run_id), LOST_STATUS)
        for run_id, status in self.marked.items():
            batch.put(purged_key(run_id), status.encode())
        return batch

    def write(self, applied_offset: int | None) -> None:
        """Write this overlay to the store (only after the transaction committed)."""
        self.store.apply(self.change_set(), applied_offset)
