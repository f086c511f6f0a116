"""The processor's answer to one command, found where the command was typed.

A command's answer is in the run's events: a `RunRejected` whose `record_id` derives from the
command's own record id (`<run>:rejected:<command record id>`, engine/ids.py), or the event
the command causes (`RunAccepted` for a StartRun, `RunCancelling` or `RunCancelled`,
`SignalReceived` of that signal, `RunResumed`). A CancelRun, SignalRun or ResumeRun carries an
idempotency key: the event that answers it carries the same key, so it is told apart from
another sender's (issue 44), and a repeat of a key the run applied is answered with a
`CommandDeduplicated` naming that first answer: the retry of a command after a timeout gets the
original answer, not a second effect. A duplicate that changes nothing (a cancelled run
cancelled again, the same StartRun twice) emits nothing: it is answered "unchanged" once the
processor's consumer group has committed an offset past the command (the processor commits its
input offsets in the transaction that writes the events, so by then any event it caused is
committed too).

Cheap by construction: the client notes the end of the run's run-events partition before it
sends, and reads only that one partition from there, `read_committed`, comparing keys before
decoding; the group's committed offset is asked for that one commands partition only, and
only while the events are idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from processors.client.errors import AnswerTimeout, CommandRejected
from processors.client.reader import KAFKA_LOGGER, PartitionReader
from processors.engine.ids import rejection_record_id
from processors.kafka.watermarks import GroupOffsets
from topology.settings import KafkaSettings

# The event each accepted command causes first (docs/messages.md).
ANSWER_EVENTS = {
    "StartRun": "RunAccepted",
    "CancelRun": "RunCancelled",
    "SignalRun": "SignalReceived",
    "ResumeRun": "RunResumed",
}
# The events that carry a keyed command's idempotency key (engine/vocabulary.KEYED_ANSWERS): a
# cancel that waits for its steps to stop is answered by its RunCancelling.
KEYED_ANSWERS = {
    "CancelRun": frozenset({"RunCancelling", "RunCancelled"}),
    "SignalRun": frozenset({"SignalReceived"}),
    "ResumeRun": frozenset({"RunResumed"}),
}
_UNCHANGED = {
    "StartRun": "the run already exists with this definition and input (StartRun is idempotent)",
    "CancelRun": "the run is already cancelled (CancelRun is idempotent)",
}
# ResumeRun reasons are cut to this many characters in RunResumed (engine/commands.py)
_REASON_CHARS = 1000
# How often the processor group's committed offset is asked for while the events are idle,
# and how long after it passed the command the events are still read: the transaction's
# markers reach __consumer_offsets and run-events a few milliseconds apart.
_OFFSET_POLL_S = 0.2
_MARKER_GRACE_S = 0.5


@dataclass(frozen=True)
class Sent:
    """A command on the broker, and where its answer will be."""

    run_id: str
    command: str
    record_id: str
    commands_topic: str
    commands_partition: int
    commands_offset: int
    events_topic: str
    events_partition: int
    events_start: int  # end of the run's run-events partition just before the send
    signal: str | None = None
    # what the command carries that its answering event repeats (answers a concurrent sender's
    # event from ours): StartRun's definition_id, revision, input; SignalRun's payload;
    # ResumeRun's reason
    content: dict[str, Any] = field(default_factory=dict)
    # the idempotency key the processor applies the command under (its idempotency_key, else its
    # record id): None for a StartRun
    key: str | None = None


@dataclass(frozen=True)
class CommandAnswer:
    """How the processor answered one command (a rejection raises `CommandRejected` instead)."""

    run_id: str
    command: str
    record_id: str
    outcome: str  # "accepted" (an event answered it) | "unchanged" (a duplicate: nothing to do)
    event_type: str | None = None
    sequence: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "run_id": self.run_id,
            "command": self.command,
            "record_id": self.record_id,
            "answer": self.outcome,
            "event": self.event_type,
            "sequence": self.sequence,
            "detail": self.detail,
        }


def answers(sent: Sent, ev: dict[str, Any]) -> bool:
    """Whether a run event (of this run, written after the send) may be the answer to `sent`:
    a `RunRejected` of its record id; for a keyed command, the event or the `CommandDeduplicated`
    that carries its key; else the event of its kind (`same_content` tells whether that one
    repeats what `sent` carries)."""
    kind = ev.get("type")
    if kind == "RunRejected":
        return bool(ev.get("record_id") == rejection_record_id(sent.run_id, sent.record_id))
    if sent.key is not None:
        if kind == "CommandDeduplicated":
            return bool(ev.get("idempotency_key") == sent.key and ev.get("command_type") == sent.command)
        if kind not in KEYED_ANSWERS[sent.command]:
            return False
        key = ev.get("idempotency_key")
        if key is not None:
            return bool(key == sent.key)
        # no key: written by a processor that predates keys (or a RunCancelled after its
        # RunCancelling, which carried the key): matched as before, by kind and content
    if kind != ANSWER_EVENTS[sent.command]:
        return False
    return sent.command != "SignalRun" or ev.get("signal") == sent.signal


def _canonical(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None


def _same(ours: Any, theirs: Any) -> bool:
    a, b = _canonical(ours), _canonical(theirs)
    return a is None or b is None or a == b


def same_content(sent: Sent, ev: dict[str, Any]) -> bool:
    """Whether an answering event carries what `sent` carried. Another service's command for the
    same run (a StartRun of another input, a signal of another payload) causes an event of the
    same type that is not the answer to ours: ours may still be rejected (`Conflict`)."""
    c = sent.content
    if not c or (sent.key is not None and ev.get("idempotency_key") == sent.key):
        return True  # the key names the command: another sender's content cannot answer it
    if sent.command == "StartRun":
        return (
            ev.get("definition_id") == c.get("definition_id")
            and (c.get("revision") is None or ev.get("revision") == c.get("revision"))
            and _same(c.get("input"), ev.get("input"))
        )
    if sent.command == "SignalRun":
        return _same(c.get("payload"), ev.get("payload"))
    if sent.command == "ResumeRun":
        reason = c.get("reason")
        return not isinstance(reason, str) or ev.get("reason") == reason[:_REASON_CHARS]
    return True


class ProcessedOffsets:
    """The processor group's committed offsets, read without joining the group, and never with
    the admin client's `list_consumer_group_offsets`: it aborts the process while brokers fail
    over (processors/kafka/watermarks.py)."""

    def __init__(self, settings: KafkaSettings, group: str, timeout_s: float) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self._offsets = GroupOffsets(settings, group, logger=KAFKA_LOGGER)

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset (the next input it will read), None if unknown/none:
        a broker hiccup is asked again at the next idle moment."""
        return self._offsets.committed(TopicPartition(topic, partition), self.timeout_s)

    def close(self) -> None:
        self._offsets.close()


def await_answer(
    sent: Sent,
    reader: PartitionReader,
    decode: Callable[[bytes], dict[str, Any]],
    offsets: ProcessedOffsets,
    timeout: float,
    prefix: str,
) -> CommandAnswer:
    """Follow the run's events from `sent.events_start` until the answer to `sent`.

    Raises `CommandRejected` for a `RunRejected` of this command, `AnswerTimeout` when
    nothing answered within `timeout` seconds."""
    key = sent.run_id.encode()
    deadline = time.monotonic() + timeout
    next_poll = 0.0
    processed_at: float | None = None
    ever_committed = False
    # an answering event whose content is not ours: another service's command for this run;
    # ours is answered by its own RunRejected, or was folded with nothing else (then it is this)
    other: dict[str, Any] | None = None
    start = {(sent.events_topic, sent.events_partition): sent.events_start}
    for msg in reader.read(start, follow=True, deadline=None):
        now = time.monotonic()
        value = None if msg is None or msg.key() != key else msg.value()
        if value is not None:
            ev = decode(value)
            if answers(sent, ev):
                if ev["type"] == "RunRejected":
                    raise CommandRejected(sent.run_id, sent.command, sent.record_id, ev["code"], ev["reason"])
                if ev["type"] == "CommandDeduplicated":  # a repeat: the first answer is the answer
                    return CommandAnswer(
                        sent.run_id,
                        sent.command,
                        sent.record_id,
                        "accepted",
                        ev["answer_type"],
                        ev["answer_sequence"],
                        f"a repeat of idempotency key {sent.key!r}: the run applied it once "
                        f"({ev['answer_type']} at sequence {ev['answer_sequence']}) and changed nothing now",
                    )
                if same_content(sent, ev):
                    return CommandAnswer(
                        sent.run_id, sent.command, sent.record_id, "accepted", ev["type"], ev["sequence"]
                    )
                other = other or ev
        if processed_at is not None:
            if now - processed_at >= _MARKER_GRACE_S:
                if other is not None:  # ours after all (its content read back differently)
                    return CommandAnswer(
                        sent.run_id,
                        sent.command,
                        sent.record_id,
                        "accepted",
                        other["type"],
                        other["sequence"],
                    )
                detail = _UNCHANGED.get(sent.command, "the processor took the command and changed nothing")
                return CommandAnswer(sent.run_id, sent.command, sent.record_id, "unchanged", detail=detail)
            continue
        if now > deadline:
            break
        if now >= next_poll:
            next_poll = now + _OFFSET_POLL_S
            committed = offsets.committed(sent.commands_topic, sent.commands_partition)
            ever_committed = ever_committed or committed is not None
            if committed is not None and committed > sent.commands_offset:
                processed_at = now
    hint = (
        f"the processor group {offsets.group!r} has not read that far yet"
        if ever_committed
        else f"the processor group {offsets.group!r} has committed nothing on that partition: "
        f"is a processor running for prefix {prefix!r}?"
    )
    raise AnswerTimeout(
        sent.run_id,
        sent.command,
        sent.record_id,
        f"{sent.command} to run {sent.run_id!r} is written ({sent.commands_topic}[{sent.commands_partition}] "
        f"offset {sent.commands_offset}) but no answer came within {timeout:g}s; {hint} "
        f"(`runfold runs events {sent.run_id}` shows the answer when it comes)",
    )


def rejected_start(
    reader: PartitionReader,
    decode: Callable[[bytes], dict[str, Any]],
    topic: str,
    partition: int,
    run_id: str,
) -> dict[str, Any] | None:
    """The last `RunRejected` of a StartRun of a run that was never accepted, read from its
    run-events partition (one partition, keys compared before decoding), else None."""
    key = run_id.encode()
    found: dict[str, Any] | None = None
    for msg in reader.read({(topic, partition): OFFSET_BEGINNING}):
        value = None if msg is None or msg.key() != key else msg.value()
        if value is None:
            continue
        ev = decode(value)
        if ev["type"] == "RunAccepted":
            return None
        if ev["type"] == "RunRejected" and ev.get("command_type") == "StartRun":
            found = ev
    return found
