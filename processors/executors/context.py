"""`ActionContext`: what a handler knows about the activation it runs, and how it talks back."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from processors.executors.errors import Cancelled
from processors.executors.secrets import SecretResolver

log = logging.getLogger("runfold.worker")


class ActionContext:
    """Per-activation context, handed to the handler as its first argument.

    `idempotency_key` is the activation's `dispatch_id`: stable across redeliveries of the
    *same attempt*, different for every attempt. To dedupe a side effect across attempts,
    key it on `(run_id, node, lineage)` instead (`ctx.step_key`).
    """

    def __init__(
        self,
        activation: dict[str, Any],
        secrets: SecretResolver,
        worker_id: str,
        request_heartbeat: Callable[[], None] | None = None,
    ) -> None:
        self.activation = activation
        self.run_id: str = activation["run_id"]
        self.node: str = activation["node"]
        self.lineage: str = activation.get("lineage") or ""
        self.attempt: int = int(activation["attempt"])
        self.dispatch_id: str = activation["dispatch_id"]
        self.definition_id: str = activation.get("definition_id") or ""
        self.root_run_id: str = activation.get("root_run_id") or self.run_id
        self.action: str = activation.get("action") or ""
        self.kind: str = activation.get("kind") or "action"
        self.queue: str = activation.get("queue") or ""
        self.deadline_ms: int | None = activation.get("deadline_ms")
        self.capabilities: frozenset[str] = frozenset(activation.get("capabilities") or ())
        self.secrets = secrets
        self.worker_id = worker_id
        self._is_cancelled = False
        self._cancelled_event: threading.Event | None = None  # made on first use: Events are costly
        self._lock = threading.Lock()
        self.cancel_reason = ""
        # why the handler was asked to stop: "cancel" (a CancelActivation notice),
        # "deadline" (deadline_ms passed) or "shutdown" (the worker is draining)
        self.cancel_kind = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_micros = 0
        self.log = logging.LoggerAdapter(log, {"run_id": self.run_id, "node": self.node})
        self._request_heartbeat = request_heartbeat
        self._async_cancelled: asyncio.Event | None = None

    @property
    def idempotency_key(self) -> str:
        return self.dispatch_id

    @property
    def step_key(self) -> str:
        """Identity of the node instance across attempts: `run_id/node[lineage]`."""
        return f"{self.run_id}/{self.node}[{self.lineage}]" if self.lineage else f"{self.run_id}/{self.node}"

    def remaining_ms(self) -> int | None:
        """Milliseconds left before the deadline (may be negative), or None without one."""
        if self.deadline_ms is None:
            return None
        return int(self.deadline_ms - time.time() * 1000)

    def usage(self, prompt_tokens: int = 0, completion_tokens: int = 0, cost_micros: int = 0) -> None:
        """Add usage; the sum goes into the terminal receipt (completed or failed)."""
        self.prompt_tokens += int(prompt_tokens)
        self.completion_tokens += int(completion_tokens)
        self.cost_micros += int(cost_micros)

    def usage_record(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_micros": self.cost_micros,
        }

    def heartbeat(self) -> None:
        """Ask for a heartbeat now (the runner also sends one every `heartbeat_ms`). Thread-safe."""
        if self._request_heartbeat is not None:
            self._request_heartbeat()

    @property
    def cancelled(self) -> threading.Event:
        """Set once the activation is cancelled; a sync handler can `ctx.cancelled.wait(timeout)`."""
        with self._lock:
            if self._cancelled_event is None:
                self._cancelled_event = threading.Event()
                if self._is_cancelled:
                    self._cancelled_event.set()
            return self._cancelled_event

    @property
    def is_cancelled(self) -> bool:
        return self._is_cancelled

    def check_cancelled(self) -> None:
        """Raise `Cancelled` if the activation was cancelled (or its deadline passed)."""
        if self._is_cancelled:
            raise Cancelled(self.cancel_reason or "cancelled")

    async def wait_cancelled(self) -> None:
        """Return once the activation is cancelled. Only from an async handler (worker loop)."""
        if self._is_cancelled:
            return
        if self._async_cancelled is None:
            self._async_cancelled = asyncio.Event()
        await self._async_cancelled.wait()

    def signal_cancel(self, reason: str, kind: str = "cancel") -> None:
        """Called by the runner on the worker loop thread; the first reason wins."""
        if self._is_cancelled:
            return
        self.cancel_reason = reason
        self.cancel_kind = kind
        with self._lock:
            self._is_cancelled = True
            if self._cancelled_event is not None:
                self._cancelled_event.set()
        if self._async_cancelled is not None:
            self._async_cancelled.set()
