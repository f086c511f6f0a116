"""Store, write overlay, timers index and partitioner of the processor runtime (no broker)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from processors.kafka.partitioning import murmur2, partition_for
from processors.runtime.overlay import PartitionOverlay
from processors.runtime.store import NO_OFFSET, ChangeSet, PartitionStore, timer_ref_key


@pytest.fixture
def store(tmp_path: Path):
    s = PartitionStore(tmp_path / "p0", 0)
    yield s
    s.close()


def _timer(run_id: str, timer_id: str, due: int) -> tuple[dict, bytes]:
    body = {
        "type": "TimerFired",
        "timer_id": timer_id,
        "timer_kind": "sleep",
        "due_ms": due,
        "run_id": run_id,
    }
    return body, orjson.dumps(body)


def test_java_murmur2_vectors() -> None:
    # Vectors from Apache Kafka's UtilsTest.testMurmur2 (signed Java ints).
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


def test_partition_for_is_stable_and_in_range() -> None:
    seen = {partition_for(f"run-{i}", 6) for i in range(200)}
    assert seen == set(range(6))
    assert partition_for("run-1", 6) == partition_for(b"run-1", 6)


def test_overlay_is_invisible_until_written_and_survives_reopen(tmp_path: Path) -> None:
    s = PartitionStore(tmp_path / "p3", 3)
    assert s.applied_offset == NO_OFFSET
    ov = PartitionOverlay(s)
    ov.states["r1"] = {"run_id": "r1", "sequence": 2}
    ov.dumped["r1"] = orjson.dumps(ov.states["r1"])
    ov.add_event("r1", 1, b"e1")
    ov.add_event("r1", 2, b"e2")
    ov.add_event("r1", 0, b"rejected")  # sequence 0 belongs to no run log
    assert s.state_bytes("r1") is None  # nothing before the commit
    ov.write(applied_offset=41)
    assert orjson.loads(s.state_bytes("r1") or b"null")["sequence"] == 2
    assert s.events("r1") == [b"e1", b"e2"]
    assert s.events("r1", since=1) == [b"e2"]
    assert s.applied_offset == 41
    s.close()
    again = PartitionStore(tmp_path / "p3", 3)
    assert again.applied_offset == 41 and again.events("r1") == [b"e1", b"e2"]
    again.close()


def test_events_of_runs_sharing_a_prefix_do_not_mix(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.add_event("a", 1, b"a1")
    ov.add_event("ab", 1, b"ab1")
    ov.add_event("a/child", 1, b"c1")
    ov.write(None)
    assert store.events("a") == [b"a1"]
    assert store.events("ab") == [b"ab1"]
    assert store.events("a/child") == [b"c1"]


def test_overlay_reads_its_own_writes_before_the_store(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.states["r"] = {"run_id": "r", "sequence": 1}
    ov.dumped["r"] = orjson.dumps(ov.states["r"])
    ov.write(None)
    second = PartitionOverlay(store)
    assert second.state("r", orjson.loads)["sequence"] == 1
    second.states["r"] = {"run_id": "r", "sequence": 5}
    assert second.state("r", orjson.loads)["sequence"] == 5
    assert orjson.loads(store.state_bytes("r") or b"null")["sequence"] == 1


def test_due_timers_in_due_order_and_stop_at_now(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    for i, due in enumerate([300, 100, 200, 10_000]):
        body, raw = _timer(f"r{i}", f"t{i}", due)
        ov.set_timer(f"r{i}", body, raw)
    ov.write(None)
    assert store.next_due_ms == 100
    assert store.due_timers(50, 100) == []
    due = store.due_timers(300, 100)
    assert [orjson.loads(v)["due_ms"] for _k, v in due] == [100, 200, 300]
    assert len(store.due_timers(300, 2)) == 2


def test_clear_and_reset_timer_are_o1_via_the_reverse_index(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.write(None)
    # moving a stored timer deletes its old index entry
    ov2 = PartitionOverlay(store)
    body, raw = _timer("r", "t", 500)
    ov2.set_timer("r", body, raw)
    ov2.write(None)
    assert [orjson.loads(v)["due_ms"] for _k, v in store.due_timers(1_000, 10)] == [500]
    assert store.pending_timers() == 1
    ov3 = PartitionOverlay(store)
    ov3.clear_timer("r", "t")
    ov3.write(None)
    assert store.pending_timers() == 0 and store.get(timer_ref_key("r", "t")) is None
    # the bound stays a lower bound until it passes (re-seeking at each clear walked tombstones:
    # test_runtime_store_timers.py); then it moves to the truth: no timer left
    assert store.next_due_ms == 100  # the first timer's old due: moved, then cleared
    assert store.due_timers(1_000, 10) == [] and store.next_due_ms is None


def test_fired_timer_is_not_pending_in_its_transaction(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.write(None)
    ov2 = PartitionOverlay(store)
    ((tkey, _v),) = store.due_timers(100, 10)
    assert ov2.timer_pending(timer_ref_key("r", "t"), tkey)
    ov2.clear_timer("r", "t")
    assert not ov2.timer_pending(timer_ref_key("r", "t"), tkey)
    # dropped overlay (abort): the timer is still stored and due
    assert len(store.due_timers(100, 10)) == 1


def test_set_then_clear_in_one_transaction_leaves_nothing(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    body, raw = _timer("r", "t", 100)
    ov.set_timer("r", body, raw)
    ov.clear_timer("r", "t")
    ov.write(None)
    assert store.pending_timers() == 0


def test_stats_accumulate(store: PartitionStore) -> None:
    ov = PartitionOverlay(store)
    ov.count("timers_fired", 2)
    ov.write(None)
    ov = PartitionOverlay(store)
    ov.count("timers_fired", 3)
    ov.write(None)
    assert store.stats["timers_fired"] == 5


def test_state_cache_keeps_the_most_recently_written_runs_and_drops_finished_ones(tmp_path: Path) -> None:
    from rocksdict import WriteBatch

    s = PartitionStore(tmp_path / "p0", 0, cache_runs=10)

    def write(*run_ids: str, status: str = "running") -> None:
        s.apply(
            ChangeSet(
                WriteBatch(raw_mode=True), states={r: {"run_id": r, "status": status} for r in run_ids}
            ),
            None,
        )

    write(*(f"r{i}" for i in range(10)))
    write("r0")  # written again: now the most recent
    write("r10")  # one over: the least recently written go, a tenth more than the excess
    assert list(s.cache) == ["r3", "r4", "r5", "r6", "r7", "r8", "r9", "r0", "r10"]
    write("r5", status="succeeded")  # a finished run is not kept
    assert "r5" not in s.cache and len(s.cache) == 8
    s.close()
    none = PartitionStore(tmp_path / "p1", 1, cache_runs=0)
    none.apply(ChangeSet(WriteBatch(raw_mode=True), states={"a": {"run_id": "a", "status": "running"}}), None)
    assert none.cache == {}
    none.close()


def test_recently_written_timer_references_agree_with_the_database(
    store: PartitionStore, monkeypatch
) -> None:
    import processors.runtime.store as store_module

    monkeypatch.setattr(store_module, "TIMER_REF_CACHE", 3)  # evictions happen too
    refs = [timer_ref_key(f"r{i}", "t") for i in range(5)]

    def agree() -> None:
        for rkey in refs:
            assert store.timer_ref(rkey) == store.get(rkey)

    for due in (100, 200):  # arm, then move every timer (the old t-keys go)
        ov = PartitionOverlay(store)
        for i in range(5):
            ov.set_timer(f"r{i}", *_timer(f"r{i}", "t", due + i))
        ov.write(None)
        agree()
        assert store.pending_timers() == 5 and len(store.timer_refs) <= 3
    ov = PartitionOverlay(store)
    ov.clear_timer("r4", "t")  # cleared and re-armed in one transaction: the put wins
    ov.set_timer("r4", *_timer("r4", "t", 900))
    ov.clear_timer("r3", "t")
    ov.write(None)
    agree()
    assert store.timer_ref(refs[3]) is None and store.timer_ref(refs[4]) is not None
    ov = PartitionOverlay(store)  # a purge deletes the run's timers with it
    ov.purge(b"x" + (0).to_bytes(8, "big") + b"r4", "r4", "succeeded")
    ov.write(None)
    agree()
    assert store.timer_ref(refs[4]) is None and store.pending_timers() == 3
