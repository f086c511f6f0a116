"""One activation a worker holds, from admission to its terminal receipt's delivery: the
record that the worker's parts (runner.py, worker_group.py, receipt_delivery.py) share."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from processors.executors.context import ActionContext


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Entry:
    activation: dict[str, Any]
    tp: tuple[str, int]
    offsets: list[int]
    ctx: ActionContext | None = None
    task: asyncio.Task[None] | None = None
    is_async: bool = True
    next_heartbeat_ms: int = 0
    heartbeat_seq: int = 0
    hard_cancel_ms: int | None = None
    delivery_attempts: int = 0
    substituted: bool = False  # its terminal receipt could not be sent: a failure went instead
    extra: list[tuple[tuple[str, int], int]] = field(default_factory=list)
    label: str = ""  # the action's metric label
    lease_abandoned: bool = False  # past deadline + grace: no more heartbeats
    stop_requested_ms: int | None = None  # when a CancelActivation for it arrived (stop_watch.py)
    stop_reported: bool = False  # its stop_unconfirmed receipt was sent
