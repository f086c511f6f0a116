"""The contract enforced at the processor against a real broker, as a service in another
language meets it: a producer with librdkafka's default partitioner (CRC32, not murmur2),
a wrong time unit, text that is not JSON in a json field (docs/contract.md)."""

from __future__ import annotations

import time
import uuid
import zlib
from pathlib import Path

import httpx
import pytest
from processor_support import (
    CODEC,
    Commands,
    Reader,
    Responder,
    make_settings,
    running,
    setup_topology,
    terminal_of,
)

from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings
from topology.settings import producer_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", metrics_port=0)
    setup_topology(s)
    return s


class Crc32Service:
    """A service with librdkafka's defaults (partitioner `consistent_random`: CRC32 of the key),
    as confluent-kafka-go, Confluent.Kafka, rust-rdkafka or @confluentinc/kafka-javascript have."""

    def __init__(self, settings: ProcessorSettings) -> None:
        cfg = producer_config(settings, linger_ms=0)
        del cfg["partitioner"]  # librdkafka's own default
        from confluent_kafka import Producer

        self.producer = Producer(cfg)
        self.topic = settings.topics.commands
        self.partitions: dict[str, int] = {}

    def send(self, run_id: str, body: dict[str, object], ts_ms: int | None = None) -> None:
        msg = {
            "run_id": run_id,
            "ts_ms": ts_ms if ts_ms is not None else time.time_ns() // 1_000_000,
            "record_id": uuid.uuid4().hex,
            **body,
        }

        def delivered(err: object, m: object) -> None:
            assert err is None, err
            self.partitions[run_id] = m.partition()  # type: ignore[attr-defined]

        self.producer.produce(
            self.topic, CODEC.encode("commands", msg), run_id.encode(), on_delivery=delivered
        )

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


def crc32_misrouted(n: int, partitions: int, prefix: str) -> list[str]:
    """Run ids that CRC32 puts on another partition than murmur2."""
    ids = (f"{prefix}-{i}" for i in range(10_000))
    return [r for r in ids if zlib.crc32(r.encode()) % partitions != partition_for(r, partitions)][:n]


def test_a_crc32_producer_gets_one_run_per_id_a_working_cancel_and_one_terminal_event(
    settings: ProcessorSettings,
) -> None:
    runs = crc32_misrouted(4, settings.partitions, "crc")
    to_cancel = runs[0]
    events = Reader(settings, [settings.topics.run_events], "run_events")
    service = Crc32Service(settings)
    java_like = Commands(settings)  # a second service with the Java default (murmur2)

    def handler(c: Commands, act: dict) -> None:
        if act["type"] == "CancelActivation":
            c.receipt(act, "ActivationCancelled", reason="stopped")
        elif act["run_id"] == to_cancel:
            service.send(to_cancel, {"type": "CancelRun", "reason": "user asked"})  # cancel while in flight
            service.flush()
        else:
            c.complete(act, {"node": act["node"]})

    with running(settings) as pt, Responder(settings, handler):
        for r in runs:
            service.send(r, {"type": "StartRun", "definition_id": "one", "revision": None, "input": {"r": r}})
        service.flush()
        assert all(service.partitions[r] != partition_for(r, settings.partitions) for r in runs)
        # the same StartRun from a murmur2 service: idempotent by run id, not a second run
        for r in runs:
            java_like.start(r, "one", {"r": r})
        java_like.flush()
        events.wait_for(lambda evs: all(terminal_of(evs, r) for r in runs), what="a terminal event per run")
        events.drain(1.0)
        metrics = httpx.get(f"http://127.0.0.1:{pt.processor.metrics_port}/metrics", timeout=5).text
    for r in runs:
        mine = events.of(r)
        assert [e["type"] for e in mine].count("RunAccepted") == 1, [e["type"] for e in mine]
        assert [e["sequence"] for e in mine] == list(range(1, len(mine) + 1))  # one gap-free sequence
        assert {e["_partition"] for e in mine} == {partition_for(r, settings.partitions)}
        assert not events.of(r, "RunRejected"), events.of(r, "RunRejected")
    assert [e["type"] for e in terminal_of(events.records, to_cancel)] == ["RunCancelled"]
    for r in runs[1:]:
        assert [e["type"] for e in terminal_of(events.records, r)] == ["RunSucceeded"]
    forwarded = next(
        line
        for line in metrics.splitlines()
        if line.startswith("runfold_processor_misrouted_inputs_total{") and "commands" in line
    )
    assert float(forwarded.rsplit(" ", 1)[1]) == len(runs) + 1  # the starts and the cancel
    events.close()


def test_wrong_time_units_and_invalid_json_get_a_rejection_the_client_sees(
    settings: ProcessorSettings,
) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    dead = Reader(settings, [settings.topics.dead_letters], "dead_letters")
    cmd = Commands(settings)
    now = time.time_ns() // 1_000_000
    start = {"type": "StartRun", "definition_id": "one", "revision": None, "input": {"a": 1}}
    with running(settings), Responder(settings, lambda c, a: None):
        cmd.send("commands", "secs", {**start, "ts_ms": now // 1000})  # seconds, not milliseconds
        cmd.send("commands", "ahead", {**start, "ts_ms": now + 3_600_000})  # a clock an hour ahead
        raw = CODEC.encode("commands", {"run_id": "badjson", "ts_ms": now, "record_id": "x", **start})
        cmd.raw(settings.topics.commands, b"badjson", raw.replace(b'{"a":1}', b"{'a':1}"))
        # a host whose whole clock is an hour ahead: its client's CreateTime agrees with its ts_ms,
        # but the topic keeps the broker's append time (LogAppendTime), which does not
        skewed = CODEC.encode(
            "commands", {"run_id": "skewed", "ts_ms": now + 3_600_000, "record_id": "y", **start}
        )
        cmd.producer.produce(
            settings.topics.commands,
            skewed,
            b"skewed",
            timestamp=now + 3_600_000,
            partition=partition_for("skewed", settings.partitions),
        )
        cmd.flush()
        events.wait_for(
            lambda evs: (
                {e["run_id"] for e in evs if e["type"] == "RunRejected"}
                >= {"secs", "ahead", "badjson", "skewed"}
            ),
            what="four rejections",
        )
    by_run = {e["run_id"]: e for e in events.records if e["type"] == "RunRejected"}
    assert "looks like seconds" in by_run["secs"]["reason"] and by_run["secs"]["code"] == "InvalidInput"
    assert " s after the record's Kafka timestamp" in by_run["ahead"]["reason"]
    assert " s after the record's Kafka timestamp" in by_run["skewed"]["reason"]
    assert by_run["badjson"]["reason"].startswith("StartRun.input is not valid JSON text")
    assert not [e for e in events.records if e["type"] == "RunAccepted"]
    assert all(e["ts_ms"] > now - 60_000 for e in events.records)  # no 1970 timestamps
    assert not [d for d in dead.drain(0.5) if d["key"] == b"badjson"]
    events.close()
    dead.close()


def test_commands_compressed_with_any_kafka_codec_are_read(settings: ProcessorSettings) -> None:
    """docs/contract.md, Compression: a service may produce with any codec."""
    from confluent_kafka import Producer

    events = Reader(settings, [settings.topics.run_events], "run_events")
    codecs = ("none", "gzip", "snappy", "lz4", "zstd")
    with running(settings), Responder(settings, lambda c, a: None):
        for codec in codecs:
            producer = Producer(producer_config(settings, linger_ms=0, compression_type=codec))
            msg = {
                "type": "StartRun",
                "run_id": f"z-{codec}",
                "ts_ms": time.time_ns() // 1_000_000,
                "record_id": codec,
                "definition_id": "one",
                "revision": None,
                "input": {"codec": codec},
            }
            producer.produce(settings.topics.commands, CODEC.encode("commands", msg), msg["run_id"].encode())
            assert producer.flush(30) == 0
        events.wait_for(
            lambda evs: (
                {e["run_id"] for e in evs if e["type"] == "RunAccepted"} >= {f"z-{c}" for c in codecs}
            ),
            what="a RunAccepted per codec",
        )
    events.close()
