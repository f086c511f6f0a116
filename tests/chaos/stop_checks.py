"""What the stopping scenarios prove from the handlers' own records (spans_actions.py) and the
committed run events, beside checks.prove:

- `overlaps`: two executions of one step (run, node, lineage) that overlap in time, the earlier
  one not settled by an assumed or unconfirmed stop (`lease_expired`: its worker presumed dead;
  `stop_unconfirmed`: reported as possibly still running). Any other overlap breaks "no two
  attempts of one step run at once".
- `running_at_terminal`: executions still in their handler when their run's RunCancelled was
  made (its `ts_ms`: the receipt or timer that settled the last stop, earlier than its commit),
  other than those whose attempt settled `stop_unconfirmed` (or `lease_expired`). Any other
  breaks "cancelled means stopped".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

# the stops that do not prove the handler returned: the docs' two exceptions
UNPROVEN = frozenset({"stop_unconfirmed", "lease_expired"})
Attempt = tuple[str, str, str, int]  # (run, node, lineage, attempt)


@dataclass(frozen=True)
class Execution:
    run: str
    node: str
    lineage: str
    attempt: int
    pid: int
    start: int
    end: int | None  # None: its handler never returned (its worker was killed or is frozen)
    how: str | None

    @property
    def attempt_key(self) -> Attempt:
        return (self.run, self.node, self.lineage, self.attempt)


def executions(spans_dir: Path) -> list[Execution]:
    """Every handler execution the workers recorded, paired start -> end per (attempt, pid)."""
    starts: dict[tuple[Attempt, int], list[dict[str, Any]]] = {}
    ends: dict[tuple[Attempt, int], list[dict[str, Any]]] = {}
    for path in sorted(spans_dir.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            edge = orjson.loads(line)
            key = ((edge["run"], edge["node"], edge["lineage"], edge["attempt"]), edge["pid"])
            (starts if edge["edge"] == "start" else ends).setdefault(key, []).append(edge)
    out = []
    for key, opened in starts.items():
        closed = ends.get(key, [])
        for i, s in enumerate(opened):  # one worker running one attempt twice: paired in order
            e = closed[i] if i < len(closed) else None
            out.append(
                Execution(
                    *key[0],
                    pid=key[1],
                    start=s["t"],
                    end=None if e is None else e["t"],
                    how=None if e is None else e["how"],
                )
            )
    return out


def settlements(events: list[dict[str, Any]]) -> dict[Attempt, dict[str, Any]]:
    """Each attempt's settling event (StepSucceeded, StepFailed, StepCancelled)."""
    out: dict[Attempt, dict[str, Any]] = {}
    for e in events:
        if e["type"] in ("StepSucceeded", "StepFailed", "StepCancelled"):
            out.setdefault((e["run_id"], e["node"], e["lineage"], e["attempt"]), e)
    return out


def stop_of(settled: dict[Attempt, dict[str, Any]], attempt: Attempt) -> str | None:
    event = settled.get(attempt)
    return None if event is None else event.get("stop")


def overlaps(
    execs: list[Execution], settled: dict[Attempt, dict[str, Any]]
) -> tuple[list[str], Counter[str]]:
    """The violations, and how many overlaps an unproven stop of the earlier attempt excused (only
    across two workers: within one process an overlap is always a violation)."""
    by_step: dict[tuple[str, str, str], list[Execution]] = {}
    for x in execs:
        by_step.setdefault((x.run, x.node, x.lineage), []).append(x)
    bad, excused = [], Counter[str]()
    for step, runs in by_step.items():
        runs.sort(key=lambda x: x.start)
        for i, earlier in enumerate(runs):
            for later in runs[i + 1 :]:
                if earlier.end is not None and later.start >= earlier.end:
                    continue
                stop = stop_of(settled, earlier.attempt_key)
                # one worker never runs two attempts of a step at once, whatever the engine assumed
                # of it (a frozen worker thawed holds the new attempt back until the old one ended)
                if stop in UNPROVEN and later.pid != earlier.pid:
                    excused[stop] += 1
                    continue
                bad.append(
                    f"{step}: attempt {later.attempt} (pid {later.pid}) started at {later.start} while "
                    f"attempt {earlier.attempt} (pid {earlier.pid}) ran until {earlier.end}, settled "
                    f"{settled.get(earlier.attempt_key, {}).get('type')} "
                    f"stop={stop}"
                )
    return bad, excused


def running_at_terminal(
    execs: list[Execution], events: list[dict[str, Any]], settled: dict[Attempt, dict[str, Any]]
) -> tuple[list[str], Counter[str]]:
    """The violations, and how many executions outlived their run's RunCancelled by which stop.

    An attempt settled before the RunCancelled in the log (a run's events are one partition's,
    in order) had ended when the cancel was decided, whatever the clocks say: with no stop to
    wait for, RunCancelled carries the CancelRun's own ts_ms, stamped by its sender, and a
    processor behind on its input folds it later (CI saw 0.8 s) while the run's handlers run."""
    cancelled = {e["run_id"]: (i, e) for i, e in enumerate(events) if e["type"] == "RunCancelled"}
    position = {id(e): i for i, e in enumerate(events)}
    settled_at = {k: position[id(e)] for k, e in settled.items()}
    bad, excused = [], Counter[str]()
    for x in execs:
        if x.run not in cancelled:
            continue
        at, ended = cancelled[x.run]
        if x.end is not None and x.end <= ended["ts_ms"]:
            continue
        stop = stop_of(settled, x.attempt_key)
        if stop is None and settled_at.get(x.attempt_key, len(events)) < at:
            continue  # it had returned and its receipt been folded before the cancel was decided
        if stop in UNPROVEN:
            excused[stop] += 1
            continue
        bad.append(
            f"{x.attempt_key} (pid {x.pid}) ran {x.start}..{x.end} past its RunCancelled at "
            f"{ended['ts_ms']} (stops {ended.get('stops')}); the attempt settled "
            f"{settled.get(x.attempt_key, {}).get('type')} stop={stop}"
        )
    return bad, excused


def stop_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """How the stopping attempts stopped (StepCancelled / StepFailed `stop`), by kind."""
    return dict(
        Counter(
            e["stop"]
            for e in events
            if e["type"] in ("StepCancelled", "StepFailed") and e.get("stop") is not None
        )
    )
