"""One worker never runs two attempts of one step at once (docs/semantics.md, "Stopping"): a
worker frozen past its lease comes back to the old attempt still in its handler and to the
retry's activation; the retry waits in the backlog until the old handler returned."""

from __future__ import annotations

from typing import Any

from processors.executors.inflight import Entry
from processors.executors.runner import WorkerRunner, _step_of


def _activation(attempt: int, node: str = "a") -> dict[str, Any]:
    return {
        "run_id": "r",
        "node": node,
        "lineage": "",
        "attempt": attempt,
        "dispatch_id": f"d{node}{attempt}",
    }


class _Runner:
    """Just the admission state `_start_backlog` reads, with `_start` recording what started."""

    _start_backlog = WorkerRunner._start_backlog

    def __init__(self, running_steps: list[dict[str, Any]]) -> None:
        from collections import Counter, OrderedDict

        self.backlog: OrderedDict[str, Entry] = OrderedDict()
        self.running: dict[str, Entry] = {}
        self.executing = len(running_steps)
        self.concurrency = 8
        self.stopping = False
        self._in_handler = Counter(_step_of(a) for a in running_steps)
        self.started: list[str] = []

    def _start(self, entry: Entry) -> None:
        self.started.append(entry.activation["dispatch_id"])
        self.executing += 1
        self._in_handler[_step_of(entry.activation)] += 1


def test_a_retry_waits_while_the_older_attempt_runs_here_and_others_go_past_it() -> None:
    runner = _Runner([_activation(1)])
    for act in (_activation(2), _activation(1, node="b")):
        runner.backlog[act["dispatch_id"]] = Entry(act, ("t", 0), [0])
    assert runner._start_backlog() is True
    assert runner.started == ["db1"]  # another step's activation is not held behind it
    assert list(runner.backlog) == ["da2"]
    runner._in_handler.pop(("r", "a", ""))  # the old handler returned
    runner.executing -= 1
    runner._start_backlog()
    assert runner.started == ["db1", "da2"] and not runner.backlog
