"""Processor settings, JSON logs and dead-letter records (no broker)."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from processors.runtime import deadletter
from processors.runtime.logs import JsonFormatter
from processors.runtime.settings import ProcessorSettings


def test_defaults_and_derived_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNFOLD_CONFIG", raising=False)
    s = ProcessorSettings(topic_prefix="acme", instance_id="p7")
    assert s.group == "acme-processor"
    assert s.transactional_id == "acme-processor-p7"
    assert s.store_root() == Path(".runfold/state/acme/acme-processor")
    consumer = s.input_consumer_config()
    assert consumer["partition.assignment.strategy"] == "range"
    assert consumer["isolation.level"] == "read_committed" and consumer["enable.auto.commit"] is False
    assert consumer["group.instance.id"] == "acme-processor-p7"
    producer = s.producer_config()
    assert producer["transactional.id"] == "acme-processor-p7"
    # the second producer, used in turn with the first (loop.py); "~" cannot be in an instance id
    assert s.producer_config(1)["transactional.id"] == "acme-processor-p7~1"
    assert s.transactional_ids == ("acme-processor-p7", "acme-processor-p7~1")
    with pytest.raises(ValueError, match="instance_id"):
        ProcessorSettings(topic_prefix="acme", instance_id="p7~1")
    assert producer["partitioner"] == "murmur2_random"
    assert (
        ProcessorSettings(topic_prefix="a", static_membership=False)
        .input_consumer_config()
        .get("group.instance.id")
        is None
    )


def test_consumers_prefetch_8_mib_unless_the_client_overrides_say_otherwise() -> None:
    s = ProcessorSettings(topic_prefix="a")
    for cfg in (s.input_consumer_config(), s.side_consumer_config("restore")):
        assert cfg["queued.max.messages.kbytes"] == 8 * 1024  # librdkafka's default: 64 MiB
    mine = ProcessorSettings(topic_prefix="a", client_overrides={"queued.max.messages.kbytes": "100000"})
    assert mine.input_consumer_config()["queued.max.messages.kbytes"] == "100000"
    assert mine.side_consumer_config("definitions")["queued.max.messages.kbytes"] == "100000"


def test_env_and_config_file_processor_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "runfold.yaml"
    cfg.write_text("kafka:\n  topic_prefix: fromfile\nprocessor:\n  batch_size: 64\n  instance_id: file-id\n")
    monkeypatch.setenv("RUNFOLD_CONFIG", str(cfg))
    monkeypatch.setenv("RUNFOLD_INSTANCE_ID", "env-id")
    s = ProcessorSettings()
    assert s.topic_prefix == "fromfile" and s.batch_size == 64
    assert s.instance_id == "env-id"  # environment wins over the file
    assert ProcessorSettings(instance_id="arg").instance_id == "arg"  # arguments win over both


def test_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNFOLD_CONFIG", raising=False)
    monkeypatch.setenv("RUNFOLD_CLIENT_SASL_PASSWORD", "hunter2")
    s = ProcessorSettings()
    assert s.producer_config()["sasl.password"] == "hunter2"  # passed through to librdkafka
    assert "hunter2" not in orjson.dumps(s.redacted()).decode()
    assert "hunter2" not in repr(s)


def test_invalid_settings_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ProcessorSettings(batch_size=0)


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.LogRecord("runfold.processor", logging.INFO, __file__, 1, "partition ready", None, None)
    record.partition = 3
    line = orjson.loads(JsonFormatter().format(record))
    assert line["event"] == "partition ready" and line["partition"] == 3 and line["level"] == "info"


def test_dead_letter_keeps_coordinates_and_bytes() -> None:
    d = deadletter.dead_letter("p.commands", 2, 41, b"k", b"\x00junk", "cannot decode", 123)
    assert (
        d["record_id"] == "dl:p.commands:2:41"
        and d["original"] == b"\x00junk"
        and d["producer"] == "processor"
    )
    assert deadletter.dead_letter("t", 0, 1, None, None, "x" * 5000, 1)["error"] == "x" * 2000
    assert deadletter.dead_letter("t", 0, 1, None, None, "null", 1)["original"] == b""


def test_alternating_producers_can_be_turned_off() -> None:
    from processors.runtime.loop import Processor

    for alternate, slots in ((True, [1, 0, 1]), (False, [0, 0, 0])):
        proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1", alternate_producers=alternate))
        seen = []
        for _ in range(3):
            proc.producers.advance()
            seen.append(proc.producers.slot)
        assert seen == slots
