"""Adversarial review of the run processor's runtime (docs/runtime.md), without a broker."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
from fold_rig import CODEC, TOPICS, Rig, start

from processors.runtime.settings import ProcessorSettings


def test_a_run_id_longer_than_the_store_keys_hold_is_charged_to_its_record(tmp_path: Path) -> None:
    """docs/runtime.md, "What is charged to a record": "Whatever fails in the first phase is
    **charged to that record**: nothing of it is applied, it goes to the dead letters, its run is
    told, and the transaction goes on with the next record"; a value the store cannot hold is
    `unserializable`, a command's → `RunRejected` `Limit`. A 70,000-byte run id does not fit the
    store's event keys (`e<len:2><run_id><sequence:8>`)."""
    rig = Rig(tmp_path)
    long_id = "L" * 70_000
    rig.transaction(start(long_id), start("ok-1"))  # raised OverflowError out of fold_input before
    events = [CODEC.decode("run_events", v) for v in rig.events()]
    assert [(e["type"], e.get("code")) for e in events if e["run_id"] == long_id] == [
        ("RunRejected", "Limit")
    ]
    assert any(e["run_id"] == "ok-1" and e["type"] == "RunAccepted" for e in events)
    dead = [CODEC.decode("dead_letters", v) for t, v in rig.out if t == TOPICS.dead_letters]
    assert [d["key"] for d in dead] == [long_id.encode()]
    assert rig.store.state_bytes(long_id) is None and rig.store.state_bytes("ok-1") is not None


def test_a_run_id_of_many_byte_characters_is_judged_by_its_bytes(tmp_path: Path) -> None:
    """The same promise for an id under 65,535 characters but over 65,535 UTF-8 bytes."""
    rig = Rig(tmp_path)
    long_id = "é" * 33_000  # 66,000 bytes
    rig.transaction(start(long_id))
    events = [CODEC.decode("run_events", v) for v in rig.events()]
    assert [(e["type"], e.get("code")) for e in events] == [("RunRejected", "Limit")]


@pytest.mark.parametrize("chunk", [1_000_001, 2_000_000])
def test_a_restore_chunk_beyond_what_one_consume_takes_is_a_refused_setting(chunk: int) -> None:
    """docs/runtime.md, "Exit codes": 2 = "settings refused (named field by field with the value
    refused)"; librdkafka's consume() takes at most 1,000,000 records, so a larger
    `restore_chunk` stopped the processor at its first restore (exit 1) instead."""
    with pytest.raises(pydantic.ValidationError, match="restore_chunk"):
        ProcessorSettings(restore_chunk=chunk)
    assert ProcessorSettings(restore_chunk=1_000_000).restore_chunk == 1_000_000
