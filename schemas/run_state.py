"""Purged-run markers on `<p>.run-state`: a run's id stays in the compacted table after it is
purged, so a store rebuilt from run-state (or a reader of the table) knows every id ever used.

A marker is a RunStateSnapshot whose `status` is `purged` and whose `state` is
`{"purged": "<the run's final status>"}` (no run state: `state_digest` is empty, `sequence`
0). Before markers, a purge wrote a tombstone and the id was forgotten. Every reader of
run-state treats a marker as it treated a tombstone (no run), except the processor's restore,
which keeps the id taken (a StartRun under it is rejected `Conflict`).
"""

from __future__ import annotations

from typing import Any

PURGED = "purged"


def purged_marker(run_id: str, final_status: str, ts_ms: int) -> dict[str, Any]:
    """The RunStateSnapshot record that replaces a purged run's snapshot."""
    return {
        "run_id": run_id,
        "sequence": 0,
        "ts_ms": ts_ms,
        "status": PURGED,
        "definition_id": "",
        "revision": 0,
        "state_digest": "",
        "state": {PURGED: final_status},
    }


def purged_status(snapshot: dict[str, Any]) -> str | None:
    """The final status of the purged run a decoded snapshot marks, or None: a run's state."""
    if snapshot.get("status") != PURGED:
        return None
    state = snapshot.get("state")
    status = state.get(PURGED) if isinstance(state, dict) else None
    return status if isinstance(status, str) else PURGED
