"""A cancelled handler that does not stop is reported, not hidden (docs/executors.md, "Stopping").

On a CancelActivation the worker signals the handler (`ctx.cancelled`; an async one is
cancelled hard after `cancel_grace_ms`) and sends ActivationCancelled only once the handler
returned or raised: `confirmed: true`, the stop the engine waits for before it ends the run or
starts the step's next attempt. A handler still running `stop_grace_ms` after the cancel (a sync
one cannot be interrupted; an async one may swallow its cancellation) is reported
`confirmed: false` (`stop_unconfirmed`): the engine stops waiting for it, and says so. The
worker keeps its slot and keeps renewing its lease while the handler runs; when it finally
ends, its own receipt follows (the engine drops it: the attempt was settled).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from processors.executors import receipts
from processors.executors.inflight import Entry


def requested(entry: Entry, now_ms: int) -> None:
    """A CancelActivation reached this running handler (the first one counts)."""
    if entry.stop_requested_ms is None:
        entry.stop_requested_ms = now_ms


def stop_grace_ms(entry: Entry, cancel_grace_ms: int) -> int:
    """How long a handler has to stop: an async one a grace to honour the cancel, then a grace
    after its hard cancel; a sync one (it cannot be interrupted) one grace."""
    return 2 * cancel_grace_ms if entry.is_async else cancel_grace_ms


def unconfirmed(entries: Iterable[Entry], now_ms: int, cancel_grace_ms: int) -> list[Entry]:
    """The handlers past their stop grace, each returned once (marked reported)."""
    out = []
    for entry in entries:
        asked = entry.stop_requested_ms
        if asked is None or entry.stop_reported or entry.task is None or entry.task.done():
            continue
        if now_ms >= asked + stop_grace_ms(entry, cancel_grace_ms):
            entry.stop_reported = True
            out.append(entry)
    return out


def unconfirmed_receipt(entry: Entry, worker_id: str, now_ms: int) -> dict[str, Any]:
    asked = entry.stop_requested_ms or now_ms
    reason = f"stop_unconfirmed: the handler still runs {now_ms - asked} ms after the cancel"
    return receipts.cancelled(entry.activation, worker_id, reason, confirmed=False)
