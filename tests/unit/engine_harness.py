"""A small DSL for engine tests: start a run, feed receipts, assert events and state.

Every decision's events are folded with `evolve` and checked with `effects`, exactly as
the runtime does; the harness also keeps the emitted events so a test can re-fold them.
"""

from __future__ import annotations

from typing import Any

import orjson

from processors.engine import (
    Catalog,
    Ceilings,
    Decision,
    EngineContext,
    decide,
    dump_state,
    effects,
    evolve,
)
from processors.engine.ids import dispatch_id, instance_key


def definition(nodes: dict[str, Any], routes: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "schema": "runfold.workflow/v1",
        "id": extra.pop("id", "wf"),
        "revision": extra.pop("revision", 1),
        "entry": extra.pop("entry", [next(iter(nodes))]),
        "nodes": nodes,
        "routes": routes or {},
    }
    raw.update(extra)
    return raw


class RunHarness:
    def __init__(
        self,
        *definitions: dict[str, Any],
        run_id: str = "r-1",
        ceilings: Ceilings | None = None,
        queues: frozenset[str] = frozenset({"default", "agents", "tools"}),
    ) -> None:
        self.catalog = Catalog(ceilings)
        for raw in definitions:
            self.catalog.register(raw)
        self.ctx = EngineContext(catalog=self.catalog, ceilings=ceilings or Ceilings(), queues=queues)
        self.run_id = run_id
        self.state: dict[str, Any] | None = None
        self.now = 1_000_000
        self.log: list[dict[str, Any]] = []  # every event emitted, in order
        self.last: Decision = Decision([], [])
        self.messages: list[dict[str, Any]] = []
        self.timers: dict[str, dict[str, Any]] = {}
        self.root_id = definitions[0]["id"] if definitions else "wf"
        self._record = 0

    # ------------------------------------------------------------------ plumbing
    def send(self, msg: dict[str, Any], advance: int = 10) -> RunHarness:
        self.now += advance
        self._record += 1
        full = {"run_id": self.run_id, "ts_ms": self.now, "record_id": f"in-{self._record}", **msg}
        self.last = decide(self.state, full, self.ctx)
        for event in self.last.events:
            self.state = evolve(self.state, event)
            fx = effects(self.state, event)
            self.messages.extend(fx.messages)
            for timer_id in fx.clear_timers:
                self.timers.pop(timer_id, None)
            for timer in fx.set_timers:
                self.timers[timer["timer_id"]] = timer
            if event["sequence"]:
                self.log.append(event)
        return self

    @property
    def types(self) -> list[str]:
        return [event["type"] for event in self.last.events]

    @property
    def status(self) -> str:
        assert self.state is not None
        from processors.engine import run_status

        return run_status(self.state)

    def step(self, node: str, lineage: str = "") -> dict[str, Any]:
        assert self.state is not None
        return self.state["steps"][instance_key(node, lineage)]

    def ident(self, node: str, lineage: str = "", attempt: int | None = None) -> dict[str, Any]:
        if attempt is None:
            attempt = self.step(node, lineage)["attempt"]
        return {
            "node": node,
            "lineage": lineage,
            "attempt": attempt,
            "dispatch_id": dispatch_id(self.run_id, node, lineage, attempt),
        }

    def refold(self) -> bytes:
        state = None
        for event in self.log:  # decoded copies, as read back from the event topic
            state = evolve(state, orjson.loads(orjson.dumps(event)))
        assert state is not None
        return dump_state(state)

    # -------------------------------------------------------------- commands
    def start(self, run_input: Any = None, **fields: Any) -> RunHarness:
        msg = {
            "type": "StartRun",
            "definition_id": self.root_id,
            "revision": None,
            "input": {} if run_input is None else run_input,
            **fields,
        }
        return self.send(msg)

    # `key`: the command's idempotency_key (None: its record id, unique per send, is the key)
    def cancel(self, reason: str = "", key: str | None = None) -> RunHarness:
        return self.send({"type": "CancelRun", "reason": reason, "idempotency_key": key})

    def signal(self, name: str, payload: Any = None, key: str | None = None) -> RunHarness:
        return self.send({"type": "SignalRun", "signal": name, "payload": payload, "idempotency_key": key})

    def resume(
        self, budgets: dict[str, Any] | None = None, reason: str = "", key: str | None = None
    ) -> RunHarness:
        return self.send({"type": "ResumeRun", "budgets": budgets, "reason": reason, "idempotency_key": key})

    # -------------------------------------------------------------- receipts
    def accept(
        self, node: str, lineage: str = "", worker: str = "w1", lease_ms: int = 30_000, **kw: Any
    ) -> RunHarness:
        return self.send(
            {
                "type": "ActivationAccepted",
                **self.ident(node, lineage),
                "worker_id": worker,
                "lease_ms": lease_ms,
                **kw,
            }
        )

    def heartbeat(
        self, node: str, lineage: str = "", worker: str = "w1", lease_ms: int = 30_000
    ) -> RunHarness:
        return self.send(
            {
                "type": "ActivationHeartbeat",
                **self.ident(node, lineage),
                "worker_id": worker,
                "lease_ms": lease_ms,
            }
        )

    def complete(
        self,
        node: str,
        output: Any = None,
        lineage: str = "",
        usage: dict[str, int] | None = None,
        attempt: int | None = None,
    ) -> RunHarness:
        return self.send(
            {
                "type": "ActivationCompleted",
                **self.ident(node, lineage, attempt),
                "worker_id": "w1",
                "output": output,
                "usage": usage or {},
            }
        )

    def fail(
        self,
        node: str,
        code: str = "ExecutionFailed",
        message: str = "boom",
        retryable: bool = False,
        lineage: str = "",
        attempt: int | None = None,
    ) -> RunHarness:
        return self.send(
            {
                "type": "ActivationFailed",
                **self.ident(node, lineage, attempt),
                "worker_id": "w1",
                "code": code,
                "message": message,
                "retryable": retryable,
                "usage": {},
            }
        )

    def stopped(
        self, node: str, lineage: str = "", confirmed: bool = True, attempt: int | None = None
    ) -> RunHarness:
        """The executor's ActivationCancelled once it joined the handler (or could not)."""
        return self.send(
            {
                "type": "ActivationCancelled",
                **self.ident(node, lineage, attempt),
                "worker_id": "w1",
                "reason": "run cancelled",
                "confirmed": confirmed,
            }
        )

    def stop_all(self) -> RunHarness:
        """Every stopping attempt's executor confirms its stop (a child run: its RunCancelled)."""
        for _key, step in sorted(self.state["steps"].items()):
            if step["status"] != "stopping":
                continue
            if step["kind"] == "workflow":
                self.child_finished(step["node"], status="cancelled", lineage=step["lineage"])
            else:
                self.stopped(step["node"], step["lineage"])
        return self

    def child_finished(
        self,
        node: str,
        status: str = "succeeded",
        output: Any = None,
        lineage: str = "",
        usage: dict[str, int] | None = None,
    ) -> RunHarness:
        ident = self.ident(node, lineage)
        return self.send(
            {
                "type": "ChildRunFinished",
                **ident,
                "child_run_id": f"{self.run_id}/{node}",
                "status": status,
                "output": output,
                "failure": None
                if status == "succeeded"
                else {"code": "ExecutionFailed", "message": "x", "retryable": False},
                "usage": usage or {},
            }
        )

    def fire(self, kind: str, node: str | None = None, lineage: str = "") -> RunHarness:
        """Fire the armed timer of that kind (for that node instance)."""
        for timer in list(self.timers.values()):
            if timer["timer_kind"] == kind and (
                node is None or (timer["node"], timer["lineage"]) == (node, lineage)
            ):
                self.timers.pop(timer["timer_id"])
                advance = max(timer["due_ms"] - self.now, 0)
                return self.send(dict(timer), advance=advance)
        raise AssertionError(f"no armed {kind} timer for {node}[{lineage}]: {sorted(self.timers)}")
