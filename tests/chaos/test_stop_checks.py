"""The stopping scenarios' own checks, on made-up records: they must flag a handler that ran on
after its run was cancelled, and must not flag one whose completion the cancel came after."""

from __future__ import annotations

from typing import Any

from stop_checks import Execution, running_at_terminal, settlements


def _events(order: list[str]) -> list[dict[str, Any]]:
    made = {
        "settled": {"type": "StepSucceeded", "run_id": "r", "node": "a", "lineage": "", "attempt": 1},
        "cancelled": {"type": "RunCancelled", "run_id": "r", "ts_ms": 1_000, "stops": []},
    }
    return [made[name] for name in order]


def test_a_handler_that_returned_before_the_cancel_was_folded_is_not_flagged() -> None:
    # the CancelRun was stamped at 1,000 by its sender and folded after the handler's receipt:
    # RunCancelled carries 1,000 while the handler ran 1,500..1,700
    events = _events(["settled", "cancelled"])
    run = [Execution("r", "a", "", 1, 7, 1_500, 1_700, "returned")]
    bad, _ = running_at_terminal(run, events, settlements(events))
    assert bad == []


def test_a_handler_still_running_at_the_cancel_is_flagged() -> None:
    # the cancel was decided with the attempt unsettled (no stop waited for), the handler ran on
    events = _events(["cancelled", "settled"])
    run = [Execution("r", "a", "", 1, 7, 500, 1_700, "returned")]
    bad, _ = running_at_terminal(run, events, settlements(events))
    assert len(bad) == 1 and "past its RunCancelled" in bad[0]
    never = [Execution("r", "a", "", 1, 7, 500, None, None)]  # and one that never returned
    assert len(running_at_terminal(never, events, settlements(events))[0]) == 1
