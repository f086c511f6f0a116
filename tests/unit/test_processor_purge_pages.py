"""The loop's purge passes over a backlog of finished runs: full pages while the processor is
idle, a tenth of a page after an iteration that folded input (no broker: the Kafka calls of a
pass are recorded, the stores are real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fold_rig import RETENTION, TS, Rig, completed, start

from processors.runtime.loop import Processor
from processors.runtime.settings import ProcessorSettings


class _Ready:
    def __init__(self, store: Any) -> None:
        self.store = store

    def ready(self) -> list[Any]:
        return [self.store]


def test_a_backlog_is_purged_in_full_pages_when_idle_and_tenth_pages_while_input_flows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path / "p0")
    ids = [f"r{i}" for i in range(25)]
    rig.transaction(*[start(i) for i in ids])
    rig.transaction(*[completed(rig.activation(i), TS + 1) for i in ids])
    store = rig.store
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1"))
    proc.partitions = _Ready(store)  # type: ignore[assignment]
    proc.purge_page = 10
    tombstones: list[bytes | None] = []
    monkeypatch.setattr(proc, "_begin", lambda: None)
    monkeypatch.setattr(proc, "_produce", lambda topic, value, key, **kw: tombstones.append(key))

    def commit() -> None:  # what a committed transaction does with the purges: apply them
        for ov in proc.txn.overlays.values():
            ov.write(None)
        proc.txn.reset()

    monkeypatch.setattr(proc, "_commit", commit)
    monkeypatch.setattr("processors.runtime.housekeeping.now_ms", lambda: TS + 1 + RETENTION)
    proc._purge_finished(busy=True)
    assert len(tombstones) == 1 and proc._purge_more  # a tenth of the page: more follow at once
    proc._purge_finished(busy=False)
    assert len(tombstones) == 11 and proc._purge_more
    proc._purge_finished(busy=False)
    assert len(tombstones) == 21 and proc._purge_more
    proc._purge_finished(busy=False)
    assert len(tombstones) == 25 and not proc._purge_more  # a partial page: the backlog is gone
    assert sorted(k.decode() for k in tombstones if k) == sorted(ids)
    assert all(store.state_bytes(i) is None and store.purged_status(i) == "succeeded" for i in ids)
    store.close()
