"""The processor's input admission (processors/runtime/admission.py) through the real fold:
partition ownership (forwarding), the time of a record, json fields that are not JSON, and
dead-letter texts any reader can read."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from fold_rig import CODEC, ONE, TOPICS, TS, start
from hypothesis import given
from hypothesis import strategies as st

from processors.engine import Catalog, EngineContext
from processors.kafka.partitioning import PartitionOwners, murmur2, partition_for
from processors.runtime import admission
from processors.runtime.fold import Folder, TxnCounters
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore

ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


def _reference_murmur2(data: bytes) -> int:
    """The loop-per-byte-group form Kafka's Utils.murmur2 is written in (the one replaced)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length & ~3, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[length & ~3 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


@given(st.binary(max_size=600))
def test_murmur2_equals_the_reference_for_any_key(data: bytes) -> None:
    assert murmur2(data) == _reference_murmur2(data)


def test_partition_owners_memo_agrees_and_stays_bounded() -> None:
    owners = PartitionOwners(7, limit=50)
    for i in range(500):
        key = f"run-{i}".encode()
        assert owners(key) == partition_for(key, 7) == owners(key)
    assert len(owners._memo) <= 50


class Sink:
    def __init__(self) -> None:
        self.out: list[tuple[str, bytes | None, bytes | None, dict[str, Any]]] = []

    def __call__(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        self.out.append((topic, value, key, kw))

    def decoded(self, topic: str, kind: str) -> list[dict[str, Any]]:
        return [CODEC.decode(kind, v) for t, v, _, _ in self.out if t == topic]


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    class R:
        def __init__(self) -> None:
            catalog = Catalog()
            catalog.register(ONE)
            self.sink = Sink()
            self.folder = Folder(
                EngineContext(catalog=catalog), CODEC, TOPICS, self.sink, lambda e, m: None, lambda: TS
            )
            self.folder.set_partitions(2)
            self.stores = {p: PartitionStore(tmp_path / f"p{p}", p) for p in (0, 1)}
            self.counters = TxnCounters()

        def fold(
            self,
            partition: int,
            topic: str,
            key: bytes | None,
            value: bytes | None,
            timestamp: int = TS,
            headers: list[tuple[str, bytes]] | None = None,
            offset: int = 7,
            ov: PartitionOverlay | None = None,
        ) -> PartitionOverlay:
            ov = ov or PartitionOverlay(self.stores[partition])
            self.folder.fold_input(
                ov, self.counters, topic, partition, offset, key, value, timestamp, lambda: headers
            )
            return ov

        def events(self) -> list[dict[str, Any]]:
            return self.sink.decoded(TOPICS.run_events, "run_events")

        def dead(self) -> list[dict[str, Any]]:
            return self.sink.decoded(TOPICS.dead_letters, "dead_letters")

    return R()


def misrouted_id(partitions: int = 2) -> str:
    """A run id that librdkafka's default partitioner (CRC32) puts on another partition than murmur2."""
    return next(
        r
        for i in range(100)
        if zlib.crc32((r := f"crc-{i}").encode()) % partitions != partition_for(r, partitions)
    )


def test_a_command_on_a_partition_that_does_not_own_its_run_is_forwarded_not_folded(rig: Any) -> None:
    run_id = misrouted_id()
    owner, landed = partition_for(run_id, 2), 1 - partition_for(run_id, 2)
    value = CODEC.encode("commands", start(run_id)[1])
    ov = rig.fold(landed, TOPICS.commands, run_id.encode(), value, headers=[("traceparent", b"00-ab")])
    assert rig.events() == [] and ov.state(run_id, lambda b: b) is None  # nothing folded where it landed
    ((topic, fwd_value, key, kw),) = rig.sink.out
    assert (topic, fwd_value, key, kw["partition"], kw["timestamp"]) == (
        TOPICS.commands,
        value,
        run_id.encode(),
        owner,
        TS,
    )
    assert kw["headers"] == [
        ("traceparent", b"00-ab"),
        (admission.FORWARDED_HEADER, f"{TOPICS.commands}:{landed}:7".encode()),
    ]
    assert rig.counters.misrouted == {TOPICS.commands: 1}
    # the forwarded copy arrives at the owner and is folded there, once
    rig.fold(owner, TOPICS.commands, key, fwd_value, headers=kw["headers"])
    assert [e["type"] for e in rig.events()][:2] == ["RunAccepted", "RunStarted"]


def test_a_record_forwarded_once_and_still_not_owned_is_dead_lettered_not_bounced(rig: Any) -> None:
    run_id = misrouted_id()
    landed = 1 - partition_for(run_id, 2)
    rig.fold(
        landed,
        TOPICS.commands,
        run_id.encode(),
        CODEC.encode("commands", start(run_id)[1]),
        headers=[(admission.FORWARDED_HEADER, b"t.commands:0:3")],
    )
    (dead,) = rig.dead()
    assert "forwarded here from t.commands:0:3" in dead["error"] and rig.counters.dead == {"misrouted": 1}


@pytest.mark.parametrize(
    ("ts_ms", "hint"),
    [
        (TS // 1000, "it looks like seconds"),
        (TS * 1000, "it looks like microseconds"),
        (TS + 3_600_000, "3,600 s after"),
    ],
)
def test_a_command_whose_ts_ms_is_implausible_is_rejected_with_the_reason(
    rig: Any, ts_ms: int, hint: str
) -> None:
    run_id = "ts-1"
    p = partition_for(run_id, 2)
    rig.fold(
        p, TOPICS.commands, run_id.encode(), CODEC.encode("commands", {**start(run_id)[1], "ts_ms": ts_ms})
    )
    (ev,) = rig.events()
    assert (ev["type"], ev["code"], ev["command_type"], ev["ts_ms"]) == (
        "RunRejected",
        "InvalidInput",
        "StartRun",
        TS,
    )
    assert hint in ev["reason"] and "milliseconds since the Unix epoch" in ev["reason"], ev["reason"]


def test_a_command_within_the_bounds_keeps_its_own_time(rig: Any) -> None:
    run_id = "ts-ok"
    p = partition_for(run_id, 2)
    rig.fold(
        p,
        TOPICS.commands,
        run_id.encode(),
        CODEC.encode("commands", {**start(run_id)[1], "ts_ms": TS - 60_000}),
    )
    assert {e["ts_ms"] for e in rig.events()} == {TS - 60_000}


def test_a_receipt_whose_ts_ms_is_implausible_is_folded_at_its_record_timestamp(rig: Any) -> None:
    run_id = "ts-r"
    p = partition_for(run_id, 2)
    ov = rig.fold(p, TOPICS.commands, run_id.encode(), CODEC.encode("commands", start(run_id)[1]))
    act = rig.sink.decoded(TOPICS.activations("default"), "activations")[-1]
    receipt = {
        "type": "ActivationCompleted",
        "run_id": run_id,
        "ts_ms": (TS + 500) // 1000,
        "record_id": "r1",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        "output": {"ok": 1},
        "usage": ZERO,
    }
    rig.fold(p, TOPICS.receipts, run_id.encode(), CODEC.encode("receipts", receipt), TS + 500, ov=ov)
    evs = rig.events()
    assert evs[-1]["type"] == "RunSucceeded" and evs[-1]["ts_ms"] == TS + 500
    assert all(e["ts_ms"] >= TS for e in evs) and rig.counters.retimed == {TOPICS.receipts: 1}


def _with_bad_json(kind: str, msg: dict[str, Any], field_json: bytes, bad: bytes) -> bytes:
    raw = CODEC.encode(kind, msg)
    assert raw.count(field_json) == 1 and len(bad) == len(
        field_json
    )  # same length: the Avro length prefix holds
    return raw.replace(field_json, bad)


def test_a_command_with_invalid_json_in_a_json_field_is_rejected_naming_the_field(rig: Any) -> None:
    run_id = "js-1"
    p = partition_for(run_id, 2)
    value = _with_bad_json(
        "commands",
        {**start(run_id)[1], "input": {"topic": "kafka"}},
        b'{"topic":"kafka"}',
        b"{'topic':'kafka'}",
    )
    rig.fold(p, TOPICS.commands, run_id.encode(), value)
    (ev,) = rig.events()
    assert (ev["type"], ev["code"], ev["command_type"]) == ("RunRejected", "InvalidInput", "StartRun")
    assert ev["reason"].startswith("StartRun.input is not valid JSON text"), ev["reason"]
    assert rig.dead() == []


def test_a_completed_receipt_with_invalid_json_output_fails_its_attempt_invalid_output(
    tmp_path: Path,
) -> None:
    from fold_rig import Rig

    r = Rig(tmp_path / "s")
    r.transaction(start("js-r"))
    act = r.activation("js-r")
    receipt = {
        "type": "ActivationCompleted",
        "run_id": "js-r",
        "ts_ms": TS + 1,
        "record_id": "r1",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        "output": {"n": 12345},
        "usage": ZERO,
    }
    value = _with_bad_json("receipts", receipt, b'{"n":12345}', b'{"n":12345,')
    ov, counters = PartitionOverlay(r.store), TxnCounters()
    r.folder.fold_input(ov, counters, TOPICS.receipts, 0, 9, b"js-r", value)
    evs = [CODEC.decode("run_events", v) for v in r.events()]
    failed = [e for e in evs if e["type"] == "StepFailed"]
    assert (
        failed and failed[0]["failure"]["code"] == "InvalidOutput" and not failed[0]["failure"]["retryable"]
    )
    assert "ActivationCompleted.output is not valid JSON text" in failed[0]["failure"]["message"]
    assert evs[-1]["type"] == "RunFailed" and not [t for t, _ in r.out if t == TOPICS.dead_letters]


def test_dead_letter_texts_show_keys_as_text_not_python_bytes(rig: Any) -> None:
    value = CODEC.encode("commands", start("dl-1")[1])
    rig.fold(partition_for("other", 2), TOPICS.commands, b"other", value)
    rig.fold(0, TOPICS.commands, b"\xff\xfe", value)
    rig.fold(0, TOPICS.commands, None, value)
    errors = [d["error"] for d in rig.dead()]
    assert errors == [
        'record key "other" is not the run_id "dl-1" of its value',
        'record key 0xfffe (not UTF-8) is not the run_id "dl-1" of its value',
        'record key (none) is not the run_id "dl-1" of its value',
    ]
    assert not any("b'" in e for e in errors)


def test_implausible_time_words() -> None:
    assert admission.implausible_time(TS, TS) is None
    assert admission.implausible_time(TS - admission.TS_PAST_MS, TS) is None
    assert admission.implausible_time(TS + admission.TS_FUTURE_MS + 1, TS) is not None
    assert admission.implausible_time(5, -1) is None  # no record timestamp: nothing to judge by
    why = admission.implausible_time(TS // 1000, TS)
    assert why is not None and "1970-01-21T" in why and "2025-11-29T" in why
    assert orjson.dumps(why)  # plain text


def test_undecodable_records_are_dead_lettered_in_words_not_python_reprs(rig: Any) -> None:
    import copy

    from schemas import Codec
    from schemas.contract import load_contract

    newer = copy.deepcopy(load_contract()["commands"])
    newer["fields"][-1]["type"].append(
        {"type": "record", "name": "PauseRun", "namespace": "runfold", "fields": []}
    )
    rig.folder._decode[TOPICS.commands] = Codec(history=[("commands", newer)]).decoder("commands")
    writer = Codec(schemas={**load_contract(), "commands": newer}, history=[])
    good = CODEC.encode("commands", start("dl-2")[1])
    bad = [
        writer.encode("commands", {"type": "PauseRun", "run_id": "dl-2", "record_id": "x", "ts_ms": TS}),
        good[:-3],
        good + b"\x00",
        b"\xc3\x01" + b"\x00" * 8 + good[10:],
        b"not avro",
        b"",
    ]
    for value in bad:
        rig.fold(partition_for("dl-2", 2), TOPICS.commands, b"dl-2", value)
    errors = [d["error"] for d in rig.dead()]
    assert len(errors) == len(bad)
    for error in errors:
        assert not any(mark in error for mark in ("b'", "{'", "'type'", "None")), error
