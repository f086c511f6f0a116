"""`WorkflowEnvironment`: runs definitions in memory on the real engine, with a virtual clock.

What the run processor does for one record is, once its I/O is set aside, `decide` on the run's
state, the states the decision carries, `effects` of each event in order (activations, child
runs, timers armed and cleared), and for a fired timer the timer dropped before the decision's
own timers apply (processors/runtime/fold.py, overlay.py). `_fold` here is exactly that, over
dicts instead of RocksDB and topics. The worker side is the worker runner's (workers.py) and the
child-run side is the child executor's own functions (`start_command`, `finished_receipt`, the
parent step derived from a child's RunAccepted or its id). Nothing of the workflow semantics is
written again here.

Time is virtual: `now_ms` moves only when the environment skips to the next due timer (a retry's
backoff, a lease, a node timeout, a wait's timeout, a sleep, the run's wall time) or when a test
calls `advance`. Every input is folded at the current virtual time, so a 2-minute wait timeout
takes the microseconds its two decisions take. Inputs are folded one at a time in the order
they were produced (one FIFO), which is one of the orders the real system may take.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from processors.client.definitions import load_source
from processors.client.errors import CommandRejected, InvalidDefinition
from processors.engine import (
    Catalog,
    Ceilings,
    Definition,
    DefinitionError,
    EngineContext,
    decide,
    effects,
    run_status,
)
from processors.engine.errors import Issue
from processors.engine.registration import registration_issues
from processors.engine.vocabulary import TERMINAL_EVENTS, TERMINAL_STATUSES, start_run_body
from processors.executors.child_executor import (
    cancel_command,
    expired,
    finished_receipt,
    parent_step_from_id,
    parent_step_from_ref,
    start_command,
)
from processors.executors.secrets import SecretStore
from processors.testing.results import RunResult
from processors.testing.workers import HarnessWorker

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: a plausible epoch-ms clock
DEFAULT_QUEUES = ("default", "agents")  # the processor's default RUNFOLD_ACTIVATION_QUEUES
_COMMAND_TYPES = ("StartRun", "CancelRun", "SignalRun", "ResumeRun")
# A run that never stops (a loop without a budget) must end the test, not hang it.
DEFAULT_MAX_INPUTS = 100_000


class Stuck(AssertionError):
    """The environment folded `max_inputs` inputs without the run settling."""


class SignalsNotSent(AssertionError):
    """`settle(signals)` / `run(signals=...)` ended with signals never sent: the run settled
    without waiting for them (a test that believes it exercised them would pass untested)."""

    def __init__(self, result: RunResult, names: list[str]) -> None:
        self.result = result
        self.names = names
        super().__init__(
            f"run {result.run_id} settled {result.status} and {len(names)} signal(s) were never sent: "
            f"{', '.join(map(repr, names))} (a signal is sent only while the run waits for one; "
            f"use start() and signal() to send one at another time); {result._story()}"
        )


def definition_sources(
    paths: Iterable[str | Path | Mapping[str, Any]],
) -> list[str | Path | Mapping[str, Any]]:
    """Files (YAML/JSON), folders of them (sorted, not recursive) and dicts, flattened."""
    out: list[str | Path | Mapping[str, Any]] = []
    for source in paths:
        if isinstance(source, str | Path) and Path(source).is_dir():
            out.extend(sorted(p for p in Path(source).iterdir() if p.suffix in (".yaml", ".yml", ".json")))
        elif _names_no_file(source):
            raise DefinitionError([Issue(str(source), "no such file or folder", rule="io")])
        else:
            out.append(source)
    return out


def _names_no_file(source: str | Path | Mapping[str, Any]) -> bool:
    """A path (not a definition's own text) where there is nothing to read."""
    if isinstance(source, Mapping):
        return False
    text = str(source)
    looks_like_path = isinstance(source, Path) or (
        len(text) < 4096 and "\n" not in text and not text.lstrip().startswith("{")
    )
    return looks_like_path and not Path(text).exists()


class WorkflowEnvironment:
    """Definitions, actions and agents in one process, no broker.

    `definitions`: files, folders or dicts (validated as `runfold defs register` does).
    `actions`: action name -> handler `(ctx, input) -> output` (sync or async), or a canned
    output, or an exception instance to raise, or `NO_ANSWER`; actions not given come from the
    module-level `@action` registry (import your module first) and the built-ins (echo, noop,
    sleep, http.request). `agents`: agent name -> a function of the `AgentRequest`, or a canned
    answer (validated against the node's output schema by the real agent loop); agents not
    given answer from the deterministic local provider. `queues`: the activation queues the
    processor serves (its default: default, agents), so a node on another queue is rejected
    here as it would be there.
    """

    def __init__(
        self,
        *definitions: str | Path | Mapping[str, Any],
        actions: Mapping[str, Any] | None = None,
        agents: Mapping[str, Any] | None = None,
        queues: Iterable[str] = DEFAULT_QUEUES,
        ceilings: Ceilings | None = None,
        secrets: SecretStore | None = None,
        start_ms: int = DEFAULT_START_MS,
        max_inputs: int = DEFAULT_MAX_INPUTS,
    ) -> None:
        self.catalog = Catalog(ceilings)
        self.ctx = EngineContext(
            catalog=self.catalog, ceilings=ceilings or Ceilings(), queues=frozenset(queues)
        )
        self.now_ms = start_ms
        self.max_inputs = max_inputs
        self.inputs = 0  # inputs folded so far
        self.runs: dict[str, Any] = {}  # run id -> the engine's run record
        self.events: dict[str, list[dict[str, Any]]] = {}  # run id -> its events, RunRejected too
        self.timers: dict[tuple[str, str], dict[str, Any]] = {}  # (run id, timer id) -> TimerFired body
        self.children: dict[str, list[str]] = {}  # parent run id -> child run ids, in start order
        self._parents: dict[str, dict[str, Any]] = {}  # child run id -> parent step (child executor's map)
        self._inbox: deque[dict[str, Any]] = deque()  # commands and receipts to fold, in order
        self._work: deque[dict[str, Any]] = deque()  # activations for the worker and the child executor
        self._records = 0
        self._worker = HarnessWorker(actions or {}, agents or {}, secrets, lambda: self.now_ms)
        for source in definition_sources(definitions):
            self.register(source)

    def close(self) -> None:
        self._worker.close()

    def __enter__(self) -> WorkflowEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, source: str | Path | Mapping[str, Any]) -> Definition:
        """Validate and add one definition as `runfold defs register` does: on its own, then
        `registration_issues` against the definitions given so far (the served queues are
        checked when a run starts, as the processor does). Raises `DefinitionError` with path
        and rule."""
        try:
            _, raw = load_source(source)
        except InvalidDefinition as e:  # an unreadable or unparsable file: its own findings
            error = DefinitionError(e.issues or [Issue("", e.detail, rule="syntax")])
            error.add_note(f"in {e.source}")
            raise error from None
        definition = self.catalog.register(raw)
        errors = [i for i in registration_issues(definition, self.catalog, None) if i.severity == "error"]
        if errors:
            raise DefinitionError(errors)
        return definition

    # ---- commands ----------------------------------------------------------------------------
    def start(
        self,
        definition_id: str,
        input: Any = None,
        *,
        run_id: str | None = None,
        revision: int | None = None,
        budgets: Mapping[str, int] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> TestRun:
        """Start a run and process until nothing is left to do at the current time (no time is
        skipped). Raises `CommandRejected` when the engine rejects the start, as the client does."""
        run_id = run_id or f"test-{len(self.events) + 1}"
        self.inputs = 0  # `max_inputs` counts the inputs of one run, not of the whole environment
        self.command(run_id, dict(start_run_body(definition_id, input, revision, labels, budgets)))
        return TestRun(self, run_id)

    def run(
        self,
        definition_id: str,
        input: Any = None,
        *,
        signals: Sequence[tuple[str, Any]] | Mapping[str, Any] = (),
        run_id: str | None = None,
        revision: int | None = None,
        budgets: Mapping[str, int] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Start a run and settle it (`TestRun.settle`), sending `signals` one by one, each when
        the run is waiting for a signal and nothing else is due."""
        handle = self.start(
            definition_id, input, run_id=run_id, revision=revision, budgets=budgets, labels=labels
        )
        return handle.settle(signals)

    def command(self, run_id: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Fold one command and everything it leads to at this time; returns the events it
        caused on its own run. A RunRejected answer raises `CommandRejected`."""
        msg = self._stamp(run_id, body)
        events = self._fold(msg)
        self.drain()
        for event in events:
            if event["type"] == "RunRejected":
                raise CommandRejected(run_id, body["type"], msg["record_id"], event["code"], event["reason"])
        return events

    # ---- time --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Fold every input and run every activation pending at the current time."""
        while self._inbox or self._work:
            if self._inbox:
                self._fold(self._inbox.popleft())
            else:
                self._dispatch(self._work.popleft())

    def next_due_ms(self) -> int | None:
        return min((t["due_ms"] for t in self.timers.values()), default=None)

    def fire_next(self) -> bool:
        """Skip to the next due timer, fire every timer due then, drain; False when none is armed."""
        due = self.next_due_ms()
        if due is None:
            return False
        self.advance_to(due)
        return True

    def advance(self, ms: int) -> None:
        """Let `ms` of virtual time pass: the timers due within fire in due order."""
        if ms < 0:
            raise ValueError(f"advance({ms}): virtual time cannot go backwards")
        self.advance_to(self.now_ms + ms)

    def advance_to(self, t_ms: int) -> None:
        while True:
            due = self.next_due_ms()
            if due is None or due > t_ms:
                break
            self.now_ms = max(self.now_ms, due)
            for (run_id, timer_id), body in sorted(self.timers.items(), key=lambda kv: kv[1]["due_ms"]):
                if body["due_ms"] <= self.now_ms:
                    self._inbox.append(
                        {
                            **body,
                            "type": "TimerFired",
                            "run_id": run_id,
                            "ts_ms": self.now_ms,
                            "record_id": f"timer:{timer_id}@{body['due_ms']}",
                        }
                    )
            self.drain()
        self.now_ms = max(self.now_ms, t_ms)

    # ---- what a test reads -------------------------------------------------------------------
    def status(self, run_id: str) -> str:
        state = self.runs.get(run_id)
        return "rejected" if state is None else run_status(state)

    def result(self, run_id: str) -> RunResult:
        state = self.runs.get(run_id)
        if state is None:
            raise KeyError(f"no run {run_id!r} in this environment")
        return RunResult(
            run_id=run_id,
            status=run_status(state),
            events=list(self.events.get(run_id, [])),
            record=state,
            now_ms=self.now_ms,
            children={c: self.result(c) for c in self.children.get(run_id, []) if c in self.runs},
        )

    # ---- the processor's fold, in memory -------------------------------------------------------
    def _stamp(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        self._records += 1
        return {"run_id": run_id, "ts_ms": self.now_ms, "record_id": f"harness-{self._records}", **body}

    def _fold(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        self.inputs += 1
        if self.inputs > self.max_inputs:
            raise Stuck(
                f"{self.max_inputs} inputs folded and the run has not settled (a loop without a budget?)"
            )
        run_id = msg["run_id"]
        decision = decide(self.runs.get(run_id), msg, self.ctx)
        timers: dict[str, dict[str, Any] | None] = {}  # in event order, as the runtime applies them
        for event, state in zip(decision.events, decision.states, strict=True):
            self.events.setdefault(run_id, []).append(event)
            self._watch_children(event)
            if state is None:
                continue
            fx = effects(state, event)
            for message in fx.messages:
                self._work.append(message)
            for timer_id in fx.clear_timers:
                timers[timer_id] = None
            for body in fx.set_timers:
                timers[body["timer_id"]] = body
        if msg["type"] == "TimerFired":  # that firing is done; a timer re-armed since stays
            armed = self.timers.get((run_id, msg["timer_id"]))
            if armed is not None and armed["due_ms"] == msg["due_ms"]:
                del self.timers[(run_id, msg["timer_id"])]
        for timer_id, armed_body in timers.items():
            if armed_body is None:
                self.timers.pop((run_id, timer_id), None)
            else:
                self.timers[(run_id, timer_id)] = armed_body
        after = decision.state_after(self.runs.get(run_id))
        if after is not None:
            self.runs[run_id] = after
        return decision.events

    def _watch_children(self, event: dict[str, Any]) -> None:
        """The child executor's reading of run events: a child's end is its parent's receipt."""
        run_id, etype = event["run_id"], event["type"]
        if etype == "RunAccepted" and event.get("parent"):
            self._parents[run_id] = parent_step_from_ref(run_id, event["parent"])
        elif etype in TERMINAL_EVENTS or (
            etype == "RunRejected"
            and event.get("command_type") == "StartRun"
            and event.get("code") != "Conflict"
        ):
            step = self._parents.get(run_id) or parent_step_from_id(run_id)
            if step is not None and step["run_id"] in self.runs:
                self._inbox.append(finished_receipt(step, run_id, event, self.now_ms))

    def _dispatch(self, message: dict[str, Any]) -> None:
        mtype = message["type"]
        if mtype == "ActionActivation":
            self._inbox.extend(self._worker.run(message))
        elif mtype == "ChildRunActivation":
            if not expired(message, self.now_ms):
                command = start_command(message, self.now_ms)
                self.children.setdefault(message["run_id"], []).append(command["run_id"])
                self._inbox.append(dict(command))
        elif mtype == "ChildRunCancel":
            self._inbox.append(dict(cancel_command(message, self.now_ms)))
        # CancelActivation: the harness's handlers have already returned (or never will:
        # NO_ANSWER), as a worker's late cancel notice finds nothing to stop


class TestRun:
    """One run in a `WorkflowEnvironment`: send it commands, let time pass, read its result."""

    __test__ = False  # not a pytest test class

    def __init__(self, env: WorkflowEnvironment, run_id: str) -> None:
        self.env = env
        self.run_id = run_id

    @property
    def status(self) -> str:
        return self.env.status(self.run_id)

    def result(self) -> RunResult:
        """The run as it is now (no time skipped)."""
        return self.env.result(self.run_id)

    # `idempotency_key`: as the client's (docs/semantics.md, "Idempotent commands"); a repeat of
    # a key the run applied returns its CommandDeduplicated and changes nothing
    def signal(
        self, name: str, payload: Any = None, idempotency_key: str | None = None
    ) -> list[dict[str, Any]]:
        body = {"type": "SignalRun", "signal": name, "payload": payload, "idempotency_key": idempotency_key}
        return self.env.command(self.run_id, body)

    def cancel(self, reason: str = "", idempotency_key: str | None = None) -> list[dict[str, Any]]:
        body = {"type": "CancelRun", "reason": reason, "idempotency_key": idempotency_key}
        return self.env.command(self.run_id, body)

    def resume(
        self,
        budgets: Mapping[str, int] | None = None,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> list[dict[str, Any]]:
        body = {
            "type": "ResumeRun",
            "budgets": dict(budgets) if budgets else None,
            "reason": reason,
            "idempotency_key": idempotency_key,
        }
        return self.env.command(self.run_id, body)

    def advance(self, ms: int) -> TestRun:
        self.env.advance(ms)
        return self

    def settle(self, signals: Sequence[tuple[str, Any]] | Mapping[str, Any] = ()) -> RunResult:
        """Skip time until the run is finished (succeeded, failed, cancelled), paused, or waiting
        for a signal that has no timeout (its wall-time budget is not skipped to: `advance` past
        it to test that). `signals` are sent one by one, each when the run waits for a signal,
        before its wait's timeout is skipped to."""
        pending = deque(signals.items() if isinstance(signals, Mapping) else signals)
        self.env.inputs = 0
        while True:
            self.env.drain()
            status = self.status
            if status in TERMINAL_STATUSES or status in ("paused", "rejected"):
                break
            if status == "waiting" and pending:
                self.signal(*pending.popleft())
                continue
            if not self._timed_wait():  # it would wait for good: only a wall time would end it
                break
            if not self.env.fire_next():
                break
        result = self.result()
        if pending:
            raise SignalsNotSent(result, [name for name, _ in pending])
        return result

    def _timed_wait(self) -> bool:
        """Whether a timer other than a wall-time budget is armed for this run or a run it
        started (at any depth): nothing else can move it on."""
        tree, todo = set(), [self.run_id]
        while todo:
            run_id = todo.pop()
            if run_id not in tree:
                tree.add(run_id)
                todo.extend(self.env.children.get(run_id, []))
        return any(
            run_id in tree and body["timer_kind"] != "wall_time"
            for (run_id, _), body in self.env.timers.items()
        )
