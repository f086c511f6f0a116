"""Display folds over run events: what `runs watch` and the demo show while runs progress.

These are read models for people, not workflow semantics (the engine's `evolve` is the
only source of truth for run state): they keep just enough to draw a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.engine.vocabulary import TERMINAL_EVENTS

_STEP_STATUS = {
    "StepScheduled": "scheduled",
    "StepStarted": "running",
    "StepLeaseExtended": "running",
    "StepSucceeded": "succeeded",
    "StepFailed": "failed",
    "StepRetryScheduled": "retry_wait",
    "StepCancelled": "cancelled",
}
_RUN_STATUS = {
    "RunAccepted": "queued",
    "RunStarted": "running",
    "RunWaiting": "waiting",
    "RunPaused": "paused",
    "RunResumed": "running",
    "SignalReceived": "running",
    **TERMINAL_EVENTS,
}


@dataclass
class StepRow:
    node: str
    lineage: str
    status: str = "scheduled"
    attempt: int = 1
    kind: str = ""
    worker: str = ""
    started_ms: int | None = None
    finished_ms: int | None = None
    detail: str = ""

    @property
    def label(self) -> str:
        return f"{self.node}[{self.lineage}]" if self.lineage else self.node

    @property
    def duration_ms(self) -> int | None:
        if self.started_ms is None or self.finished_ms is None:
            return None
        return self.finished_ms - self.started_ms


@dataclass
class StepBoard:
    """One run's steps, folded from its events in order."""

    run_id: str
    status: str = "unknown"
    definition: str = ""
    sequence: int = 0
    superstep: int = 0
    steps: dict[tuple[str, str], StepRow] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # budget warnings, signals, waits, outcome
    usage: dict[str, int] = field(default_factory=dict)
    output: Any = None
    failure: dict[str, Any] | None = None

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        self.sequence = max(self.sequence, ev.get("sequence") or 0)
        if kind in _RUN_STATUS:
            self.status = _RUN_STATUS[kind]
        if kind == "RunAccepted":
            self.definition = f"{ev['definition_id']}@{ev['revision']}"
        elif kind == "RunRejected":
            self.status = "rejected"
            self.notes.append(f"rejected: {ev['code']}: {ev['reason']}")
        elif kind == "StepScheduled":
            row = self.steps.get((ev["node"], ev["lineage"]))
            if row is None:
                row = self.steps[(ev["node"], ev["lineage"])] = StepRow(ev["node"], ev["lineage"])
            row.status, row.attempt, row.kind = "scheduled", ev["attempt"], ev["kind"]
            row.started_ms, row.finished_ms, row.detail = ev["ts_ms"], None, ""
            self.superstep = max(self.superstep, ev.get("superstep") or 0)
        elif kind == "StepSkipped":
            self.steps[(ev["node"], ev["lineage"])] = StepRow(
                ev["node"], ev["lineage"], "skipped", detail=ev["reason"]
            )
        elif kind in _STEP_STATUS:
            row = self.steps.setdefault((ev["node"], ev["lineage"]), StepRow(ev["node"], ev["lineage"]))
            row.status, row.attempt = _STEP_STATUS[kind], ev.get("attempt", row.attempt)
            if ev.get("worker_id"):
                row.worker = ev["worker_id"]
            if kind in ("StepSucceeded", "StepFailed", "StepCancelled"):
                row.finished_ms = ev["ts_ms"]
            if kind == "StepFailed":
                f = ev["failure"]
                row.detail = f"{f['code']}: {f['message']}"[:120]
            elif kind == "StepRetryScheduled":
                row.detail = f"retry as attempt {ev['next_attempt']}"
            elif kind == "StepCancelled":
                row.detail = ev.get("reason", "")
        elif kind == "RunWaiting":
            self.notes.append(f"waiting for signal {ev['signal']!r} at {ev['node']}")
            row = self.steps.get((ev["node"], ev["lineage"]))
            if row is not None:
                row.status = "waiting"
        elif kind == "SignalReceived":
            self.notes.append(f"signal {ev['signal']!r} received")
        elif kind in ("BudgetWarning", "BudgetExhausted"):
            word = "warning" if kind == "BudgetWarning" else "exhausted"
            self.notes.append(f"budget {word}: {ev['dimension']} {ev['used']}/{ev['limit']}")
        elif kind == "RunPaused":
            self.notes.append(f"paused: {ev['code']}: {ev['reason']}")
        elif kind in TERMINAL_EVENTS:
            self.usage = dict(ev.get("usage") or {})
            self.output = ev.get("output")
            self.failure = ev.get("failure")
            if self.failure:
                self.notes.append(f"failed: {self.failure['code']}: {self.failure['message']}"[:200])

    def rows(self) -> list[StepRow]:
        return [self.steps[k] for k in sorted(self.steps, key=lambda k: (k[0], int(k[1]) if k[1] else -1))]


@dataclass
class RunBoard:
    """Many runs at a glance: status, steps done, usage; folded from the events of all runs."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        run = self.runs.get(ev["run_id"])
        if run is None:
            run = self.runs[ev["run_id"]] = {
                "run_id": ev["run_id"],
                "definition": "",
                "status": "unknown",
                "steps_done": 0,
                "retries": 0,
                "warnings": 0,
                "events": 0,
                "first_ms": ev["ts_ms"],
                "last_ms": ev["ts_ms"],
                "usage": {},
                "failure": None,
            }
        run["events"] += 1
        run["last_ms"] = ev["ts_ms"]
        if kind in _RUN_STATUS:
            run["status"] = _RUN_STATUS[kind]
        if kind == "RunAccepted":
            run["definition"] = ev["definition_id"]
        elif kind == "RunRejected":
            run["status"] = "rejected"
            run["failure"] = {"code": ev["code"], "message": ev["reason"]}
        elif kind == "StepSucceeded":
            run["steps_done"] += 1
        elif kind == "StepRetryScheduled":
            run["retries"] += 1
        elif kind == "BudgetWarning":
            run["warnings"] += 1
        elif kind in TERMINAL_EVENTS:
            run["usage"] = dict(ev.get("usage") or {})
            run["failure"] = ev.get("failure")

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for run in self.runs.values():
            out[run["status"]] = out.get(run["status"], 0) + 1
        return out
