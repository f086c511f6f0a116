"""The agent loop: an agent node with `tools` runs model turns and tool calls until it answers.

The step `node[lineage]` is never handed to an executor itself. Its model turns (`node[~t]`) and
the tool calls each turn asks for (`node[~t.i]`) are node instances of their own (ids.py): each
attempt has its own dispatch identity, lease, timeout, retry and stopping phase, exactly as an
action's, and its outcome is a step record in the run state. So a crash anywhere resumes at the
first unfinished turn or call: a settled turn is never paid for twice, a settled call never runs
twice (beyond an attempt's at-least-once window, as for actions).

`advance` is the one rule, called (by `superstep.progress`) whenever something in the loop
settled or the step was (re-)scheduled. It looks at the latest turn and does the next thing:
- no turn yet: the first turn;
- the turn is open: nothing (wait for it);
- it failed: the step fails with its failure (its retries, the node's `retry`, are spent);
- it answered (no tool calls): the answer, checked against the node's output_schema, is the
  step's output;
- it asked for tool calls: each becomes an activation of its tool, all at once (a call of an
  unknown tool, or with arguments that are not an object or fail the tool's input_schema, is
  settled at once as an error result for the model); once every call settled (a failure is an
  error result too), the next turn, which is sent the transcript (transcript.py).
Limits: `max_turns` and `max_tool_calls` bound the loop (exceeding one fails the step: Limit);
the run's budgets are checked before each turn (max_agents: a turn is an agent) and each batch
of calls (max_steps: a call is a step), and tokens and cost after each turn (superstep.progress):
an exhausted budget pauses the run, and a resume goes on with the same loop (evolve keeps
`loop` across the re-activation; cancelled turns and calls are dispatched again, and so is a turn
whose failure failed the run: a resume after a provider outage asks the model again).
"""

from __future__ import annotations

from typing import Any

import orjson

from processors.engine import budgets
from processors.engine.definition import Node
from processors.engine.emitter import Emitter, failure
from processors.engine.errors import schema_problem
from processors.engine.ids import (
    call_lineage,
    instance_key,
    order_key,
    split_loop_lineage,
    turn_lineage,
)
from processors.engine.refs import input_hash
from processors.engine.steps import pause_for, schedule
from processors.engine.transcript import tool_call, transcript
from processors.engine.vocabulary import OPEN_STEP_STATUSES, ZERO_USAGE, Failure

Step = dict[str, Any]


def advance(em: Emitter, name: str, lineage: str) -> None:
    """Drive the agent loop of step `name[lineage]` one move further, if it can move."""
    state = em.state
    step = state["steps"].get(instance_key(name, lineage))
    if (
        step is None
        or "loop" not in step
        or step["status"] != "scheduled"
        or step["superstep"] != state["superstep"]
    ):
        return  # settled or cancelled already: a late turn or call changes nothing
    node = em.pinned.node(name)
    turn = step["loop"]["turn"]
    if turn == 0:
        _next_turn(em, step, node, 1)
        return
    record = _current(em, name, turn_lineage(lineage, turn))
    if record is None:  # unreachable: loop.turn counts turns that were scheduled
        _next_turn(em, step, node, turn)
        return
    status = record["status"]
    if status in OPEN_STEP_STATUSES:
        return
    if status == "cancelled" or (status == "failed" and step["loop"].get("again")):
        # the run paused, or failed on this turn, and was resumed: the turn is asked again
        _again(em, node, record)
        return
    if status != "succeeded":
        _fail(em, step, record["failure"] or _problem(step, "Cancelled", f"turn {turn} did not finish"))
        return
    output = record["output"]
    shape = _turn_shape_problem(output)
    if shape is not None:
        _fail(em, step, _problem(step, "InvalidOutput", f"turn {turn} of {name}: {shape}"))
        return
    calls: list[dict[str, Any]] = output.get("tool_calls") or []
    if not calls:
        _answer(em, step, output)
        return
    fresh = _current(em, name, call_lineage(lineage, turn, 0)) is None
    if fresh and not _start_calls(em, step, node, turn, calls):
        return  # the step failed or the run paused
    if _calls_open(em, node, step, turn, len(calls)):
        return
    if turn >= node.max_turns:
        message = f"{name} used its {node.max_turns} turns (max_turns) without an answer"
        _fail(em, step, _problem(step, "Limit", message))
        return
    _next_turn(em, step, node, turn + 1)


def _current(em: Emitter, name: str, lineage: str) -> Step | None:
    """The record of a turn or call of this superstep's loop (an older loop's is not)."""
    record = em.state["steps"].get(instance_key(name, lineage))
    if record is None or record["superstep"] != em.state["superstep"]:
        return None
    return record  # type: ignore[no-any-return]


def _problem(step: Step, code: str, message: str) -> Failure:
    return failure(code, message, node=step["node"], lineage=step["lineage"])


def _fail(em: Emitter, step: Step, problem: Failure) -> None:
    """The loop's step fails (not retried: its turns had the node's retries)."""
    problem = {**problem, "retryable": False, "node": step["node"], "lineage": step["lineage"]}
    em.emit_step("StepFailed", step, failure=problem, usage=dict(ZERO_USAGE))


def _turn_shape_problem(output: Any) -> str | None:
    """Why a model turn's output is not `{content?, answer?}` or `{content?, tool_calls: [...]}`."""
    if not isinstance(output, dict):
        return "a model turn's output must be an object"
    calls = output.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return "tool_calls must be a list"
    for index, call in enumerate(calls):
        if not isinstance(call, dict) or type(call.get("id")) is not str or type(call.get("name")) is not str:
            return f"tool_calls[{index}] must be an object with a string id and name"
    return None


def _answer(em: Emitter, step: Step, output: dict[str, Any]) -> None:
    name = step["node"]
    answer = output["answer"] if "answer" in output else output.get("content")
    validator = em.pinned.node_output_validator(name)
    if validator is not None:
        problem = schema_problem(validator, answer)
        if problem is not None:
            _fail(em, step, _problem(step, "InvalidOutput", f"output of {name} {problem}"))
            return
    # usage: the turns' own events carried it into the run's ledger; the step adds none
    em.emit_step("StepSucceeded", step, output=answer, usage=dict(ZERO_USAGE))


def _next_turn(em: Emitter, step: Step, node: Node, turn: int) -> None:
    name, lineage = step["node"], step["lineage"]
    messages = transcript(em.state, name, lineage, turn)
    size = len(orjson.dumps(messages))
    limit = em.ctx.ceilings.max_state_bytes
    if size > limit:
        message = f"the transcript of {name} grew to {size} bytes, over max_state_bytes {limit}"
        _fail(em, step, _problem(step, "Limit", message))
        return
    over = budgets.overrun(em.state, 0, 1, False)
    if over is not None:
        pause_for(em, over)
        return
    key = turn_lineage(lineage, turn)
    old = em.state["steps"].get(instance_key(name, key))
    schedule(em, name, node, key, old["attempt"] + 1 if old is not None else 1, step["input"])


def _again(em: Emitter, node: Node, record: Step) -> None:
    """A turn or call cancelled by a pause, dispatched again as a new attempt after the resume (a
    call cancelled while it waited for its approval asks for it again)."""
    if record["kind"] == "wait":
        call = tool_call(em.state, record["node"], _loop_of(record))
        _ask_approval(em, record["node"], record["lineage"], record["attempt"] + 1, call)
        return
    schedule(em, record["node"], node, record["lineage"], record["attempt"] + 1, record["input"])


def _loop_of(record: Step) -> tuple[str, int, int | None]:
    loop = split_loop_lineage(record["lineage"])
    assert loop is not None
    return loop


# ------------------------------------------------------------------------------ approvals


def _ask_approval(em: Emitter, name: str, lineage: str, attempt: int, call: dict[str, Any]) -> None:
    """A call of a tool with `approval` waits (a `wait` attempt, RunWaiting) for its signal."""
    approval = em.pinned.node(name).tools[call["name"]].approval
    assert approval is not None
    due = em.ts + approval.timeout_ms if approval.timeout_ms else None
    arguments = call.get("arguments")
    em.emit_attempt(
        "StepScheduled",
        name,
        lineage,
        attempt,
        kind="wait",
        queue=None,
        input=arguments,
        input_hash=input_hash(arguments),
        deadline_ms=due,
        superstep=em.state["superstep"],
    )
    em.emit("RunWaiting", node=name, lineage=lineage, signal=approval.signal, due_ms=due)


def answer_approval(em: Emitter, signal: str, payload: Any) -> str | None:
    """A SignalRun on an approval signal: the lowest call waiting for it runs (approved) or goes
    back to the model as a `PermissionDenied` error result (denied). The reason it was refused
    otherwise (the caller answers RunRejected): an approval is never kept for a later call."""
    if not isinstance(payload, dict) or type(payload.get("approved")) is not bool:
        return "an approval's payload is {approved: true|false, reason?: string}"
    state = em.state
    waiting = sorted(
        (wait for wait in state["waits"].values() if wait["signal"] == signal),
        key=lambda wait: order_key(wait["node"], wait["lineage"]),
    )
    if not waiting or state["status"] != "running":
        return f"no tool call waits for approval {signal[:100]!r} (an approval is not kept for a later call)"
    wait = waiting[0]
    record = state["steps"][instance_key(wait["node"], wait["lineage"])]
    em.emit("SignalReceived", signal=signal, payload=payload, node=wait["node"], **em.keyed())
    if payload["approved"]:
        node = em.pinned.node(record["node"])
        schedule(em, record["node"], node, record["lineage"], record["attempt"] + 1, record["input"])
        return None
    reason = payload.get("reason")
    why = f": {reason[:1000]}" if isinstance(reason, str) and reason else ""
    problem = failure(
        "PermissionDenied", f"the call was denied{why}", node=record["node"], lineage=record["lineage"]
    )
    em.emit_step("StepFailed", record, failure=problem, usage=dict(ZERO_USAGE))
    return None


def _start_calls(em: Emitter, step: Step, node: Node, turn: int, calls: list[dict[str, Any]]) -> bool:
    """Every call of a turn at once, or False when the step failed or the run paused instead."""
    name, lineage = step["node"], step["lineage"]
    made = sum(
        len(
            em.state["steps"][instance_key(name, turn_lineage(lineage, earlier))]["output"].get("tool_calls")
            or []
        )
        for earlier in range(1, turn)
    )
    if made + len(calls) > node.max_tool_calls:
        message = (
            f"turn {turn} of {name} asked for {len(calls)} tool calls; max_tool_calls "
            f"{node.max_tool_calls} leaves {max(node.max_tool_calls - made, 0)}"
        )
        _fail(em, step, _problem(step, "Limit", message))
        return False
    over = budgets.overrun(em.state, len(calls), 0, False)
    if over is not None:
        pause_for(em, over)
        return False
    for index, call in enumerate(calls):
        key = call_lineage(lineage, turn, index)
        old = em.state["steps"].get(instance_key(name, key))
        attempt = old["attempt"] + 1 if old is not None else 1
        refusal = _refusal(em, name, node, call)
        if refusal is None:
            if node.tools[call["name"]].approval is not None:
                _ask_approval(em, name, key, attempt, call)
            else:
                schedule(em, name, node, key, attempt, call.get("arguments"))
            continue
        code, message = refusal
        em.emit_attempt(
            "StepFailed",
            name,
            key,
            attempt,
            failure=failure(code, message, node=name, lineage=key),
            usage=dict(ZERO_USAGE),
        )
    return True


def _refusal(em: Emitter, name: str, node: Node, call: dict[str, Any]) -> tuple[str, str] | None:
    """Why a call is an error result without running: an unknown tool, or bad arguments."""
    tool_name = call["name"]
    if tool_name not in node.tools:
        known = ", ".join(sorted(node.tools))
        return "UnknownReference", f"there is no tool {tool_name[:64]!r}; the tools are: {known}"
    arguments = call.get("arguments")
    if not isinstance(arguments, dict):
        return "InvalidInput", f"the arguments of {tool_name} must be a JSON object"
    validator = em.pinned.tool_input_validator(name, tool_name)
    problem = schema_problem(validator, arguments) if validator is not None else None
    if problem is not None:
        return "InvalidInput", f"the arguments of {tool_name} {problem}"
    return None


def _calls_open(em: Emitter, node: Node, step: Step, turn: int, count: int) -> bool:
    """Whether a call of the turn is still open; a cancelled one (a pause) is dispatched again."""
    waiting = False
    for index in range(count):
        record = _current(em, step["node"], call_lineage(step["lineage"], turn, index))
        if record is None:
            continue  # unreachable: a turn's calls are made together
        if record["status"] == "cancelled":
            _again(em, node, record)
            waiting = True
        elif record["status"] in OPEN_STEP_STATUSES:
            waiting = True
    return waiting
