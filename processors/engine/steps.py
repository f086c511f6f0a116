"""Activating node instances and settling their attempts.

A superstep activates every frontier node together; each instance (`node[lineage]`)
reads the same state snapshot. Attempts count per instance over the whole run (a loop
that re-activates a node continues its attempt count), so every attempt has a fresh
dispatch identity.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, cast

from processors.engine import budgets
from processors.engine.definition import Node, RetryPolicy, Tool
from processors.engine.emitter import Emitter, failure
from processors.engine.errors import RefError
from processors.engine.ids import (
    instance_key,
    is_loop_lineage,
    split_loop_lineage,
    step_timer_id,
)
from processors.engine.refs import ABSENT, Scope, input_hash, pointer_get, resolve
from processors.engine.stopping import halt
from processors.engine.transcript import tool_call
from processors.engine.vocabulary import (
    DISPATCHED_KINDS,
    EXECUTOR_KINDS,
    IN_FLIGHT_SLOT_STATUSES,
    NOT_SCHEDULED_STATUSES,
    OPEN_STEP_STATUSES,
    ZERO_USAGE,
    Failure,
    Usage,
)


def map_items(em: Emitter, name: str, node: Node) -> tuple[list[Any] | None, Failure | None]:
    """The items of a mapped node from the superstep's snapshot, or a failure."""
    ref = node.map
    assert ref is not None
    state = em.state
    if ref.from_ in ("state", "input"):  # the common case, without building a template
        try:
            items = pointer_get(state[ref.from_], ref.pointer)
        except KeyError as exc:
            problem = f"map source of {name}: {ref.pointer} not found in {ref.from_}: {exc.args[0]}"
            return None, failure("UnknownReference", problem, node=name, lineage="")
    else:
        try:
            items = resolve(ref, Scope(input=state["input"], state=state["state"]))
        except RefError as exc:
            problem = f"map source of {name}: {exc.message}"
            return None, failure("UnknownReference", problem, node=name, lineage="")
    if not isinstance(items, list):
        return None, failure(
            "InvalidInput", f"map source must be an array (node {name})", node=name, lineage=""
        )
    return items, None


def plan_superstep(em: Emitter, *, reactivate: bool = False) -> bool:
    """Activate the instances of the current superstep that have not been activated yet
    (all of them when the superstep starts; more as `max_concurrency` slots free up) and,
    with `reactivate` (a resume), the failed or cancelled ones as new attempts. False if
    there was nothing to activate."""
    state = em.state
    superstep = state["superstep"]
    steps = state["steps"]
    pinned = em.pinned
    plans: list[tuple[str, Node, str, Any, dict[str, Any] | None]] = []
    # mapped nodes settled without an activation: their source failed (a failure) or is empty (None)
    unscheduled: list[tuple[str, Failure | None, dict[str, Any] | None]] = []
    fresh_steps = fresh_agents = 0
    mapped = False
    for name in state["frontier"]:
        node = pinned.node(name)
        instances: list[tuple[str, Any]]
        if node.map is not None:
            mapped = True
            own = steps.get(name)
            own_current = own is not None and own["superstep"] == superstep
            if own_current and own is not None and (own["status"] == "succeeded" or not reactivate):
                continue  # settled in this superstep already: an empty map, or a source that failed
            items, problem = map_items(em, name, node)
            if problem is not None or not items:
                # Settled at once, yet it takes a step like any node instance of a superstep, so
                # that max_steps bounds a loop through it too (it would loop without end otherwise).
                unscheduled.append((name, problem, own))
                fresh_steps += not own_current
                continue
            instances = [(str(index), item) for index, item in enumerate(items)]
        else:
            instances = [("", ABSENT)]
        for lineage, item in instances:
            old = steps.get(instance_key(name, lineage))
            current = old is not None and old["superstep"] == superstep
            if (
                current
                and old is not None
                and (not reactivate or old["status"] not in NOT_SCHEDULED_STATUSES)
            ):
                continue
            if not current:
                fresh_steps += 1
                fresh_agents += node.kind == "agent" and not node.tools  # a loop's agents are its turns
            plans.append((name, node, lineage, item, old))
    if not plans and not unscheduled:
        return False
    over = budgets.overrun(em.state, fresh_steps, fresh_agents, mapped)
    if over is not None:
        pause_for(em, over)
        return True
    for name, problem, old in unscheduled:
        attempt = _next_attempt(old)
        if problem is None:  # an empty array: the node's value is []
            em.emit_attempt("StepSucceeded", name, "", attempt, output=[], usage=dict(ZERO_USAGE))
        else:
            em.emit_attempt("StepFailed", name, "", attempt, failure=problem, usage=dict(ZERO_USAGE))
    free = _free_slots(em)
    for name, node, lineage, item, old in plans:
        if node.kind in DISPATCHED_KINDS:
            if free <= 0:
                continue  # dispatched when a slot frees up
            free -= 1
        _activate(em, name, node, lineage, item, _next_attempt(old))
    for name, node, lineage, _item, _old in plans:
        if node.kind == "state" or node.kind == "wait":
            _settle_instantly(em, name, node, lineage)
    return True


def _free_slots(em: Emitter) -> int:
    """How many more executor or child activations `max_concurrency` allows now (wait,
    sleep and state nodes do not take a slot)."""
    cap = int(em.state["budgets"].get("max_concurrency") or 0)
    if cap <= 0:
        return 1 << 62
    if em.state["open"] == 0:
        return cap
    superstep = em.state["superstep"]
    busy = sum(
        1
        for step in em.state["steps"].values()
        if step["superstep"] == superstep
        and step["status"] in IN_FLIGHT_SLOT_STATUSES
        and step["kind"] in DISPATCHED_KINDS
        and not is_loop_lineage(step["lineage"])  # an agent loop takes one slot, its step's
    )
    return cap - busy


def held_back(em: Emitter) -> bool:
    """True when max_concurrency held back activations of the current superstep. Held-back
    instances are always a suffix in (node, lineage) order, so a node is complete when its
    dispatched count equals its item count."""
    cap = int(em.state["budgets"].get("max_concurrency") or 0)
    if cap <= 0 or (em.state["open"] >= cap and _free_slots(em) <= 0):
        return False  # (open counts waits too, so only a full count says no slot is free)
    state = em.state
    superstep = state["superstep"]
    for name in state["frontier"]:
        node = em.pinned.node(name)
        if node.kind not in DISPATCHED_KINDS:
            continue
        own = state["steps"].get(name)
        if node.map is None:
            if own is None or own["superstep"] != superstep:
                return True
            continue
        if own is not None and own["superstep"] == superstep and own["status"] == "failed":
            continue
        items, _ = map_items(em, name, node)
        if items is not None and state["maps"].get(name, 0) < len(items):
            return True
    return False


def _next_attempt(old: dict[str, Any] | None) -> int:
    return old["attempt"] + 1 if old is not None else 1


def _activate(em: Emitter, name: str, node: Node, lineage: str, item: Any, attempt: int) -> None:
    state = em.state
    scope = Scope(input=state["input"], state=state["state"], item=item)
    try:
        node_input = state["input"] if node.input is None else resolve(node.input, scope)
        if node.kind == "agent" and node.prompt is not None:
            resolve(node.prompt, scope)  # effects resolve it again for the AgentSpec; fail here, not there
        if node.kind == "state":
            node_input = [
                {"op": m.op, "target": m.target, "value": resolve(m.value, scope)} for m in node.mutations
            ]
    except RefError as exc:
        em.emit_attempt(
            "StepFailed",
            name,
            lineage,
            attempt,
            failure=failure(
                "UnknownReference", f"input of {name}: {exc.message}", node=name, lineage=lineage
            ),
            usage=dict(ZERO_USAGE),
        )
        return
    schedule(em, name, node, lineage, attempt, node_input)


def schedule(em: Emitter, name: str, node: Node, lineage: str, attempt: int, node_input: Any) -> None:
    """StepScheduled for one attempt (its effects dispatch the activation). An agent loop's tool
    call runs its tool's action on the tool's queue, under the tool's timeout."""
    kind = node.kind
    queue = node.queue if kind in EXECUTOR_KINDS else None
    timeout = node.timeout_ms
    tool = loop_tool(em, name, lineage)
    if tool is not None:  # an agent loop's tool call: an action on its queue, or a child run
        kind = "action" if tool.action is not None else "workflow"
        queue, timeout = (tool.queue if kind == "action" else None), tool.timeout_ms
    looping = kind == "agent" and bool(node.tools) and not is_loop_lineage(lineage)
    if kind == "sleep":
        deadline: int | None = em.ts + (node.duration_ms or 0)
    elif kind == "state":
        deadline = None
    elif looping:
        # the loop itself, on no queue (how its StepScheduled says so): its turns and calls
        # are dispatched, with their own queues and deadlines
        queue, deadline = None, None
    else:
        deadline = em.ts + timeout if timeout else None
    em.emit_attempt(
        "StepScheduled",
        name,
        lineage,
        attempt,
        kind=kind,
        queue=queue,
        input=node_input,
        input_hash=_input_hash(em.state, node_input),
        deadline_ms=deadline,
        superstep=em.state["superstep"],
    )
    if looping:
        em.loops.add((name, lineage))  # progress starts (or, resumed, continues) the loop


def loop_tool(em: Emitter, name: str, lineage: str) -> Tool | None:
    """The tool an agent loop's tool call `lineage` calls (None for any other instance, and for
    a call whose tool is unknown: those are settled without an activation)."""
    loop = split_loop_lineage(lineage)
    if loop is None or loop[2] is None:
        return None
    return em.pinned.node(name).tools.get(tool_call(em.state, name, loop)["name"])


def retry_policy(em: Emitter, step: dict[str, Any]) -> RetryPolicy | None:
    """The retry rule of an attempt: its node's, or for an agent loop's tool call its tool's."""
    tool = loop_tool(em, step["node"], step["lineage"])
    return tool.retry if tool is not None else em.pinned.node(step["node"]).retry


def _input_hash(state: dict[str, Any], node_input: Any) -> str:
    """`input_hash(node_input)`; a node without an input template gets the run's input,
    whose hash the state already holds."""
    if node_input is state["input"]:
        return state["input_hash"]  # type: ignore[no-any-return]
    return input_hash(node_input)


def _settle_instantly(em: Emitter, name: str, node: Node, lineage: str) -> None:
    """`state` nodes settle without an executor; `wait` nodes consume a buffered signal
    or start waiting."""
    step = em.state["steps"][instance_key(name, lineage)]
    if step["status"] != "scheduled":
        return
    if node.kind == "state":
        em.emit_step("StepSucceeded", step, output=step["input"], usage=dict(ZERO_USAGE))
        return
    signal = node.signal or ""
    # accept_early: false takes only a signal that arrives while it waits (the buffer holds
    # none for it: signal_run refuses a signal no wait on it would take yet)
    for buffered in em.state["signals"] if node.accept_early else ():
        if buffered["signal"] == signal:
            em.emit("SignalReceived", signal=signal, payload=buffered["payload"], node=name)
            em.emit_step("StepSucceeded", step, output=buffered["payload"], usage=dict(ZERO_USAGE))
            return
    em.emit("RunWaiting", node=name, lineage=lineage, signal=signal, due_ms=step["deadline_ms"])


def retry_attempt(em: Emitter, step: dict[str, Any]) -> None:
    """The next attempt after a backoff: same input (the snapshot has not changed)."""
    name = step["node"]
    node = em.pinned.node(name)
    schedule(em, name, node, step["lineage"], step["attempt"] + 1, step["input"])
    if node.kind in ("state", "wait"):
        _settle_instantly(em, name, node, step["lineage"])


def fail_attempt(
    em: Emitter, step: dict[str, Any], problem: Failure, usage: Usage, stop: str | None = None
) -> None:
    """StepFailed, then a retry if the failure is retryable and attempts and the run's
    retry budget remain; otherwise the instance's failure is final (RetryExhausted when
    retries ran out). `stop`: how the attempt stopped, when that is known (stopping.py)."""
    extra = {} if stop is None else {"stop": stop}
    policy = retry_policy(em, step)
    if problem["retryable"] and policy is not None:
        attempts = _attempts(step)
        if attempts >= policy.max_attempts:
            problem = retry_exhausted(step, problem, "attempts")
        elif not budgets.fits(em.state, "retries", 1):
            problem = retry_exhausted(step, problem, "budget")
        else:
            em.emit_step("StepFailed", step, failure=problem, usage=usage, **extra)
            due = em.ts + policy.delay_ms(attempts)
            em.emit_step(
                "StepRetryScheduled",
                step,
                next_attempt=step["attempt"] + 1,
                due_ms=due,
                timer_id=step_timer_id("retry_backoff", step["dispatch_id"]),
            )
            return
    em.emit_step("StepFailed", step, failure=problem, usage=usage, **extra)


def _attempts(step: dict[str, Any]) -> int:
    """Attempts of the instance's current activation (retries included, loops not)."""
    return int(step["attempt"] - step["first_attempt"] + 1)


def retry_exhausted(step: dict[str, Any], problem: Failure, why: str) -> Failure:
    """The final failure of a retryable `problem` when the node's attempts (`why="attempts"`) or
    the run's retry budget (`"budget"`) ran out. A pure function of the step and the problem, so a
    re-delivered receipt can be recognised as the one that settled the step (receipts.py)."""
    if why == "attempts":
        message = f"{step['node']} failed after {_attempts(step)} attempts: {problem['message']}"
    else:
        message = f"run retry budget exhausted: {problem['message']}"
    return failure("RetryExhausted", message, node=step["node"], lineage=step["lineage"])


def pause_for(em: Emitter, over: budgets.Overrun) -> None:
    """BudgetExhausted, then RunPaused (code BudgetExceeded) once the in-flight steps stopped."""
    state = em.state
    em.emit(
        "BudgetExhausted",
        dimension=over.dimension,
        used=budgets.used(state, over.dimension, em.ts) + over.amount,
        limit=budgets.limit(state, over.dimension),
    )
    halt(em, "RunPaused", f"run paused: {over.reason}", code="BudgetExceeded", reason=over.reason)


def node_failure(em: Emitter, name: str, hint: int = 0) -> Failure | bool | None:
    """The failure of a frontier node once it is fully settled: a dict if it failed, None
    if it succeeded, False while it is still open. A mapped node is settled when every item
    was dispatched (none held back by max_concurrency) and none is open; it fails when any
    item failed, with the items' common code if they agree, else ExecutionFailed (seed 003),
    and a message listing every failed item in index order. `hint`: an item that just settled;
    the search for an open item starts after it (items settle roughly in dispatch order, so
    the next one is the likeliest to be open: checking after every item stays ~linear)."""
    state = em.state
    steps = state["steps"]
    own = steps.get(name)
    own_current = own is not None and own["superstep"] == state["superstep"]
    node = em.pinned.node(name)
    if node.map is None:
        if own is None or not own_current or own["status"] in OPEN_STEP_STATUSES:
            return False
        return cast(Failure, dict(own["failure"])) if own["status"] == "failed" else None
    if own is not None and own_current and own["status"] == "failed":
        return cast(Failure, dict(own["failure"]))  # the map source itself did not resolve to an array
    count = state["maps"].get(name, 0)
    if int(state["budgets"].get("max_concurrency") or 0) > 0 and _held_back_items(em, name, node, count):
        return False
    start = hint + 1 if 0 <= hint < count else 0
    for index in chain(range(start, count), range(start)):
        if steps[f"{name}[{index}]"]["status"] in OPEN_STEP_STATUSES:
            return False
    failed = [item for item in (steps[f"{name}[{i}]"] for i in range(count)) if item["status"] == "failed"]
    if not failed:
        return None
    codes = {item["failure"]["code"] for item in failed}
    details = "; ".join(
        f"[{item['lineage']}] {item['failure']['code']}: {item['failure']['message']}" for item in failed
    )
    return failure(
        codes.pop() if len(codes) == 1 else "ExecutionFailed",
        f"{len(failed)} of {count} map items of {name} failed: {details}",
        node=name,
        lineage="",
    )


def _held_back_items(em: Emitter, name: str, node: Node, count: int) -> bool:
    """max_concurrency holds back a suffix of the items: fewer dispatched than there are."""
    items, _ = map_items(em, name, node)
    return items is not None and count < len(items)
