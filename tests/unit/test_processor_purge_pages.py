"""The loop's purge passes over a backlog of finished runs: a full page from every partition
while the processor is idle; after a transaction that folded input, a tenth of a page plus its
inputs in all, partition after partition in turn (no broker: the Kafka calls of a pass are
recorded, the stores are real)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fold_rig import RETENTION, TS, Rig, completed, start

from processors.runtime.loop import Processor
from processors.runtime.settings import ProcessorSettings


class _Ready:
    def __init__(self, stores: list[Any]) -> None:
        self.stores = stores

    def ready(self) -> list[Any]:
        return self.stores


def _backlog(path: Path, ids: list[str], partition: int = 0) -> Any:
    """A store holding `ids` as finished runs."""
    rig = Rig(path, partition)
    rig.transaction(*[start(i) for i in ids])
    rig.transaction(*[completed(rig.activation(i), TS + 1) for i in ids])
    return rig.store


def _processor(stores: list[Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Processor, list[bytes | None]]:
    """A processor over `stores` whose purge transactions record their tombstones and, at
    commit, apply the purges to the stores; every run is past its retention."""
    proc = Processor(ProcessorSettings(topic_prefix="t", instance_id="p1"))
    proc.membership.partitions = _Ready(stores)  # type: ignore[assignment]
    proc.housekeeping.purge_page = 10
    tombstones: list[bytes | None] = []
    monkeypatch.setattr(proc.txn, "begin", lambda: None)
    monkeypatch.setattr(proc.txn, "produce", lambda topic, value, key, **kw: tombstones.append(key))

    def commit() -> None:  # what a committed transaction does with the purges: apply them
        for ov in proc.txn.overlays.values():
            ov.write(None)
        proc.txn.reset()

    monkeypatch.setattr(proc.txn, "commit", commit)
    monkeypatch.setattr("processors.runtime.housekeeping.now_ms", lambda: TS + 1 + RETENTION)
    return proc, tombstones


def test_a_backlog_is_purged_in_full_pages_when_idle_and_small_shares_while_input_flows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"r{i}" for i in range(25)]
    store = _backlog(tmp_path / "p0", ids)
    proc, tombstones = _processor([store], monkeypatch)
    proc.housekeeping.purge_finished(folded=1)
    assert len(tombstones) == 2 and proc.housekeeping.purge_more  # a tenth of the page + 1: more follow
    proc.housekeeping.purge_finished(folded=3)
    assert len(tombstones) == 6 and proc.housekeeping.purge_more  # a tenth of the page + the 3 inputs
    proc.housekeeping.purge_finished(folded=0)
    assert len(tombstones) == 16 and proc.housekeeping.purge_more
    proc.housekeeping.purge_finished(folded=0)
    assert len(tombstones) == 25 and not proc.housekeeping.purge_more  # a partial page: the backlog is gone
    assert sorted(k.decode() for k in tombstones if k) == sorted(ids)
    assert all(store.state_bytes(i) is None and store.purged_status(i) == "succeeded" for i in ids)
    store.close()


def test_while_input_flows_the_partitions_share_a_pass_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlogs = {0: [f"a{i}" for i in range(5)], 1: [], 2: [f"c{i}" for i in range(4)]}
    stores = [_backlog(tmp_path / f"p{p}", ids, p) for p, ids in backlogs.items()]
    proc, tombstones = _processor(stores, monkeypatch)
    purged: list[list[str]] = []
    for _ in range(6):
        before = len(tombstones)
        proc.housekeeping.purge_finished(folded=1)
        purged.append(sorted(k.decode() for k in tombstones[before:] if k))
    # two runs a pass (a tenth of 10, + 1 input), from the next partition with due runs:
    # 0, 2, 0, 2, then partition 0's last; then none
    assert [sorted({r[0] for r in p}) for p in purged] == [["a"], ["c"], ["a"], ["c"], ["a"], []]
    assert [len(p) for p in purged] == [2, 2, 2, 2, 1, 0] and not proc.housekeeping.purge_more
    assert sorted(r for p in purged for r in p) == sorted(backlogs[0] + backlogs[2])
    for s in stores:
        s.close()


def test_a_transaction_with_more_inputs_than_a_tenth_of_a_page_lets_a_pass_span_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlogs = {0: ["a0", "a1", "a2"], 1: [], 2: ["c0", "c1"]}
    stores = [_backlog(tmp_path / f"p{p}", ids, p) for p, ids in backlogs.items()]
    proc, tombstones = _processor(stores, monkeypatch)
    proc.housekeeping.purge_finished(folded=3)  # four in all: partition 0's three, then one of partition 2's
    assert (
        sorted(k.decode() for k in tombstones if k) == ["a0", "a1", "a2", "c0"]
        and proc.housekeeping.purge_more
    )
    proc.housekeeping.purge_finished(folded=3)  # the rest: fewer than four, so nothing more is due
    assert sorted(k.decode() for k in tombstones if k) == ["a0", "a1", "a2", "c0", "c1"]
    assert not proc.housekeeping.purge_more
    for s in stores:
        s.close()


class _Msg:
    def error(self) -> None:
        return None


class _Consumer:
    """Hands the loop `script[i]` messages at its i-th poll or consume."""

    def __init__(self, script: list[int]) -> None:
        self.script = script

    def poll(self, timeout: float) -> _Msg | None:
        return _Msg() if self.script and self.script.pop(0) else None

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return [_Msg() for _ in range(min(self.script.pop(0) if self.script else 0, n))]


def _looping(proc: Processor, script: list[int], fold: Any) -> None:
    """`proc` ready to `_iterate` over `script` with `fold` for `_fold`."""
    proc.settings = proc.settings.model_copy(update={"finished_retention_ms": RETENTION})
    proc.membership.consumer = _Consumer(script)  # type: ignore[assignment]
    proc._definitions = type("Definitions", (), {"poll": lambda self: None})()  # type: ignore[assignment]
    proc.partitions.restoring = set()  # type: ignore[union-attr]
    proc.housekeeping.next_lag = time.monotonic() + 100
    proc._fold = fold  # type: ignore[method-assign]


@pytest.mark.parametrize("aborted", [False, True])
def test_the_loop_sizes_the_pass_by_the_transaction_it_committed_or_aborted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aborted: bool
) -> None:
    stores = [_backlog(tmp_path / f"p{p}", [f"r{p}-{i}" for i in range(25)], p) for p in range(3)]
    proc, tombstones = _processor(stores, monkeypatch)

    def fold(msgs: list[Any]) -> None:  # what _fold does to the transaction's bookkeeping
        if aborted:  # a produce failed: _abort resets it, the inputs are replayed later
            proc.txn.reset()
            return
        if not proc.txn.open:
            proc.txn.open, proc.txn.deadline = True, time.monotonic() + 60
        proc.txn.records += len(msgs)

    _looping(proc, [1, 4, 0], fold)  # 1 polled, 4 buffered; then nothing: the commit comes then
    proc.housekeeping.next_purge = 0.0  # a pass is due as soon as no transaction is open
    proc._iterate()  # folds 5 (or aborts them: then the pass comes at once)
    if not aborted:
        assert proc.txn.open and tombstones == []
        proc._iterate()  # an empty consume: commit, then the pass
    # a tenth of the page (1) + the 5 inputs, from partitions 0 and 1; not a page from each (30)
    assert not proc.txn.open and len(tombstones) == 6
    for s in stores:
        s.close()
