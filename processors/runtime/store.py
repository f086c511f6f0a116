"""The local state of one input partition: a RocksDB database (rocksdict, raw mode).

One database per assigned partition, at `<state_dir>/<prefix>/<group>/p<N>`.
It only ever holds the fold of *committed* run events: the loop writes it after
the Kafka transaction commits, in one write batch that also records the offset
of the last run event it reflects (so restore knows where to catch up from).

Key layout (bytes; run ids are UTF-8, `\\x1f` separates variable parts):

    s<run_id>                               run state (engine `dump_state` bytes)
    e<len:2><run_id><sequence:8>            run event (the Avro bytes from <p>.run-events)
    t<due_ms:8><run_id>\\x1f<timer_id>       pending timer (TimerFired body, JSON)
    r<run_id>\\x1f<timer_id>                 reverse index: the timer's t-key (O(1) clear)
    x<purge_ms:8><run_id>                   a finished run (value: "<status> <finished_ms>"), purged after purge_ms
    g<run_id>                               a purged run (value: its status): its id is not reused
    m:offset                                last applied <p>.run-events offset (8 bytes)
    m:events_from                           seeded from run-state: events before this offset are not here
    m:stats                                 cumulative counters (JSON)
    m:purging                               the purge page in flight (JSON), until its commit is written
    m:owed                                  run ids whose run-state tombstones a redone purge owes (JSON)

Big-endian integers keep the t-keys ordered by due time, so due timers are a
prefix scan that stops at `now`.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import orjson
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, ReadOptions, WriteBatch

from processors.engine.vocabulary import TERMINAL_STATUSES

OFFSET_KEY = b"m:offset"
# A store seeded from run-state snapshots: the run-events offset E0 it folded events from. It
# holds no event of a run before E0 (runtime/history.py reads those from the topic).
EVENTS_FROM_KEY = b"m:events_from"
STATS_KEY = b"m:stats"
# A purge writes no run event, so restore cannot redo one whose commit was never written to
# the store (a crash between the two): its page is recorded before its transaction begins,
# and a store restored with the record still there purges the page itself
# (`redo_interrupted_purge`), owing the run-state tombstones to the next pass (`OWED_KEY`).
PURGING_KEY = b"m:purging"
OWED_KEY = b"m:owed"
NO_OFFSET = -1
PURGE_PAGE = 1_000  # finished runs a purge pass takes per partition (one transaction)
_SEP = b"\x1f"
# Decoded states kept per partition (default of the `state_cache_runs` setting). Only live
# runs are kept: a finished run gets at most a stray late receipt, and caching 100k finished
# runs cost ~500 MiB of Python objects (~5 KiB a state; a 3-step run's JSON is ~3.3 KB).
STATE_CACHE_RUNS = 5_000
# Timer references written recently, per partition: clearing or re-arming a timer needs the
# t-key it points to, and a RocksDB read of one costs ~10 us (most timers are cleared within
# a few transactions of being armed). ~240 bytes an entry (~5 MB per partition when full).
TIMER_REF_CACHE = 20_000
# RocksDB memory is bounded per process, not per partition: one LRU block cache shared by
# every store and small memtables (a store holds one partition's runs; writes are one batch
# per transaction, so large memtables buy nothing).
_BLOCK_CACHE = Cache(32 << 20)  # LRU
_WRITE_BUFFER_BYTES = 8 << 20


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(_BLOCK_CACHE)
    # Most point reads miss (a new run's state, timer reverse keys, purged-id markers): a
    # bloom filter answers those without reading data blocks.
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


@dataclass(slots=True)
class ChangeSet:
    """One committed transaction's changes to a partition's store (overlay.change_set).
    `batch` holds every key but the deletions of `purged` runs, which `apply` adds; `states`:
    the states it writes (for the store's cache); `timer_refs`: the timer references it puts
    (r-key -> t-key) or deletes (r-key -> None); `min_new_due`/`min_new_purge`: the earliest
    timer and purge it adds (a deleted timer leaves the due bound as it was: `apply`)."""

    batch: WriteBatch
    states: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    purged: list[tuple[bytes, str, str | None]] = field(default_factory=list)
    timer_refs: dict[bytes, bytes | None] = field(default_factory=dict)
    min_new_due: int | None = None
    min_new_purge: int | None = None
    owed_paid: bool = False  # the tombstones of `owed_tombstones` are in this transaction


def state_key(run_id: str) -> bytes:
    return b"s" + run_id.encode()


def event_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    return b"e" + len(raw).to_bytes(2, "big") + raw


def event_key(run_id: str, sequence: int) -> bytes:
    return event_prefix(run_id) + sequence.to_bytes(8, "big")


def timer_key(due_ms: int, run_id: str, timer_id: str) -> bytes:
    return b"t" + max(due_ms, 0).to_bytes(8, "big") + run_id.encode() + _SEP + timer_id.encode()


def timer_ref_key(run_id: str, timer_id: str) -> bytes:
    return b"r" + run_id.encode() + _SEP + timer_id.encode()


def purged_key(run_id: str) -> bytes:
    return b"g" + run_id.encode()


# A purged marker's value for a run a restore could not rebuild: the run-events log no longer
# held its RunAccepted (assignment.py). Its id stays taken like a purged run's.
LOST_STATUS = b"lost"


def purge_key(purge_ms: int, run_id: str) -> bytes:
    return b"x" + max(purge_ms, 0).to_bytes(8, "big") + run_id.encode()


def due_of(tkey: bytes) -> int:
    """The time in a t-key or an x-key."""
    return int.from_bytes(tkey[1:9], "big")


class PartitionStore:
    """Committed state of one partition. Reads are thread-safe (the query server reads
    from its own threads); `write` and `close` are called by the loop thread only."""

    def __init__(self, path: Path, partition: int, cache_runs: int = STATE_CACHE_RUNS) -> None:
        self.path = path
        self.partition = partition
        self.cache_runs = cache_runs
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db: Rdict | None = Rdict(str(path), _options())
        self._lock = threading.RLock()
        # Decoded committed states of recently written runs, oldest write first: saves
        # load_state per record. Engine states are never mutated in place, so sharing the
        # objects is safe.
        self.cache: dict[str, Any] = {}
        # r-key -> t-key (None: deleted) as the last writes left them, oldest first: exactly
        # what the database holds for these keys (only `write` changes either).
        self.timer_refs: dict[bytes, bytes | None] = {}
        raw = self._db.get(OFFSET_KEY)
        self.applied_offset: int = int.from_bytes(raw, "big", signed=True) if raw else NO_OFFSET
        events_from = self._db.get(EVENTS_FROM_KEY)
        self.events_from: int | None = int.from_bytes(events_from, "big") if events_from else None
        stats = self._db.get(STATS_KEY)
        self.stats: dict[str, int] = orjson.loads(stats) if stats else {}
        owed = self._db.get(OWED_KEY)
        self.owed_tombstones: list[str] = orjson.loads(owed) if owed else []
        # Lower bound of every stored timer's due time (None: no timers). Keeps the idle
        # "anything due?" check O(1) and lets scans seek past old tombstones.
        self.next_due_ms: int | None = self._first_due(0)
        self.next_purge_ms: int | None = self._first_due(0, b"x")

    @property
    def db(self) -> Rdict:
        if self._db is None:
            raise StoreClosed(f"store of partition {self.partition} is closed")
        return self._db

    # ---- reads -----------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            value: bytes | None = self.db.get(key)
            return value

    def timer_ref(self, rkey: bytes) -> bytes | None:
        """The t-key a timer reference (`timer_ref_key`) points to, None if there is no such
        timer: from memory when it was written recently (loop thread only)."""
        refs = self.timer_refs
        return refs[rkey] if rkey in refs else self.get(rkey)

    def state_bytes(self, run_id: str) -> bytes | None:
        return self.get(state_key(run_id))

    def purged_status(self, run_id: str) -> str | None:
        """The final status of a run purged after its retention, or None."""
        raw = self.get(purged_key(run_id))
        return raw.decode() if raw is not None else None

    def events(self, run_id: str, since: int = 0, limit: int = 10_000) -> list[bytes]:
        """Stored run-event bytes of `run_id` with sequence > since, in order."""
        prefix = event_prefix(run_id)
        out: list[bytes] = []
        with self._lock:
            it = self.db.iter()
            it.seek(prefix + (since + 1).to_bytes(8, "big"))
            while it.valid() and len(out) < limit:
                key = it.key()
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                out.append(it.value())
                it.next()
        return out

    def events_chunk(
        self, run_id: str, since: int, max_events: int, max_bytes: int
    ) -> list[tuple[int, bytes]]:
        """(sequence, bytes) of the stored events of `run_id` with sequence > since, in order: at
        most `max_events`, and none more once `max_bytes` are gathered (at least one). For
        readers on other threads (the query server), which page through a long log chunk by
        chunk: the lock the loop's `write` takes is held for one chunk only, and the iterator is
        dropped before it is released (a live iterator keeps the database open, and reopening
        the partition's store after a rebalance would then fail on its lock file)."""
        prefix = event_prefix(run_id)
        out: list[tuple[int, bytes]] = []
        size = 0
        with self._lock:
            it = self.db.iter()
            it.seek(prefix + (since + 1).to_bytes(8, "big"))
            while it.valid() and len(out) < max_events and (size < max_bytes or not out):
                key = it.key()
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                value = it.value()
                out.append((int.from_bytes(key[-8:], "big"), value))
                size += len(value)
                it.next()
            del it
        return out

    def due_timers(self, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to `limit` stored timers with due_ms <= now_ms, earliest first. Cost is
        proportional to the due timers (plus tombstones of recently fired ones)."""
        if self.next_due_ms is None or self.next_due_ms > now_ms:
            return []
        out: list[tuple[bytes, bytes]] = []
        with self._lock:
            it = self.db.iter()
            it.seek(b"t" + self.next_due_ms.to_bytes(8, "big"))
            while it.valid():
                key = it.key()
                if key[:1] != b"t":
                    break
                if due_of(key) > now_ms or len(out) >= limit:
                    break
                out.append((key, it.value()))
                it.next()
            if not out:  # the bound was stale (timers deleted meanwhile): move it to the truth
                self.next_due_ms = due_of(it.key()) if it.valid() and it.key()[:1] == b"t" else None
        return out

    def _first_due(self, from_ms: int, kind: bytes = b"t") -> int | None:
        with self._lock:
            it = self.db.iter()
            it.seek(kind + from_ms.to_bytes(8, "big"))
            if it.valid() and it.key()[:1] == kind:
                return due_of(it.key())
        return None

    def pending_timers(self) -> int:
        """Number of stored timers (a full scan: for tests and benchmarks, not the loop)."""
        count = 0
        with self._lock:
            it = self.db.iter()
            it.seek(b"t")
            while it.valid() and it.key()[:1] == b"t":
                count += 1
                it.next()
        return count

    # ---- writes (loop thread) --------------------------------------------------------------
    def due_purges(self, now_ms: int, limit: int = PURGE_PAGE) -> list[tuple[bytes, str, str | None]]:
        """Up to `limit` finished runs whose retention ended by `now_ms`, earliest first:
        (x-key, run_id, status now). The status is read from the run's state, not the entry:
        None when the run is not finished now (resumed since; an entry from before the
        resume removed it, e.g. under another retention setting), already gone, or purged by
        an earlier entry of the same page."""
        if self.next_purge_ms is None or self.next_purge_ms > now_ms:
            return []
        due: list[tuple[bytes, str, str | None]] = []
        seen: set[str] = set()
        with self._lock:
            it = self.db.iter()
            it.seek(b"x" + self.next_purge_ms.to_bytes(8, "big"))
            while it.valid() and len(due) < limit:
                key = it.key()
                if key[:1] != b"x" or due_of(key) > now_ms:
                    break
                run_id = key[9:].decode()
                # a run purged by an earlier entry of the page: its later entries only go; a
                # stale earlier entry purged nothing, so the run's own entry still counts
                status = self._purge_status(run_id, it.value()) if run_id not in seen else None
                if status is not None:
                    seen.add(run_id)
                due.append((key, run_id, status))
                it.next()
        if not due:
            self.next_purge_ms = self._first_due(now_ms + 1, b"x")
        return due

    def _purge_status(self, run_id: str, entry: bytes) -> str | None:
        """The status a purge of `run_id` by its x-entry (value `entry`) removes: the run's
        state's, if finished by that entry's finish; else None (a stale entry: only it goes)."""
        raw = self.db.get(state_key(run_id))
        state = orjson.loads(raw) if raw is not None else {}
        status = state.get("status")
        # "<status> <finished_ms>"; an entry from another finish (the run was resumed and
        # ended again, under another retention setting) is stale too
        finished = entry.partition(b" ")[2]
        if finished and int(finished) != state.get("updated_ms"):
            return None
        return status if status in TERMINAL_STATUSES else None

    def mark_purging(self, runs: list[tuple[bytes, str, str | None]]) -> None:
        """Record the page a purge pass is about to commit (before its transaction begins)."""
        with self._lock:
            self.db.put(PURGING_KEY, orjson.dumps([[xkey.hex(), run_id] for xkey, run_id, _ in runs]))

    def redo_interrupted_purge(self, retention_on: bool = True) -> int:
        """A purge page recorded and never written (a crash between its commit and its store
        write, or a pass that failed): its transaction may have committed (then no run of it
        may come back: a ResumeRun would resume it) or not (its runs were due anyway). Purge
        what is still due of it, as its commit would have, and owe their run-state tombstones
        to the next pass. Called once the partition is restored, before its inputs resume, so
        that a run resumed by a committed event since has no entry left and stays. With
        retention off now (0 keeps finished runs forever, and no pass would send the
        tombstones) the record only goes. Returns how many runs it purged (a process that
        stops between a pass's commit and its store write never counted them)."""
        purging = self.get(PURGING_KEY)
        if purging is None:
            return 0
        if not retention_on:
            with self._lock:
                self.db.delete(PURGING_KEY)
            return 0
        runs: list[tuple[bytes, str, str | None]] = []
        for xhex, run_id in orjson.loads(purging):
            xkey = bytes.fromhex(xhex)
            entry = self.get(xkey)
            if entry is not None:
                runs.append((xkey, run_id, self._purge_status(run_id, entry)))
        stats: dict[str, int] = {}
        owed = list(self.owed_tombstones)
        for _, run_id, status in runs:
            if status is not None:
                stats[f"status.{status}"] = stats.get(f"status.{status}", 0) - 1
                owed.append(run_id)
        batch = WriteBatch(raw_mode=True)
        batch.put(OWED_KEY, orjson.dumps(owed))
        batch.delete(PURGING_KEY)  # also when nothing of it is due any more
        self.apply(ChangeSet(batch=batch, stats=stats, purged=runs), None)
        # only once written: a failed write must not leave tombstones owed for runs still stored
        self.owed_tombstones = owed
        return sum(1 for _, _, status in runs if status is not None)

    def _cache_states(self, states: dict[str, Any]) -> None:
        """Keep the states just written, most recent last; past `cache_runs`, drop the least
        recently written (a tenth more than the excess, so eviction is not paid every write).
        Runs that wait long (signals, sleeps, slow tools) leave; the runs in motion stay."""
        cache = self.cache
        for run_id, state in states.items():
            cache.pop(run_id, None)  # re-inserted below: insertion order is write order
            if state is not None and state.get("status") not in TERMINAL_STATUSES:  # the engine state's field
                cache[run_id] = state
        _drop_oldest(cache, self.cache_runs)

    def _purge_into(self, batch: WriteBatch, purged: list[tuple[bytes, str, str | None]]) -> None:
        """Delete purged runs (state, event log, leftover timers), keeping a marker of each id;
        of a stale entry (status None) only the entry. Point deletes only, never
        `delete_range`: RocksDB rebuilds the list of range tombstones on every iterator it
        creates until compaction drops them, so one per purged run made each later scan
        slower (a page of 1,000 runs took 2-10 s; the next pages slower still)."""
        for xkey, run_id, status in purged:
            if status is None:
                batch.delete(xkey)
                continue
            prefix = event_prefix(run_id)
            for key in self._scan(prefix, prefix + b"\xff" * 9, values=False):
                batch.delete(key)
            ref = b"r" + run_id.encode() + _SEP
            for rkey, tkey in self._scan(ref, ref[:-1] + bytes([_SEP[0] + 1])):
                batch.delete(tkey)
                batch.delete(rkey)
                self.timer_refs[rkey] = None
            batch.delete(state_key(run_id))
            batch.delete(xkey)
            batch.put(purged_key(run_id), status.encode())

    @overload
    def _scan(self, lower: bytes, upper: bytes) -> list[tuple[bytes, bytes]]: ...
    @overload
    def _scan(self, lower: bytes, upper: bytes, values: Literal[False]) -> list[bytes]: ...

    def _scan(self, lower: bytes, upper: bytes, values: bool = True) -> list[Any]:
        """Every (key, value) with lower <= key < upper, or only the keys. The bound stops the
        iterator at `upper`: a run with no such keys costs one seek, not a walk over the
        tombstones of the runs after it."""
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(upper)
        out: list[Any] = []
        with self._lock:
            it = self.db.iter(bounds)
            it.seek(lower)
            while it.valid():
                out.append((it.key(), it.value()) if values else it.key())
                it.next()
        return out

    def apply(self, changes: ChangeSet, applied_offset: int | None) -> None:
        """Apply one committed transaction's changes, with the last run-events offset they
        reflect (None: no run event of this partition in them)."""
        batch, states, stats, purged = changes.batch, changes.states, changes.stats, changes.purged
        timer_refs, min_new_due, min_new_purge = (
            changes.timer_refs,
            changes.min_new_due,
            changes.min_new_purge,
        )
        refs = self.timer_refs
        try:
            if timer_refs:
                for rkey, tkey in timer_refs.items():
                    refs.pop(rkey, None)  # re-inserted: insertion order is write order
                    refs[rkey] = tkey
            if purged:
                self._purge_into(batch, purged)  # after: its deletions come last in the batch too
                batch.delete(PURGING_KEY)  # the page recorded before the transaction is done
            if changes.owed_paid:
                batch.delete(OWED_KEY)
            if applied_offset is not None and applied_offset > self.applied_offset:
                batch.put(OFFSET_KEY, applied_offset.to_bytes(8, "big", signed=True))
                self.applied_offset = applied_offset
            if stats:
                for name, value in stats.items():
                    self.stats[name] = self.stats.get(name, 0) + value
                batch.put(STATS_KEY, orjson.dumps(self.stats))
            with self._lock:
                self.db.write(batch)
        except BaseException:
            refs.clear()  # maybe not written: what they say may not be in the database
            raise
        _drop_oldest(refs, TIMER_REF_CACHE)
        self._cache_states(states)
        if changes.owed_paid:
            self.owed_tombstones = []
        # Cleared timers leave the bound as it was: a lower bound, which `due_timers` moves to
        # the first live timer once it passes. Re-seeking here after every clear walked the
        # tombstones between the bound and the next live timer on every commit, and those are
        # many: each run arms a wall-time timer days ahead and clears it when it finishes, so
        # a bound at a 30 s lease sat before every finished run's tombstone (a commit cost 19
        # -> 1,100 us after 20,000 runs; tests/unit/test_runtime_store.py). A purge
        # still re-seeks: it is paged and rare, and its runs' timers may hold the bound.
        if purged and self.next_due_ms is not None:
            self.next_due_ms = self._first_due(self.next_due_ms)
        if min_new_due is not None and (self.next_due_ms is None or min_new_due < self.next_due_ms):
            self.next_due_ms = min_new_due
        if purged:
            for _, run_id, status in purged:
                if status is not None:
                    self.cache.pop(run_id, None)
            self.next_purge_ms = self._first_due(due_of(purged[-1][0]), b"x")
        if min_new_purge is not None and (self.next_purge_ms is None or min_new_purge < self.next_purge_ms):
            self.next_purge_ms = min_new_purge

    def mark_seeded(self, events_from: int) -> None:
        """The store was seeded from run-state: it holds the events from `events_from` on."""
        with self._lock:
            self.db.put(EVENTS_FROM_KEY, events_from.to_bytes(8, "big"))
        self.events_from = events_from

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.flush()
                self._db.close()
                self._db = None
        self.cache.clear()
        self.timer_refs.clear()

    @property
    def closed(self) -> bool:
        return self._db is None

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


def _drop_oldest(entries: dict[Any, Any], keep: int) -> None:
    """Past `keep` entries, drop the first inserted (a tenth more than the excess, so that
    the eviction is not paid on every write)."""
    excess = len(entries) - keep
    if excess > 0:
        for key in list(itertools.islice(entries, excess + keep // 10)):
            del entries[key]


class StoreClosed(RuntimeError):
    """The partition's store was closed (partition revoked) while being read."""
