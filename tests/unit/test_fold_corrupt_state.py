"""A run whose stored state cannot be read is charged to the record that meets it (a dead
letter), never an exception out of the fold: the partition must not crash-loop on it. With
retention on, an input first asks whether its run is past its retention (Folder.purge_overdue),
which reads that state too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import fold_bench

from processors.runtime.fold import TxnCounters
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import PartitionStore, state_key
from schemas import Codec
from topology.catalog import TopicNames


@pytest.mark.parametrize("retention_ms", [0, 7 * 24 * 3600 * 1000])
def test_an_unreadable_stored_state_is_a_dead_letter_not_a_crash(tmp_path: Path, retention_ms: int) -> None:
    codec, topics = Codec.default(), TopicNames("t")
    sink = fold_bench.Sink()
    folder = fold_bench.make_folder(codec, topics, sink)
    folder.finished_retention_ms = retention_ms
    store = PartitionStore(tmp_path / "store", 0)
    try:
        store.db[state_key("r-1")] = b"{not json"
        cancel = codec.encoder("commands")(
            {"type": "CancelRun", "run_id": "r-1", "ts_ms": fold_bench.TS, "record_id": "c1", "reason": "x"}
        )
        overlay = PartitionOverlay(store)
        folder.fold_input(overlay, TxnCounters(), topics.commands, 0, 0, b"r-1", cancel)
        assert [t for t, _, _ in sink.out] == [topics.dead_letters], sink.out
    finally:
        store.close()
