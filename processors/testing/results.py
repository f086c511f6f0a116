"""`RunResult`: a run as the harness left it (status, output, events, state), and the
assertion helpers a test reads best.

Every assertion raises `AssertionError` with the run's event types in the message, so a failing
test says what happened instead of what did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.engine.ids import instance_key
from processors.engine.state import RunState


@dataclass(frozen=True)
class RunResult:
    """`status`: queued|running|waiting|paused|succeeded|failed|cancelled (run_status), the
    status the run had when the harness stopped; `events`: every run event, in order (the flat
    dicts of docs/messages.md); `record`: the engine's whole run record; `now_ms`: the virtual
    clock then; `children`: the child runs started by this run, by child run id."""

    run_id: str
    status: str
    events: list[dict[str, Any]]
    record: RunState
    now_ms: int
    children: dict[str, RunResult] = field(default_factory=dict)

    # ---- what a test reads -------------------------------------------------------------------
    @property
    def output(self) -> Any:
        """The run's output (its RunSucceeded's), None before it succeeded."""
        for event in reversed(self.events):
            if event["type"] == "RunSucceeded":
                return event.get("output")
        return None

    @property
    def failure(self) -> dict[str, Any] | None:
        """The run's failure (its RunFailed's: code, message, node, lineage), if it failed."""
        for event in reversed(self.events):
            if event["type"] == "RunFailed":
                failure: dict[str, Any] = event["failure"]
                return failure
        return None

    @property
    def state(self) -> dict[str, Any]:
        """The workflow's state (the `state:` keys of the definition), not the engine's record."""
        value: dict[str, Any] = self.record["state"]
        return value

    @property
    def event_types(self) -> list[str]:
        return [event["type"] for event in self.events]

    @property
    def usage(self) -> dict[str, int]:
        ledger: dict[str, int] = self.record["usage"]
        return dict(ledger)

    def events_of(self, etype: str, node: str | None = None) -> list[dict[str, Any]]:
        """The events of one type (of one node, any lineage, when `node` is given)."""
        return [e for e in self.events if e["type"] == etype and (node is None or e.get("node") == node)]

    def step(self, node: str, lineage: str = "") -> dict[str, Any]:
        """The engine's record of one node instance: status, attempt, output, failure, ..."""
        key = instance_key(node, lineage)
        steps: dict[str, dict[str, Any]] = self.record["steps"]
        if key not in steps:
            raise AssertionError(f"node {key!r} never ran in run {self.run_id}; {self._story()}")
        return steps[key]

    def attempts(self, node: str, lineage: str = "") -> int:
        """How many attempts the node instance was scheduled (1 without a retry)."""
        return len([e for e in self.events_of("StepScheduled", node) if (e.get("lineage") or "") == lineage])

    def child(self, node: str, lineage: str = "") -> RunResult:
        """The (last) child run started by a workflow node."""
        prefix = f"{self.run_id}/{instance_key(node, lineage)}"
        found = [r for cid, r in self.children.items() if cid == prefix or cid.startswith(prefix + "#")]
        if not found:
            raise AssertionError(
                f"node {node!r} started no child run; children: {sorted(self.children)}; {self._story()}"
            )
        return found[-1]

    # ---- assertions --------------------------------------------------------------------------
    def assert_status(self, status: str) -> RunResult:
        if self.status != status:
            raise AssertionError(f"run {self.run_id} is {self.status}, expected {status}; {self._story()}")
        return self

    def assert_succeeded(self) -> RunResult:
        return self.assert_status("succeeded")

    def assert_failed(self, code: str | None = None) -> RunResult:
        self.assert_status("failed")
        failure = self.failure or {}
        if code is not None and failure.get("code") != code:
            raise AssertionError(
                f"run {self.run_id} failed with {failure}, expected code {code}; {self._story()}"
            )
        return self

    def assert_step_succeeded(self, node: str, lineage: str = "") -> dict[str, Any]:
        """The node instance succeeded; returns its record (its `output` among the fields)."""
        return self._assert_step(node, lineage, "succeeded")

    def assert_step_failed(self, node: str, code: str | None = None, lineage: str = "") -> dict[str, Any]:
        step = self._assert_step(node, lineage, "failed")
        failure = step.get("failure") or {}
        if code is not None and failure.get("code") != code:
            raise AssertionError(
                f"node {node!r} failed with {failure}, expected code {code}; {self._story()}"
            )
        return step

    def assert_step_skipped(self, node: str, lineage: str = "") -> dict[str, Any]:
        return self._assert_step(node, lineage, "skipped")

    def assert_event(self, etype: str, **fields: Any) -> dict[str, Any]:
        """The first event of that type whose fields equal the given ones; returns it."""
        for event in self.events:
            if event["type"] == etype and all(event.get(k) == v for k, v in fields.items()):
                return event
        raise AssertionError(f"no {etype} event with {fields} in run {self.run_id}; {self._story()}")

    def assert_no_event(self, etype: str) -> None:
        if any(e["type"] == etype for e in self.events):
            raise AssertionError(f"run {self.run_id} has a {etype} event; {self._story()}")

    def _assert_step(self, node: str, lineage: str, status: str) -> dict[str, Any]:
        step = self.step(node, lineage)
        if step["status"] != status:
            raise AssertionError(
                f"node {instance_key(node, lineage)!r} is {step['status']}, expected {status} "
                f"(failure: {step.get('failure')}); {self._story()}"
            )
        return step

    def _story(self) -> str:
        return f"events: {' '.join(self.event_types)}"
