"""A TimerFired comes back as input after the processor fired it: it ends that firing only, never
a timer re-armed under the same id in between (no broker; the fold into a real store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from fold_rig import TS, Rig, fire, start

from processors.runtime.store import timer_ref_key

LEASE_MS = 10_000


def receipt(act: dict[str, Any], rtype: str, ts: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "receipts", {
        "type": rtype,
        "run_id": act["run_id"],
        "ts_ms": ts,
        "record_id": f"{rtype}-{ts}",
        "node": act["node"],
        "lineage": act["lineage"],
        "attempt": act["attempt"],
        "dispatch_id": act["dispatch_id"],
        "worker_id": "w",
        **extra,
    }


def test_a_lease_timer_fired_while_a_heartbeat_waited_in_the_input_survives_its_return(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "s")
    rig.transaction(start("r"))
    act = rig.activation("r")
    rig.transaction(receipt(act, "ActivationAccepted", TS + 100, lease_ms=LEASE_MS))
    rkey = timer_ref_key("r", f"lease_expiry:{act['dispatch_id']}")
    first_due = TS + 100 + LEASE_MS
    # The processor lags behind its input: the lease timer fires at its due time while a
    # heartbeat sent before it still waits in the input.
    [timer] = [t for t in fire(rig, first_due) if t["timer_kind"] == "lease_expiry"]
    assert timer["due_ms"] == first_due and rig.store.get(rkey) is None
    rig.transaction(receipt(act, "ActivationHeartbeat", first_due - 1000, lease_ms=LEASE_MS))
    rearmed = rig.store.get(rkey)
    assert rearmed is not None  # the lease runs on: the timer is armed again, same id, later due
    rig.transaction(("receipts", timer))  # the engine drops it as stale (the lease moved on) ...
    assert rig.store.get(rkey) == rearmed  # ... and the re-armed timer stays
    # and it does fire at its own due time, failing the attempt if no heartbeat came
    [again] = [t for t in fire(rig, first_due - 1000 + LEASE_MS) if t["timer_kind"] == "lease_expiry"]
    assert again["due_ms"] == first_due - 1000 + LEASE_MS
    rig.transaction(("receipts", again))
    state = orjson.loads(rig.store.state_bytes("r"))
    assert (state["steps"]["a"]["status"], state["failure"]["code"]) == ("failed", "Timeout")
    assert "lease expired" in state["failure"]["message"]


def test_a_timer_that_came_back_is_not_fired_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "s")
    rig.transaction(start("r"))
    act = rig.activation("r")
    rig.transaction(receipt(act, "ActivationAccepted", TS + 100, lease_ms=LEASE_MS))
    due = TS + 100 + LEASE_MS
    [timer] = [t for t in fire(rig, due) if t["timer_kind"] == "lease_expiry"]
    rig.transaction(("receipts", timer))
    assert [t for t in fire(rig, due + 1) if t["timer_kind"] == "lease_expiry"] == []
