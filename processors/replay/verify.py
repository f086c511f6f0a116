"""`replay --verify`: fold `<p>.run-events` from the beginning and compare with the snapshots.

Every run's events are folded with the engine's `evolve` (the same pure function the
processor uses) into a fresh in-memory state. When the fold reaches the sequence of
the run's latest `<p>.run-state` snapshot, the digest of the folded state is compared
with the snapshot's `state_digest` (and with the digest of the snapshot's own state).

Race-free while the processor runs: snapshots are read first, then events. A snapshot
and the events it reflects are committed in one transaction, so the events read later
always reach the snapshot's sequence; the comparison is made at that sequence, not at
whatever the fold reached by the end.

Differences reported (one per run at most, the first found):
  digest_mismatch    folded state at the snapshot's sequence != snapshot.state_digest
  snapshot_corrupt   the snapshot's state does not hash to its own state_digest
  sequence_gap       a run's events are not 1, 2, 3, ... (a gap or a duplicate)
  events_missing     the snapshot's sequence is beyond the run's last event
  no_snapshot        a run has events but no snapshot
  status_mismatch    the snapshot's status is not the folded state's status
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING

from processors.client.reader import PartitionReader
from processors.engine import dump_state, evolve, run_status, state_digest
from processors.engine.vocabulary import TERMINAL_STATUSES
from schemas import Codec, DecodeError
from schemas.run_state import purged_status
from topology.catalog import topic_names
from topology.settings import KafkaSettings

Progress = Callable[[int, int], None]  # (records read so far, approximate total)


@dataclass(frozen=True)
class Difference:
    run_id: str
    kind: str
    expected_digest: str | None = None  # the snapshot's
    actual_digest: str | None = None  # the fold's
    snapshot_sequence: int | None = None
    folded_sequence: int | None = None
    detail: str = ""


@dataclass
class VerifyReport:
    runs: int = 0
    runs_checked: int = 0
    events: int = 0
    rejected: int = 0
    snapshots: int = 0
    purged: int = 0  # finished runs whose snapshot was tombstoned after their retention
    expired: int = 0  # finished runs whose beginning run-events retention deleted (not verifiable)
    undecodable: int = 0
    seconds: float = 0.0
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runs": self.runs,
            "runs_checked": self.runs_checked,
            "events": self.events,
            "rejected": self.rejected,
            "snapshots": self.snapshots,
            "purged": self.purged,
            "expired": self.expired,
            "undecodable": self.undecodable,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.events_per_s, 1),
            "differences": [asdict(d) for d in self.differences],
        }


@dataclass
class _Snap:
    sequence: int
    digest: str
    status: str
    own_digest: str
    partition: int = -1  # of <p>.run-state, the same as the run's <p>.run-events partition (same key)


def _end_total(reader: PartitionReader, topic: str) -> int:
    return sum(reader.end_offset(topic, p) for p in range(reader.partition_count(topic)))


def read_snapshots(
    reader: PartitionReader,
    codec: Codec,
    topic: str,
    report: VerifyReport,
    progress: Progress | None = None,
    deadline: float | None = None,
    tombstoned: set[str] | None = None,
) -> dict[str, _Snap]:
    """The latest snapshot per run; runs whose latest record is a tombstone (purged after
    their retention) go to `tombstoned`."""
    decode = codec.decoder("run_state")
    latest: dict[str, _Snap] = {}
    total = _end_total(reader, topic)
    n = 0
    parts = reader.partition_count(topic)
    for msg in reader.read({(topic, p): OFFSET_BEGINNING for p in range(parts)}, deadline=deadline):
        if msg is None:
            continue
        n += 1
        raw_key = msg.key()
        key = raw_key.decode() if raw_key is not None else None
        if msg.value() is None:
            if key is not None:
                latest.pop(key, None)
                if tombstoned is not None:
                    tombstoned.add(key)
            continue
        try:
            snap = decode(msg.value())
        except DecodeError:
            report.undecodable += 1
            continue
        if purged_status(snap) is not None:  # a purged run's marker: as its tombstone was
            latest.pop(snap["run_id"], None)
            if tombstoned is not None:
                tombstoned.add(snap["run_id"])
            continue
        own = hashlib.sha256(dump_state(snap["state"])).hexdigest() if isinstance(snap["state"], dict) else ""
        latest[snap["run_id"]] = _Snap(
            snap["sequence"], snap["state_digest"], snap["status"], own, msg.partition() or 0
        )
        if tombstoned is not None:
            tombstoned.discard(snap["run_id"])
        if progress is not None and n % 500 == 0:
            progress(n, total)
    report.snapshots = len(latest)
    return latest


def verify(
    settings: KafkaSettings,
    *,
    codec: Codec | None = None,
    timeout_s: float = 600.0,
    progress: Progress | None = None,
    snapshot_progress: Progress | None = None,
) -> VerifyReport:
    """Fold every committed run event and compare each run with its latest snapshot."""
    codec = codec or Codec.default()
    topics = topic_names(settings)
    report = VerifyReport()
    started = time.monotonic()
    deadline = started + timeout_s
    reader = PartitionReader(settings, timeout_s=30.0)
    try:
        tombstoned: set[str] = set()
        snaps = read_snapshots(
            reader, codec, topics.run_state, report, snapshot_progress, deadline, tombstoned
        )
        decode = codec.decoder("run_events")
        states: dict[str, Any] = {}
        last_seq: dict[str, int] = {}
        failed: set[str] = set()  # runs with a difference already: one report per run
        lost: dict[str, str] = {}  # runs whose RunAccepted the log no longer holds -> what was seen first
        checked: set[str] = set()
        topic = topics.run_events
        total = _end_total(reader, topic)
        n = 0

        def differ(run_id: str, kind: str, **kw: Any) -> None:
            failed.add(run_id)
            report.differences.append(Difference(run_id, kind, **kw))

        parts = reader.partition_count(topic)
        for msg in reader.read({(topic, p): OFFSET_BEGINNING for p in range(parts)}, deadline=deadline):
            if msg is None:
                continue
            n += 1
            if progress is not None and n % 1000 == 0:
                progress(n, total)
            try:
                ev = decode(msg.value())
            except DecodeError:
                report.undecodable += 1
                continue
            report.events += 1
            run_id, seq = ev["run_id"], ev["sequence"]
            if seq == 0:
                report.rejected += 1
            elif run_id not in states and ev["type"] != "RunAccepted":
                # The log starts after this run's RunAccepted: nothing of it can be folded. Whether
                # that matters depends on its snapshot (a finished run lost nothing): decided below.
                if run_id not in failed:
                    failed.add(run_id)
                    lost[run_id] = f"sequence {seq} ({ev['type']}, offset {msg.offset()})"
                last_seq[run_id] = seq
                continue
            elif run_id not in failed and seq != last_seq.get(run_id, 0) + 1:
                differ(
                    run_id,
                    "sequence_gap",
                    folded_sequence=last_seq.get(run_id, 0),
                    detail=f"event sequence {seq} follows {last_seq.get(run_id, 0)} (offset {msg.offset()})",
                )
            if seq:
                last_seq[run_id] = seq
            state = evolve(states.get(run_id), ev)
            if state is None:
                states.pop(run_id, None)
                continue
            states[run_id] = state
            snap = snaps.get(run_id)
            if snap is not None and snap.sequence == seq and run_id not in failed:
                checked.add(run_id)
                actual = state_digest(state)
                if snap.own_digest and snap.own_digest != snap.digest:
                    differ(
                        run_id,
                        "snapshot_corrupt",
                        expected_digest=snap.digest,
                        actual_digest=actual,
                        snapshot_sequence=snap.sequence,
                        folded_sequence=seq,
                        detail="the snapshot's state does not hash to its state_digest",
                    )
                elif actual != snap.digest:
                    differ(
                        run_id,
                        "digest_mismatch",
                        expected_digest=snap.digest,
                        actual_digest=actual,
                        snapshot_sequence=snap.sequence,
                        folded_sequence=seq,
                    )
                elif run_status(state) != snap.status:
                    differ(
                        run_id,
                        "status_mismatch",
                        expected_digest=snap.digest,
                        actual_digest=actual,
                        snapshot_sequence=snap.sequence,
                        folded_sequence=seq,
                        detail=f"snapshot says {snap.status}, fold says {run_status(state)}",
                    )
        if progress is not None:
            progress(n, max(total, n))
        # A run with a snapshot but no event left at all, on a partition whose beginning retention
        # deleted: its whole history is gone (not a missing event), judged like any lost run.
        starts = {p: reader.start_offset(topic, p) for p in range(parts)}
        for run_id, snap in snaps.items():
            if run_id not in last_seq and run_id not in states and starts.get(snap.partition, 0) > 0:
                failed.add(run_id)
                lost[run_id] = "none (retention deleted all its events)"
        for run_id, first in lost.items():
            snap = snaps.get(run_id)
            if snap is None or snap.status in TERMINAL_STATUSES:
                report.expired += 1  # finished (or purged) before its events expired: nothing lost
            else:
                differ(
                    run_id,
                    "beginning_not_in_log",
                    snapshot_sequence=snap.sequence,
                    folded_sequence=0,
                    detail=(
                        f"a {snap.status} run whose first event in the log is {first}: run-events retention "
                        "deleted its beginning, so it cannot be verified nor restored"
                    ),
                )
        for run_id, snap in snaps.items():
            if run_id in checked or run_id in failed:
                continue
            differ(
                run_id,
                "events_missing",
                expected_digest=snap.digest,
                snapshot_sequence=snap.sequence,
                folded_sequence=last_seq.get(run_id, 0),
                detail="the snapshot is beyond the run's last committed event",
            )
        # A run started after the snapshots were read has events but no snapshot in `snaps`: only
        # a run that still has none after a second read of run-state (its events were read before
        # it; they commit in one transaction) lacks one.
        unsnapped = [r for r in states if r not in snaps and r not in failed and r not in tombstoned]
        later: dict[str, _Snap] = {}
        if unsnapped:
            later = read_snapshots(reader, codec, topics.run_state, VerifyReport(), None, deadline)
        for run_id in states:
            if run_id not in snaps and run_id not in failed and run_id not in later:
                if run_id in tombstoned and run_status(states[run_id]) in TERMINAL_STATUSES:
                    report.purged += 1  # retention ended: the table forgot it, the events remain
                    continue
                differ(
                    run_id,
                    "no_snapshot",
                    actual_digest=state_digest(states[run_id]),
                    folded_sequence=last_seq.get(run_id, 0),
                    detail="events but no run-state snapshot",
                )
        report.runs = len(states)
        report.runs_checked = len(checked)
    finally:
        reader.close()
    report.seconds = time.monotonic() - started
    report.differences.sort(key=lambda d: d.run_id)
    return report
