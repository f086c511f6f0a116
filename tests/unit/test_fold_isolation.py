"""One bad record never stops a partition: whatever goes wrong folding one input (decode, decide,
evolve, effects, encoding, state serialization, the store batch) is charged to it. Nothing of it
is applied, it is in the dead letters with its coordinates and the reason, its run is told (the
command rejected, the attempt failed, or the run failed), and the transaction's other records
are folded, snapshotted and written as usual.

Before: a run input, action output or signal payload nested 251-252 levels passed every check and
`Folder.snapshots` raised `TypeError: Recursion limit reached` at commit, outside the per-record
guard (the processor exited, and crash-looped on the same record); at 253 levels, or for an
engine exception, the record was dead-lettered but its run never heard (a step waiting for good).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from fold_rig import CODEC, TOPICS, TS, Rig, completed, contents, restore, start, state, stopped

from processors.engine import Ceilings
from processors.runtime import fold as fold_module
from processors.runtime.fold import TxnCounters
from processors.runtime.overlay import PartitionOverlay

WF = "runfold.workflow/v1"
WAITER = {
    "schema": WF,
    "id": "waiter",
    "revision": 1,
    "entry": ["w"],
    "state": {"p": None},
    "nodes": {"w": {"kind": "wait", "signal": "go", "writes": {"p": {"from": "signal"}}}},
}
SUM2 = {
    "schema": WF,
    "id": "sum2",
    "revision": 1,
    "entry": ["a", "b"],
    "state": {"t": 0},
    "reducers": {"t": "sum"},
    "nodes": {n: {"kind": "action", "action": n, "writes": {"t": {"from": "output"}}} for n in "ab"},
}
SLOW = {
    "schema": WF,
    "id": "slow",
    "revision": 1,
    "entry": ["a"],
    "state": {},
    "nodes": {"a": {"kind": "action", "action": "a", "timeout_ms": 2**63}},
}


@pytest.fixture
def no_engine_depth_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine refuses JSON nested past `max_json_depth` at every ingress (nesting.py); the
    runtime must be safe even when such a check is missing, so these tests lift the ceiling far
    past its bound (`Ceilings` refuses that, hence the frozen instance is bypassed): the check
    then passes every value and only the runtime's serializer stands. A ceiling, not a patched
    function: the compiled engine's calls are bound at build time and never see a patch."""
    lift_depth_ceiling(monkeypatch)


def lift_depth_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Ceilings.__post_init__

    def unbounded(self: Ceilings) -> None:
        real(self)
        object.__setattr__(self, "max_json_depth", 100_000)

    monkeypatch.setattr(Ceilings, "__post_init__", unbounded)


def deep(n: int) -> Any:
    v: Any = {}
    for _ in range(n):
        v = {"a": v}
    return v


class Txn:
    """One transaction of a Rig, whose outputs are kept apart and decoded."""

    def __init__(self, rig: Rig, *inputs: tuple[str, dict[str, Any]]) -> None:
        before = len(rig.out)
        rig.transaction(*inputs)  # raises if anything escapes the per-record guard
        self.out = rig.out[before:]

    def events(self, run_id: str | None = None) -> list[dict[str, Any]]:
        evs = [CODEC.decode("run_events", v) for t, v in self.out if t == TOPICS.run_events]
        return [e for e in evs if run_id is None or e["run_id"] == run_id]

    def dead(self) -> list[dict[str, Any]]:
        return [CODEC.decode("dead_letters", v) for t, v in self.out if t == TOPICS.dead_letters]

    def snapshots(self) -> dict[str, dict[str, Any]]:
        return {
            s["run_id"]: s
            for s in (CODEC.decode("run_state", v) for t, v in self.out if t == TOPICS.run_state)
        }


def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path / "s")
    for d in (WAITER, SUM2, SLOW):
        r.folder.ctx.catalog.register(d)
    return r


def assert_charged(txn: Txn, offset: int, fragment: str) -> dict[str, Any]:
    [dead] = txn.dead()
    assert (dead["source_partition"], dead["source_offset"]) == (0, offset)
    assert fragment in dead["error"], dead["error"]
    assert dead["original"], "the dead letter keeps the record's bytes"
    return dead


@pytest.mark.usefixtures("no_engine_depth_check")
@pytest.mark.parametrize("depth", [251, 252, 253])
def test_a_deep_start_input_is_rejected_and_the_rest_of_the_batch_goes_on(tmp_path: Path, depth: int) -> None:
    r = rig(tmp_path)
    bad = ("commands", {**start("deep")[1], "input": deep(depth)})
    txn = Txn(r, start("ok-1"), bad, start("ok-2"))
    dead = assert_charged(txn, 1, "cannot be serialized")
    assert "Recursion limit" in dead["error"] or "nest" in dead["error"]
    [rejected] = txn.events("deep")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Limit", rejected
    assert "cannot store" in rejected["reason"] and "dead letters" in rejected["reason"]
    assert r.store.state_bytes("deep") is None and "deep" not in txn.snapshots()
    for ok in ("ok-1", "ok-2"):  # folded, snapshotted and written as if the poison were not there
        assert [e["type"] for e in txn.events(ok)] == ["RunAccepted", "RunStarted", "StepScheduled"]
        assert state(r.store, ok)["status"] == "running" and ok in txn.snapshots()


@pytest.mark.usefixtures("no_engine_depth_check")
@pytest.mark.parametrize("depth", [251, 252, 253])
def test_a_deep_action_output_fails_its_attempt_and_the_run_not_the_partition(
    tmp_path: Path, depth: int
) -> None:
    r = rig(tmp_path)
    Txn(r, start("r"), start("ok"))
    kind, receipt = completed(r.activation("r"), TS + 1)
    receipt["output"] = deep(depth)
    txn = Txn(r, (kind, receipt), completed(r.activation("ok"), TS + 1))
    assert_charged(txn, 0, "")
    types = [e["type"] for e in txn.events("r")]
    assert types == ["StepFailed", "RunFailed"], types
    failure = txn.events("r")[0]["failure"]
    assert failure["code"] == "InvalidOutput" and failure["retryable"] is False
    assert "cannot store" in failure["message"]
    assert [e["type"] for e in txn.events("ok")][-1] == "RunSucceeded"
    assert state(r.store, "r")["status"] == "failed"
    restored = restore(r, tmp_path / "restored")
    assert contents(restored) == contents(r.store)
    restored.close()


@pytest.mark.usefixtures("no_engine_depth_check")
@pytest.mark.parametrize("depth", [251, 252, 253])
def test_a_deep_signal_payload_is_rejected_and_the_run_still_waits(tmp_path: Path, depth: int) -> None:
    r = rig(tmp_path)
    Txn(r, ("commands", {**start("w")[1], "definition_id": "waiter"}))
    waiting = r.store.state_bytes("w")
    signal = {
        "type": "SignalRun",
        "run_id": "w",
        "ts_ms": TS + 2,
        "record_id": "s1",
        "signal": "go",
        "payload": deep(depth),
    }
    txn = Txn(r, ("commands", signal))
    assert_charged(txn, 0, "")
    [rejected] = txn.events("w")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Limit"
    assert r.store.state_bytes("w") == waiting  # nothing of the signal was applied
    ok = {**signal, "record_id": "s2", "payload": {"fine": True}}
    assert [e["type"] for e in Txn(r, ("commands", ok)).events("w")][-1] == "RunSucceeded"


def test_a_value_the_engines_own_serializer_refuses_fails_the_attempt(tmp_path: Path) -> None:
    """Two outputs of 2**64 - 1 summed into one state key: the engine's own size check raises
    (TypeError: Integer exceeds 64-bit range) while merging the superstep; the run fails and the
    partition goes on."""
    r = rig(tmp_path)
    Txn(r, ("commands", {**start("s")[1], "definition_id": "sum2"}))
    acts = [CODEC.decode("activations", v) for t, v in r.out if t == TOPICS.activations("default")]
    receipts = []
    for a in acts:
        kind, receipt = completed(a, TS + 1)
        receipts.append((kind, {**receipt, "output": 2**64 - 1}))
    txn = Txn(r, *receipts, start("ok"))
    dead = assert_charged(txn, 1, "TypeError while folding ActivationCompleted")
    assert "64-bit" in dead["error"]
    types = [e["type"] for e in txn.events("s")]
    assert types[-1] == "RunFailed", types
    [step_failed] = [e for e in txn.events("s") if e["type"] == "StepFailed"]
    assert step_failed["failure"]["code"] == "InvalidOutput" and step_failed["failure"]["retryable"] is False
    assert [e["type"] for e in txn.events("ok")][-1] == "StepScheduled"


def test_a_timer_beyond_64_bits_rejects_the_start_instead_of_leaving_it_unanswered(tmp_path: Path) -> None:
    r = rig(tmp_path)
    txn = Txn(r, ("commands", {**start("t")[1], "definition_id": "slow"}))
    assert_charged(txn, 0, "")
    [rejected] = txn.events("t")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Limit"


# The runtime calls these engine functions on a live record; evolve runs inside decide (the
# decision carries the state after each event), so a failure of it is a failure of decide.
STAGES = ["decide", "effects", "dump_state"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_at_any_stage_of_a_timers_fold_fails_its_run_and_clears_the_timer(
    tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine functions the fold calls, each made to raise for one run's records only."""
    r = rig(tmp_path)
    Txn(r, start("x"), start("ok"))
    wall = [
        b for b in (orjson.loads(v) for k, v in r.store.db.items() if k[:1] == b"t") if b["run_id"] == "x"
    ]
    [timer_body] = [b for b in wall if b["timer_kind"] == "wall_time"]
    real = getattr(fold_module, stage)

    def broken(*args: Any, **kw: Any) -> Any:
        # only the timer's own fold: its wall-time budget pauses the run (BudgetExhausted, and
        # RunCancelling to RunPaused while `a` stops); the FailRun folded instead (RunCancelling
        # to RunFailed) goes through
        if stage == "decide":
            hit = args[1]["type"] == "TimerFired" and args[1]["run_id"] == "x"
        elif stage == "dump_state":
            hit = args[0]["run_id"] == "x" and (args[0].get("halting") or {}).get("outcome") == "RunPaused"
        else:
            hit = args[1]["run_id"] == "x" and args[1]["type"] == "BudgetExhausted"
        if hit:
            raise (TypeError if stage == "dump_state" else RuntimeError)(f"injected {stage} failure")
        return real(*args, **kw)

    monkeypatch.setattr(fold_module, stage, broken)
    fired = {
        **timer_body,
        "type": "TimerFired",
        "ts_ms": TS + 10,
        "record_id": f"timer:{timer_body['timer_id']}",
    }
    txn = Txn(r, ("receipts", fired), completed(r.activation("ok"), TS + 10))
    dead = assert_charged(txn, 0, "")
    assert f"injected {stage} failure" in dead["error"]
    last = txn.events("x")[-1]
    assert last["type"] == "RunCancelling" and last["outcome"] == "RunFailed"  # `a` may still run
    failed = last["failure"]
    assert (
        failed["code"] == ("Limit" if stage == "dump_state" else "State")
        and "dead letters" in failed["message"]
    )
    assert [e["type"] for e in Txn(r, stopped(r.activation("x"), TS + 20)).events("x")][-1] == "RunFailed"
    assert not [k for k in r.store.db.keys() if k[:1] == b"t" and b"x\x1f" in k], "the fired timer is done"  # noqa: SIM118 (rocksdict)
    assert [e["type"] for e in txn.events("ok")][-1] == "RunSucceeded"


def test_a_record_whose_substitute_fails_too_leaves_only_its_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rig(tmp_path)
    Txn(r, start("x"))
    before = r.store.state_bytes("x")
    real = fold_module.decide
    monkeypatch.setattr(
        fold_module,
        "decide",
        lambda s, m, c: (
            (_ for _ in ()).throw(RuntimeError("always")) if m["run_id"] == "x" else real(s, m, c)
        ),
    )
    txn = Txn(r, completed(r.activation("x"), TS + 1), start("ok"))
    assert [d["source_offset"] for d in txn.dead()] == [0]
    assert txn.events("x") == [] and r.store.state_bytes("x") == before
    assert [e["type"] for e in txn.events("ok")][-1] == "StepScheduled"


def test_a_codec_defect_on_some_bytes_is_a_dead_letter_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rig(tmp_path)
    real = r.folder._decode[TOPICS.commands]
    r.folder._decode[TOPICS.commands] = lambda raw: (
        (_ for _ in ()).throw(IndexError("codec bug")) if b"boom" in raw else real(raw)
    )
    txn = Txn(r, ("commands", {**start("boom")[1]}), start("ok"))
    [dead] = txn.dead()
    assert dead["source_offset"] == 0 and "IndexError: codec bug" in dead["error"]
    assert [e["type"] for e in txn.events("ok")][-1] == "StepScheduled"


def test_with_the_engines_check_in_place_deep_json_is_refused_before_the_runtime_sees_it(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    txn = Txn(r, ("commands", {**start("deep")[1], "input": deep(252)}), start("ok"))
    assert txn.dead() == []
    [rejected] = txn.events("deep")
    assert rejected["code"] == "InvalidInput" and "nests deeper than max_json_depth" in rejected["reason"]


def deep_start(run_id: str, levels: int) -> bytes:
    """A StartRun whose input nests `levels` deep: past what orjson writes (254), so the bytes
    are spliced in where a string of the same JSON length was encoded."""
    kind, msg = start(run_id)
    deep_json = ('{"a":' * levels + "0" + "}" * levels).encode()
    msg["input"] = "x" * (len(deep_json) - 2)  # '"xx…x"' is as long as the deep value's text
    data = CODEC.encode(kind, msg)
    placeholder = orjson.dumps(msg["input"])
    assert data.count(placeholder) == 1
    return data.replace(placeholder, deep_json)


@pytest.mark.parametrize("checked", [True, False], ids=["engine check", "no engine check"])
def test_a_start_input_as_deep_as_the_codec_reads_is_refused_and_the_batch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """1,000 levels, just under the 1,024 the codec decodes. Every recursive walk of a value in
    the engine is bounded before it runs: compiled code raises no RecursionError, so a walk past
    the C stack would crash the process instead of charging the record. With the check, the run
    is rejected with the path and the limit. Without it (the ceiling lifted past what Ceilings
    accepts), the interpreted depth walk runs out of frames and the record is charged, while the
    compiled walk finishes and the size check finds no JSON form orjson can write (its own 254
    levels) and rejects the run; either way the partition goes on."""
    if not checked:
        lift_depth_ceiling(monkeypatch)
    r = rig(tmp_path)
    ov, counters = PartitionOverlay(r.store), TxnCounters()
    records = [CODEC.encode(*start("ok-1")), deep_start("deep", 1_000), CODEC.encode(*start("ok-2"))]
    for offset, (run_id, value) in enumerate(zip(("ok-1", "deep", "ok-2"), records, strict=True)):
        r.folder.fold_input(ov, counters, TOPICS.commands, 0, offset, run_id.encode(), value)
    r.folder.snapshots(ov, 0, counters)
    ov.write(None)
    txn = Txn.__new__(Txn)
    txn.out = r.out
    [rejected] = txn.events("deep")
    assert rejected["type"] == "RunRejected"
    if checked:
        assert rejected["code"] == "InvalidInput"
        assert "nests deeper than max_json_depth 64 at input" in rejected["reason"]
        assert txn.dead() == []
    elif txn.dead():
        assert_charged(txn, 1, "")
    else:
        assert rejected["code"] == "InvalidInput"
        assert "input is not a JSON value (Recursion limit reached)" in rejected["reason"]
    assert r.store.state_bytes("deep") is None
    for ok in ("ok-1", "ok-2"):
        assert [e["type"] for e in txn.events(ok)] == ["RunAccepted", "RunStarted", "StepScheduled"]


@pytest.mark.usefixtures("no_engine_depth_check")
def test_the_dead_letter_of_a_charged_record_names_its_coordinates_and_counts_its_reason(
    tmp_path: Path,
) -> None:
    r = rig(tmp_path)
    ov, counters = PartitionOverlay(r.store), TxnCounters()
    kind, msg = start("deep")
    msg["input"] = deep(252)
    r.folder.fold_input(ov, counters, TOPICS.commands, 3, 77, b"deep", CODEC.encode(kind, msg))
    r.folder.snapshots(ov, 3, counters)
    ov.write(None)
    [dead] = [CODEC.decode("dead_letters", v) for t, v in r.out if t == TOPICS.dead_letters]
    assert (dead["source_topic"], dead["source_partition"], dead["source_offset"], dead["key"]) == (
        TOPICS.commands,
        3,
        77,
        b"deep",
    )
    assert counters.dead == {"unserializable": 1} and counters.rejected == {"Limit": 1}


def test_a_timer_the_store_batch_could_not_hold_is_charged_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store batch's values are computed in the guarded phase: a timer whose JSON cannot be
    written (here made to fail for one run) rejects its start, and nothing of it reaches the store."""

    class Shim:
        @staticmethod
        def dumps(value: Any, *args: Any) -> bytes:
            if isinstance(value, dict) and value.get("run_id") == "x" and "timer_id" in value:
                raise TypeError("Integer exceeds 64-bit range")
            return orjson.dumps(value, *args)

        Fragment = orjson.Fragment

    r = rig(tmp_path)
    monkeypatch.setattr(fold_module, "orjson", Shim)
    txn = Txn(r, start("x"), start("ok"))
    dead = assert_charged(txn, 0, "timer cannot be stored")
    assert "64-bit" in dead["error"]
    [rejected] = txn.events("x")
    assert rejected["type"] == "RunRejected" and rejected["code"] == "Limit"
    assert r.store.state_bytes("x") is None
    assert not [k for k in r.store.db.keys() if b"x\x1f" in k]  # noqa: SIM118 (rocksdict)
    assert state(r.store, "ok")["status"] == "running"
