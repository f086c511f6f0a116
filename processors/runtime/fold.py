"""What happens when an input record arrives: decode, decide, evolve, effects, produce.

`Folder.fold_input` is the whole per-record path of the loop. A record is handled
atomically: every output is computed first (engine calls, encoding), and only then
produced and written into the overlay, so a record that fails half-way (bad bytes,
an engine bug) leaves nothing behind but its dead letter. `Folder.fold_committed`
is the restore path: the same evolve/effects over already-committed events, with
their timers, without producing anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from processors.engine import EngineContext, decide, dump_state, effects, evolve, load_state, run_status
from processors.engine.effects import NONE as NO_EFFECTS
from processors.engine.emitter import rejection
from processors.engine.ids import instance_key
from processors.engine.pending import timers_of
from processors.engine.state import state_from_json
from processors.engine.vocabulary import COMMANDS, TERMINAL_RECEIPTS, TERMINAL_STATUSES
from processors.kafka.partitioning import PartitionOwners
from processors.runtime import admission, deadletter
from processors.runtime.overlay import Outcome, PartitionOverlay
from processors.runtime.store import LOST_STATUS
from schemas import Codec, DecodeError, EncodeError
from schemas.codec import InvalidJsonField
from schemas.run_state import purged_marker, purged_status
from topology.catalog import TopicNames

Produce = Callable[..., None]
_ACTIVATIONS = frozenset({"ActionActivation", "CancelActivation"})
_CHILD = frozenset({"ChildRunActivation", "ChildRunCancel"})
_LONG_END = 1 << 63
_LOST = LOST_STATUS.decode()
_MAX_ID_BYTES = 0xFFFF  # a run id's bytes in the store's event keys (a 2-byte length)
_SAFE_ID_CHARS = _MAX_ID_BYTES // 4  # at most 4 UTF-8 bytes a character: shorter ids always fit


@dataclass
class TxnCounters:
    """Per-transaction counts, applied to the metrics once after commit."""

    records_in: dict[str, int] = field(default_factory=dict)
    records_out: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    purged: int = 0  # finished runs purged after their retention
    misrouted: dict[str, int] = field(default_factory=dict)  # forwarded to the owning partition
    retimed: dict[str, int] = field(default_factory=dict)  # receipts folded at their record timestamp

    def clear(self) -> None:
        for d in (
            self.records_in,
            self.records_out,
            self.dead,
            self.dropped,
            self.rejected,
            self.misrouted,
            self.retimed,
        ):
            d.clear()
        self.purged = 0


def _inc(d: dict[str, int], k: str, n: int = 1) -> None:
    d[k] = d.get(k, 0) + n


STATUS_STAT = "status."


def _count_status(overlay: PartitionOverlay, before: Any, after: Any, ts_ms: int, retention_ms: int) -> None:
    """Runs per status are store stats (written with the state, rebuilt by restore). A run
    that finishes gets its purge time, its last event's time + retention. A finished run that
    changes (a resume: even failed → running → failed within one record, which restore folds
    event by event) loses that purge time (its `updated_ms` + retention) for a new one when it
    is finished again, so live and restore keep the same single entry."""
    old = run_status(before) if before is not None else None
    new = run_status(after) if after is not None else None
    if old != new:
        if old is not None:
            overlay.count(STATUS_STAT + old, -1)
        if new is not None:
            overlay.count(STATUS_STAT + new)
    if retention_ms <= 0 or after is before:
        return
    if old in TERMINAL_STATUSES:
        overlay.unpurge_at(before["run_id"], before["updated_ms"] + retention_ms)
    if new in TERMINAL_STATUSES:
        overlay.purge_at(after["run_id"], ts_ms + retention_ms, new, after["updated_ms"])


# What a record that cannot be folded did wrong, by dead-letter reason: the run's failure code
# for a command (its RunRejected), for a terminal receipt (a non-retryable failure of the
# attempt) and for any other input (FailRun), and what the reason says happened.
_CAUSES: dict[str, tuple[str, str, str, str]] = {
    deadletter.OUTPUT_TOO_LARGE: (
        "Limit",
        "InvalidOutput",
        "Limit",
        "the outputs of this {what} are larger than the broker accepts ({error})",
    ),
    deadletter.UNSERIALIZABLE: (
        "Limit",
        "InvalidOutput",
        "Limit",
        "folding this {what} gives a value the processor "
        "cannot store ({error}: a JSON value nested too deeply or an integer beyond 64 bits)",
    ),
    deadletter.PROCESSING_ERROR: (
        "State",
        "State",
        "State",
        "the processor failed to fold this {what} ({error})",
    ),
}
_APPLIED = "; it is in the dead letters, its effects were not applied"


class Unserializable(Exception):
    """A value the run events' encoder or the state serializer refuses (orjson: nesting past
    254 levels, an integer beyond 64 bits; Avro: a long beyond 64 bits)."""


_ORJSON_REFUSALS = ("Recursion limit reached", "Integer exceeds 64-bit range")


def _refused_value(e: Exception) -> bool:
    return isinstance(e, (TypeError, EncodeError)) and any(text in str(e) for text in _ORJSON_REFUSALS)


def _instead(msg: dict[str, Any], cause: str, error: str) -> dict[str, Any]:
    """What to fold instead of an input that cannot be folded (`cause`, a dead-letter reason):
    a terminal receipt becomes a non-retryable failure of the same attempt (retrying would
    do the same), without its usage (its charge is not applied); a command becomes its
    RunRejected; any other input (a fired timer, an accepted or cancelled receipt) fails its
    run (`FailRun`): what it would have started can never be, so without it a step would wait
    for good (a sleep that never wakes, a retry never dispatched)."""
    command_code, attempt_code, run_code, text = _CAUSES[cause]
    mtype = msg.get("type")
    what = (
        "receipt"
        if mtype in TERMINAL_RECEIPTS
        else "command"
        if mtype in COMMANDS
        else ("timer" if mtype == "TimerFired" else f"{mtype} receipt")
    )
    reason = text.format(what=what, error=error[:500]) + _APPLIED
    if mtype in ("ActivationCompleted", "ActivationFailed"):
        return {
            **msg,
            "type": "ActivationFailed",
            "code": attempt_code,
            "message": reason,
            "retryable": False,
            "output": None,
            "usage": None,
        }
    if mtype == "ChildRunFinished":
        return {
            **msg,
            "status": "failed",
            "output": None,
            "usage": None,
            "failure": {"code": attempt_code, "message": reason},
        }
    if mtype in COMMANDS:
        return rejection(msg, command_code, reason)
    return {
        "type": "FailRun",
        "run_id": msg["run_id"],
        "ts_ms": msg["ts_ms"],
        "record_id": msg.get("record_id"),
        "code": run_code,
        "message": reason,
    }


def _too_large_instead(msg: dict[str, Any], error: str) -> dict[str, Any]:
    return _instead(msg, deadletter.OUTPUT_TOO_LARGE, error)


class Folder:
    def __init__(
        self,
        ctx: EngineContext,
        codec: Codec,
        topics: TopicNames,
        produce: Produce,
        on_event_delivery: Callable[[Any, Any], None],
        now_ms: Callable[[], int],
        finished_retention_ms: int = 0,
    ) -> None:
        self.ctx = ctx
        self.finished_retention_ms = finished_retention_ms
        self.topics = topics
        self._produce = produce
        self._on_event_delivery = on_event_delivery
        self._now_ms = now_ms
        self._decode = {
            topics.commands: codec.decoder("commands"),
            topics.receipts: codec.decoder("receipts"),
        }
        self._decode_event = codec.decoder("run_events")
        self._enc_event = codec.encoder("run_events")
        self._enc_activation = codec.encoder("activations")
        self._enc_child = codec.encoder("child_activations")
        self._enc_snapshot = codec.encoder("run_state")
        self._decode_snapshot = codec.decoder("run_state")
        self._enc_dead = codec.encoder("dead_letters")
        self._activation_topics: dict[str, str] = {}
        self.run_events = topics.run_events
        self.run_state = topics.run_state
        self.child_activations = topics.child_activations
        self.dead_letters = topics.dead_letters
        self._owner: PartitionOwners | None = None  # set_partitions: until then every partition is the owner
        # Called with the record's timestamp before a StartRun naming a definition the catalog
        # lacks is decided (the processor reads the definitions topic up to now: loop.py).
        self.definition_missing: Callable[[int], None] | None = None
        self.ts_past_ms, self.ts_future_ms = admission.TS_PAST_MS, admission.TS_FUTURE_MS

    def set_partitions(self, partitions: int) -> None:
        """The input topics' partition count: a record is folded only on the partition that
        owns its run id (admission.py)."""
        self._owner = PartitionOwners(partitions)

    def activation_topic(self, queue: str) -> str:
        t = self._activation_topics.get(queue)
        if t is None:
            t = self._activation_topics[queue] = self.topics.activations(queue)
        return t

    # ---- the hot path ----------------------------------------------------------------------
    def fold_input(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int = -1,
        headers: Callable[[], Any] | None = None,
    ) -> None:
        """Fold one input record. `timestamp`: the record's Kafka timestamp (ms; <= 0: none);
        `headers`: the record's `headers` method (called only to forward it). Whatever goes
        wrong for the record alone (bytes the codec refuses, an engine exception, a value the
        encoders or the state serializer refuse) is charged to it: nothing of it is applied, it
        goes to the dead letters, and its run is told (`_charge`). Only produce()'s refusals
        (`RecordTooLarge`, `ProduceFailed`) leave here: the loop owns the transaction."""
        _inc(counters.records_in, topic)
        if value is None:
            self.dead_letter(
                counters,
                topic,
                partition,
                offset,
                key,
                value,
                deadletter.NULL_VALUE,
                "record has no value (null)",
            )
            return
        bad_json = None
        try:
            msg = self._decode[topic](value)
        except InvalidJsonField as e:  # the envelope decoded: its run hears why (below)
            msg, bad_json = e.message, e.fields
        except DecodeError as e:
            self.dead_letter(
                counters,
                topic,
                partition,
                offset,
                key,
                value,
                deadletter.UNDECODABLE,
                f"cannot decode {topic}: {e.reason}",
            )
            return
        except Exception as e:  # a codec defect on these bytes: the same verdict, never a crash
            self.dead_letter(
                counters,
                topic,
                partition,
                offset,
                key,
                value,
                deadletter.UNDECODABLE,
                f"cannot decode {topic}: {type(e).__name__}: {e}",
            )
            return
        run_id: str = msg["run_id"]
        if key is None or key != run_id.encode():
            self.dead_letter(
                counters,
                topic,
                partition,
                offset,
                key,
                value,
                deadletter.KEY_MISMATCH,
                f"record key {admission.key_text(key)} is not the run_id "
                f"{admission.key_text(run_id.encode())} of its value",
            )
            return
        owner = self._owner
        if owner is not None and (home := owner(key)) != partition:
            self._forward(counters, topic, partition, offset, key, value, timestamp, headers, home)
            return
        # the bounds inline (admission.implausible_time words them): one comparison per input
        if bad_json is not None or (
            timestamp > 0
            and not (timestamp - self.ts_past_ms <= msg["ts_ms"] <= timestamp + self.ts_future_ms)
        ):
            admitted = self._admit(overlay, counters, topic, partition, key, msg, bad_json, timestamp)
            if admitted is None:
                return
            msg = admitted
        if self.finished_retention_ms > 0:
            self.purge_overdue(overlay, counters, partition, key, run_id)
        try:
            # Not only while retention is on: runs purged before it was switched off keep their ids.
            if msg["type"] == "StartRun" and overlay.state(run_id, load_state) is None:
                if self.definition_missing is not None and self._names_unknown_definition(msg):
                    self.definition_missing(timestamp)
                status = overlay.purged_status(run_id)
                if status is not None:  # the engine would see a new run: the id would be reused
                    why = (
                        "began before the start of the run-events log (its retention deleted the beginning), "
                        "so the processor could not restore it"
                        if status == LOST_STATUS.decode()
                        else f"already ran ({status}) and was purged from the processor's store after its retention"
                    )
                    outputs: Outcome | None = self._rejection(
                        overlay,
                        counters,
                        run_id,
                        rejection(msg, "Conflict", f"run {run_id} {why}; run ids are not reused"),
                    )
                else:
                    outputs = self._decide(overlay, counters, msg, run_id)
            else:
                outputs = self._decide(overlay, counters, msg, run_id)
        except Exception as e:  # an engine defect must not stop the partition: charge the record
            if isinstance(e, Unserializable):  # a value the encoders or the serializer refuse
                cause, error = deadletter.UNSERIALIZABLE, str(e)
            else:
                # orjson's refusals inside the engine (its own size checks) are a value, not a defect
                cause = deadletter.UNSERIALIZABLE if _refused_value(e) else deadletter.PROCESSING_ERROR
                error = f"{type(e).__name__} while folding {msg.get('type')}: {e}"
            self._charge(overlay, counters, topic, partition, offset, key, value, msg, cause, error)
            return
        if msg["type"] == "TimerFired":
            # The timer came back as input: it is done whatever the decision (no refire).
            overlay.clear_fired_timer(run_id, msg["timer_id"], msg["due_ms"])
        if outputs is not None:
            self._emit(overlay, counters, partition, key, run_id, outputs)

    def purge_overdue(
        self, overlay: PartitionOverlay, counters: TxnCounters, partition: int, key: bytes, run_id: str
    ) -> None:
        """An input for a finished run whose retention has ended purges it first, in this
        transaction (its run-state tombstone, and the store deletions at commit), as the purge
        pass would have: the run is purged at its time, not at the next pass. Without it, a
        store that missed purges (written before them: an instance's own store of a partition
        another owned and purged meanwhile, a backup put back, a store rebuilt from the log)
        held the run again until its next pass, and a ResumeRun folded before that resumed a
        purged run; a live store did the same in the second between the retention's end and
        the pass. Restore cannot bring a store up to the purges: a purge writes no run event."""
        try:
            state = overlay.state(run_id, load_state)
            if state is None:
                return
            purge_ms = state["updated_ms"] + self.finished_retention_ms
            if purge_ms > self._now_ms():  # first: a live run's last change is recent (one comparison)
                return
            status = run_status(state)
        except Exception:  # a state that cannot be read: the record's own fold meets it and charges it
            return
        if status not in TERMINAL_STATUSES:
            return
        overlay.purge_overdue(run_id, status, purge_ms)
        self._produce(self.run_state, self.purged_marker(run_id, status), key, partition=partition)
        counters.purged += 1

    def _names_unknown_definition(self, msg: dict[str, Any]) -> bool:
        """Whether a StartRun names a definition the catalog lacks: its own, or (a child run's)
        one in its bundle, which the engine checks against the registry too."""
        definition_id, revision = msg.get("definition_id"), msg.get("revision")
        catalog = self.ctx.catalog
        bundle = msg.get("bundle")
        if isinstance(bundle, dict) and isinstance(bundle.get("definitions"), dict):
            for key in bundle["definitions"]:
                found_id, sep, found_rev = str(key).rpartition("@")
                if sep and found_rev.isdigit() and catalog.content_hash(found_id, int(found_rev)) is None:
                    return True
        return (
            isinstance(definition_id, str)
            and (revision is None or type(revision) is int)
            and catalog.get(definition_id, revision) is None
        )

    def _forward(
        self,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes,
        value: bytes,
        timestamp: int,
        headers: Callable[[], Any] | None,
        owner: int,
    ) -> None:
        """A record on a partition that does not own its run goes, in this transaction, to the
        one that does, as it was (value, key, headers, timestamp) plus where it landed."""
        hdrs = list((headers() if headers is not None else None) or ())
        if admission.forwarded_from(hdrs) is not None:  # forwarded once already: partition counts disagree
            self.dead_letter(
                counters,
                topic,
                partition,
                offset,
                key,
                value,
                deadletter.MISROUTED,
                f"record was forwarded here from {admission.forwarded_from(hdrs)} but partition "
                f"{owner} owns run {admission.key_text(key)}: processors disagree on the partition "
                "count",
            )
            return
        hdrs.append((admission.FORWARDED_HEADER, f"{topic}:{partition}:{offset}".encode()))
        self._produce(
            topic,
            value,
            key,
            partition=owner,
            headers=hdrs,
            **({"timestamp": timestamp} if timestamp > 0 else {}),
        )
        _inc(counters.misrouted, topic)
        _inc(counters.records_out, topic)

    def _admit(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        topic: str,
        partition: int,
        key: bytes,
        msg: dict[str, Any],
        bad_json: list[tuple[str, str]] | None,
        timestamp: int,
    ) -> dict[str, Any] | None:
        """An input with json that is not JSON or an implausible ts_ms (admission.py): what to
        fold instead, or None when it is answered here (a command's RunRejected)."""
        mtype = msg["type"]
        why = admission.implausible_time(msg["ts_ms"], timestamp, self.ts_past_ms, self.ts_future_ms)
        if why is not None:
            if mtype in COMMANDS:
                self._reject(
                    overlay,
                    counters,
                    partition,
                    key,
                    msg["run_id"],
                    rejection({**msg, "ts_ms": timestamp}, "InvalidInput", why),
                )
                return None
            msg = {**msg, "ts_ms": timestamp}
            _inc(counters.retimed, topic)
        if bad_json is None:
            return msg
        reason = admission.json_problem(bad_json, mtype)
        if mtype in COMMANDS:
            self._reject(
                overlay, counters, partition, key, msg["run_id"], rejection(msg, "InvalidInput", reason)
            )
            return None
        return admission.failed_instead(msg, reason) or msg

    def _decide(
        self, overlay: PartitionOverlay, counters: TxnCounters, msg: dict[str, Any], run_id: str
    ) -> Outcome | None:
        """Everything a record produces, encoded, before anything is produced: the engine's
        decision, the states after its events, their effects, every output's bytes, the timers' JSON and
        the new state's `dump_state` bytes (the snapshot and the store value), so that no
        value of this record can fail later, at commit or in the store batch. Raises
        `Unserializable` for a value the encoders refuse."""
        state = before = overlay.state(run_id, load_state)
        decision = decide(state, msg, self.ctx)
        if not decision.events:
            if decision.dropped:
                _inc(counters.dropped, decision.dropped)
            return None
        events: list[tuple[int, bytes]] = []
        messages: list[tuple[str, bytes]] = []
        # timer id -> its body and JSON to arm, or None to clear: in event order, so a timer an
        # event arms and a later event of the same record clears ends cleared, as restore folds it
        timers: dict[str, tuple[dict[str, Any], bytes] | None] = {}
        enc_event = self._enc_event
        for ev, state in zip(decision.events, decision.states, strict=True):  # folded by decide
            try:
                events.append((ev["sequence"], enc_event(ev)))
            except EncodeError as e:
                raise Unserializable(f"its {ev['type']} event cannot be encoded: {e.reason}") from e
            if state is None:
                continue
            fx = effects(state, ev)
            if fx is NO_EFFECTS:  # most events
                continue
            for m in fx.messages:
                messages.append(self._route(m, state))
            for tid in fx.clear_timers:
                timers[tid] = None
            for body in fx.set_timers:
                body = {**body, "run_id": run_id}
                try:
                    timers[body["timer_id"]] = body, orjson.dumps(body)
                    if not body["due_ms"] < _LONG_END:  # its TimerFired carries it as an Avro long
                        raise OverflowError(f"due_ms {body['due_ms']} is beyond a 64-bit long")
                except (TypeError, OverflowError) as e:
                    raise Unserializable(f"its {body.get('timer_kind')} timer cannot be stored: {e}") from e
        raw = None
        if state is not None:
            # the store's event keys hold a run id's length in 2 bytes (store.event_prefix)
            if len(run_id) > _SAFE_ID_CHARS and len(run_id.encode()) > _MAX_ID_BYTES:
                raise Unserializable(
                    f"its run id is {len(run_id.encode())} bytes, longer than the {_MAX_ID_BYTES} "
                    "the processor's store keys hold"
                )
            try:
                raw = dump_state(state)
            except TypeError as e:  # orjson: "Recursion limit reached", "Integer exceeds 64-bit range"
                raise Unserializable(f"the run's state cannot be serialized: {e}") from e
        if decision.dropped:
            _inc(counters.dropped, decision.dropped)
        for ev in decision.events:
            if ev["type"] == "RunRejected":
                _inc(counters.rejected, ev["code"])
        return Outcome(before, state, decision.events[-1]["ts_ms"], events, messages, timers, raw)

    def _route(self, m: dict[str, Any], state: Any) -> tuple[str, bytes]:
        kind = m["type"]
        if kind in _ACTIVATIONS:
            queue = m.get("queue")
            if queue is None:  # CancelActivation: to the queue its activation went to
                queue = state["steps"][instance_key(m["node"], m["lineage"])]["queue"]
            return self.activation_topic(queue), self._enc_activation(m)
        if kind in _CHILD:
            return self.child_activations, self._enc_child(m)
        raise ValueError(f"engine effect of unknown type {kind!r}")

    def _emit(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        partition: int,
        key: bytes,
        run_id: str,
        outcome: Outcome,
    ) -> None:
        """Produce a record's outcome and apply it to the overlay."""
        produce = self._produce
        topic = self.run_events
        events = outcome.events
        # Only the record's last event reports its delivery: one producer writes a partition's
        # events in produce order, so the transaction's last report per partition is its max offset.
        for _, event in events[:-1]:
            produce(topic, event, key, partition=partition)
        produce(topic, events[-1][1], key, partition=partition, on_delivery=self._on_event_delivery)
        _inc(counters.records_out, topic, len(events))
        for topic, message in outcome.messages:
            produce(topic, message, key)
            _inc(counters.records_out, topic)
        _count_status(overlay, outcome.before, outcome.state, outcome.ts_ms, self.finished_retention_ms)
        overlay.apply(run_id, outcome)

    def _charge(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes,
        value: bytes,
        msg: dict[str, Any],
        cause: str,
        error: str,
    ) -> None:
        """A decoded record that cannot be folded (`cause`): to the dead letters, and its run
        hears why (`_instead`), as for an input whose outputs the broker refuses."""
        self.dead_letter(counters, topic, partition, offset, key, value, cause, error)
        self._fold_instead(overlay, counters, partition, key, msg, cause, error)

    def _fold_instead(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        partition: int,
        key: bytes,
        msg: dict[str, Any],
        cause: str,
        error: str,
    ) -> None:
        run_id = msg["run_id"]
        if msg["type"] == "TimerFired":  # as fold_input does: the timer is done (no refire)
            overlay.clear_fired_timer(run_id, msg["timer_id"], msg["due_ms"])
        substitute = _instead(msg, cause, error)
        try:
            if substitute["type"] == "RunRejected":
                outputs: Outcome | None = self._rejection(overlay, counters, run_id, substitute)
            else:
                outputs = self._decide(overlay, counters, substitute, run_id)
        except Exception:  # the dead letter is written; the substitute failing too changes nothing else
            return
        if outputs is not None:
            self._emit(overlay, counters, partition, key, run_id, outputs)

    def park(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        error: str,
        level: int,
        cause: str = deadletter.OUTPUT_TOO_LARGE,
    ) -> None:
        """Instead of folding: an input the loop found to fail its transaction (`cause`: its
        outputs refused by the broker as too large, or a failure at commit traced to it) goes to
        the dead letters, and its run hears why (`_instead`) so no step or client waits for what
        will never come. Each time the broker refuses again the loop raises `level`: 0 dead
        letter with the input's bytes, 1 without them, 2 without the substitute too (its own
        outputs, e.g. the run's snapshot, may be what is too large)."""
        _inc(counters.records_in, topic)
        prefix = "output too large: " if cause == deadletter.OUTPUT_TOO_LARGE else ""
        self.dead_letter(
            counters, topic, partition, offset, key, value if level == 0 else None, cause, prefix + error
        )
        if value is None or key is None:
            return
        try:
            msg = self._decode[topic](value)
        except Exception:
            return
        run_id = msg["run_id"]
        if key != run_id.encode():
            return
        if level >= 2:
            if msg["type"] == "TimerFired":
                overlay.clear_fired_timer(run_id, msg["timer_id"], msg["due_ms"])
            return
        self._fold_instead(overlay, counters, partition, key, msg, cause, error)

    park_too_large = park

    def _reject(
        self,
        overlay: PartitionOverlay,
        counters: TxnCounters,
        partition: int,
        key: bytes,
        run_id: str,
        event: dict[str, Any],
    ) -> None:
        """A RunRejected the runtime decides, produced at once (admission's answers)."""
        self._emit(
            overlay, counters, partition, key, run_id, self._rejection(overlay, counters, run_id, event)
        )

    def _rejection(
        self, overlay: PartitionOverlay, counters: TxnCounters, run_id: str, event: dict[str, Any]
    ) -> Outcome:
        """The outputs of a RunRejected the runtime decides (the engine cannot see why): no
        state changes."""
        state = overlay.state(run_id, load_state)
        raw = self._enc_event(event)
        dumped = overlay.dumped.get(run_id)
        if dumped is None and state is not None:  # a committed state: it was serialized before
            dumped = dump_state(state)
        _inc(counters.rejected, event["code"])
        return Outcome(state, state, event["ts_ms"], [(0, raw)], [], {}, dumped)

    def dead_letter(
        self,
        counters: TxnCounters,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        reason: str,
        error: str,
    ) -> None:
        record = deadletter.dead_letter(topic, partition, offset, key, value, error, self._now_ms())
        self._produce(self.dead_letters, self._enc_dead(record), key)
        _inc(counters.dead, reason)
        _inc(counters.records_out, self.dead_letters)

    # ---- commit time -----------------------------------------------------------------------
    def snapshots(self, overlay: PartitionOverlay, partition: int, counters: TxnCounters) -> None:
        """One RunStateSnapshot per run touched in this transaction (compacted topic)."""
        n = 0
        dumped = overlay.dumped
        for run_id, state in overlay.states.items():
            if state is None:
                continue
            raw = dumped.get(run_id)
            if raw is None:  # a state not folded by fold_input (none today): serialize it now
                raw = dumped[run_id] = dump_state(state)
            snapshot = {
                "run_id": run_id,
                "sequence": state["sequence"],
                "ts_ms": overlay.event_ts.get(run_id) or self._now_ms(),
                "status": run_status(state),
                "definition_id": state["definition_id"],
                "revision": state["revision"],
                "state_digest": hashlib.sha256(raw).hexdigest(),
                "state": orjson.Fragment(raw),  # already canonical JSON: no re-serialisation
            }
            self._produce(self.run_state, self._enc_snapshot(snapshot), run_id.encode(), partition=partition)
            n += 1
        if n:
            _inc(counters.records_out, self.run_state, n)

    # ---- restore ---------------------------------------------------------------------------
    def fold_committed(self, overlay: PartitionOverlay, value: bytes | None) -> None:
        """Fold one committed run event (restore): state, event log, timers; no output.
        Raises DecodeError for bytes that are no run event (a tombstone too)."""
        if value is None:
            raise DecodeError("null value (a tombstone)", "run_events")
        ev = self._decode_event(value)
        run_id: str = ev["run_id"]
        before = overlay.state(run_id, load_state)
        if before is None and ev["sequence"] > 0:
            purged = overlay.purged_status(run_id)
            if purged is not None and purged != _LOST:
                # A purged run's marker (restored from run-state): its events stay folded away.
                # A restore from run-state never meets one (the purge came after every event of
                # the run, all below E0); a log fold has no markers.
                return
        elif before is not None and 0 < ev["sequence"] <= before["sequence"]:
            # Already in the state: a restore from run-state snapshots folds run-events from an
            # offset the snapshots may be ahead of (docs/runtime.md, "Restore from run-state").
            # A log fold never meets one: each run's events follow its state's sequence.
            return
        state = evolve(before, ev)
        _count_status(overlay, before, state, ev["ts_ms"], self.finished_retention_ms)
        overlay.add_event(run_id, ev["sequence"], value)
        if state is not None:
            fx = effects(state, ev)
            for tid in fx.clear_timers:
                overlay.clear_timer(run_id, tid)
            for body in fx.set_timers:
                body = {**body, "run_id": run_id}
                overlay.set_timer(run_id, body, orjson.dumps(body))
        overlay.put_state(run_id, state, None, None)

    def purged_marker(self, run_id: str, status: str) -> bytes:
        """A purged run's record on run-state instead of a tombstone: its id stays taken in
        the compacted table, so a store restored from it refuses the id (schemas/run_state.py)."""
        return self._enc_snapshot(purged_marker(run_id, status, self._now_ms()))

    def seed_snapshot(self, overlay: PartitionOverlay, value: bytes) -> str:
        """Put one run's latest `<p>.run-state` snapshot into a new store (a restore from
        run-state): its state, the timers its state has armed (`timers_of`: what folding its
        events' effects leaves), its purge entry and its count, as `fold_committed` leaves
        them after the run's last event. Returns the run id. Raises DecodeError."""
        snap = self._decode_snapshot(value)
        run_id: str = snap["run_id"]
        purged = purged_status(snap)
        if purged is not None:  # a purged run: its id only
            overlay.marked[run_id] = purged
            return run_id
        state = state_from_json(snap["state"])
        overlay.absent.add(run_id)  # a new store: no timer of it stored yet (no read per timer)
        # the finishing event's time is the state's last change (evolve sets updated_ms)
        _count_status(overlay, None, state, state["updated_ms"], self.finished_retention_ms)
        for body in timers_of(state):
            overlay.set_timer(run_id, body, orjson.dumps(body))
        overlay.put_state(run_id, state, None, None)
        return run_id

    @staticmethod
    def dump_all(overlay: PartitionOverlay) -> None:
        for run_id, state in overlay.states.items():
            if state is not None:
                overlay.dumped[run_id] = dump_state(state)
