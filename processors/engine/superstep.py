"""The barrier: merge a settled superstep's writes, follow routes, commit, finish.

Rules (docs/semantics.md): writes merge in `(node, lineage)` order through the reducers,
then `state` node mutations in node order; ALL matching routes of a node are followed;
the next frontier is a set (a node several nodes route to runs once); `end` and a node
without routes end their branch; an empty frontier ends the run.
"""

from __future__ import annotations

from typing import Any

import orjson

from processors.engine import budgets
from processors.engine.agent_loop import advance
from processors.engine.conditions import select_routes
from processors.engine.definition import END
from processors.engine.emitter import Emitter, failure
from processors.engine.errors import (
    ConditionError,
    ReducerConflict,
    ReducerTypeError,
    RefError,
    schema_problem,
)
from processors.engine.ids import is_loop_lineage, order_key
from processors.engine.nesting import nesting_reason, too_deep
from processors.engine.reducers import apply_mutations, apply_writes
from processors.engine.refs import ABSENT, Scope, resolve
from processors.engine.steps import (
    held_back,
    map_items,
    node_failure,
    pause_for,
    plan_superstep,
)
from processors.engine.stopping import halt
from processors.engine.vocabulary import Failure


def progress(em: Emitter) -> None:
    """Drive the run as far as the current state allows: fail fast, enforce budgets,
    commit settled supersteps (state and wait nodes may settle at once, so loop)."""
    while em.state["status"] == "running":
        if em.failed_any or em.settled_items:
            found = _fail_fast_failure(em)
            em.failed_any = False
            em.settled_items.clear()
            if found is not None:
                fail_run(em, found, f"run failed: {found['node']} failed (fail_fast)")
                return
        if em.usage_changed:
            em.usage_changed = False
            over = budgets.enforce(em)
            if over is not None:
                pause_for(em, over)
                return
        if em.loops:  # after the budgets: a turn that overran them pauses before the next one
            loops = sorted(em.loops)
            em.loops.clear()
            for name, lineage in loops:
                advance(em, name, lineage)
            continue  # a loop may have settled its step, failed or paused the run
        if not em.state["frontier"]:
            return
        if held_back(em) and plan_superstep(em):
            continue  # a max_concurrency slot freed up
        if em.state["open"] > 0:
            return
        commit_superstep(em)


def _fail_fast_failure(em: Emitter) -> Failure | None:
    """The lowest fail_fast node of the superstep that has settled as failed. A node settles as
    failed on a StepFailed, or (a mapped node) when its last open item settles, even
    successfully: only those need looking at."""
    hints = em.settled_items
    for name in em.state["frontier"]:
        if (not em.failed_any and name not in hints) or em.pinned.node(name).on_failure != "fail_fast":
            continue
        found = node_failure(em, name, hints.get(name, -1))
        if isinstance(found, dict):
            return found
    return None


def fail_run(em: Emitter, problem: Failure, cancel_reason: str) -> None:
    """RunFailed, once the run's in-flight steps stopped (stopping.py)."""
    halt(em, "RunFailed", cancel_reason, problem=problem)


def commit_superstep(em: Emitter) -> None:
    state = em.state
    pinned = em.pinned
    definition = pinned.root
    base, run_input = state["state"], state["input"]
    steps = state["steps"]
    writes: list[tuple[str, str, str, Any]] = []
    mutations: list[tuple[str, str, Any]] = []
    values: dict[str, Any] = {}
    blocked: dict[str, Failure] = {}  # skip_dependents nodes that failed
    try:
        for name in state["frontier"]:
            node = pinned.node(name)
            problem = node_failure(em, name)
            if problem is False or (isinstance(problem, dict) and node.on_failure == "fail_fast"):
                # unreachable: progress() fails the run first; never commit over an open or failed node
                fail_run(em, problem or failure("State", f"barrier with {name} still open"), "run failed")
                return
            if isinstance(problem, dict) and node.on_failure == "skip_dependents":
                blocked[name] = problem
                continue
            if node.map is None:
                step = steps[name]
                if isinstance(problem, dict):  # continue: no output to write from
                    values[name] = {"error": problem}
                    continue
                values[name] = step["output"]
                signal = step["output"] if node.kind == "wait" else ABSENT
                scope = Scope(input=run_input, state=base, output=step["output"], signal=signal)
                writes += [(key, name, "", resolve(tpl, scope)) for key, tpl in node.writes.items()]
                if node.kind == "state":
                    mutations += [(m["op"], m["target"], m["value"]) for m in step["output"]]
                continue
            items, _ = map_items(em, name, node)
            own = steps.get(name)
            if items is None or (
                own is not None and own["superstep"] == state["superstep"] and own["status"] == "failed"
            ):
                values[name] = {"error": problem}
                continue
            value: list[Any] = []
            for index, item in enumerate(items):
                step = steps[f"{name}[{index}]"]
                if step["status"] != "succeeded":
                    value.append({"error": step["failure"]})
                    continue
                value.append(step["output"])
                scope = Scope(input=run_input, state=base, output=step["output"], item=item)
                writes += [(key, name, str(index), resolve(tpl, scope)) for key, tpl in node.writes.items()]
            values[name] = value
    except RefError as exc:
        fail_run(em, failure("UnknownReference", f"writes: {exc.message}"), "run failed")
        return
    depth = em.ctx.ceilings.max_json_depth
    for key, writer, lineage, written in writes:
        where = too_deep(written, depth, f"state.{key}")
        if where is not None:
            name = f"{writer}[{lineage}]" if lineage else writer
            fail_run(
                em, failure("State", nesting_reason(f"the value {name} writes", where, depth)), "run failed"
            )
            return
    for _op, target, mutated in mutations:
        where = too_deep(mutated, depth, f"state.{target}")
        if where is not None:
            fail_run(
                em, failure("State", nesting_reason("a state node's mutation", where, depth)), "run failed"
            )
            return
    try:
        merged = apply_writes(base, writes, definition.reducers)
        if mutations:
            merged = apply_mutations(merged, mutations)
    except (ReducerConflict, ReducerTypeError) as exc:
        fail_run(em, failure("State", str(exc)), "run failed")
        return
    size = len(orjson.dumps(merged))
    if size > em.ctx.ceilings.max_state_bytes:
        # The failure names the size, never the state: RunFailed must stay a small record.
        limit = em.ctx.ceilings.max_state_bytes
        reason = f"state of {size} bytes after superstep {state['superstep']} exceeds max_state_bytes {limit}"
        fail_run(em, failure("State", reason), "run failed")
        return
    targets: set[str] = set()
    for name, node_value in values.items():
        try:
            targets.update(
                select_routes(
                    definition.routes.get(name, ()), state=merged, input=run_input, output=node_value
                )
            )
        except ConditionError as exc:
            problem = failure("Evaluation", f"routes of {name}: {exc.message}", node=name, lineage="")
            fail_run(em, problem, "run failed")
            return
    next_frontier = sorted(targets)
    # A target that ran in this superstep (a self-loop, a sibling) keeps its record: a StepSkipped
    # would overwrite its outcome (a skip_dependents failure, then lost to finish_run). Once each.
    skipped: set[str] = set(state["frontier"])
    for name in sorted(blocked):
        for route in definition.routes.get(name, ()):
            if route.to != END and route.to not in targets and route.to not in skipped:
                skipped.add(route.to)
                em.emit(
                    "StepSkipped",
                    node=route.to,
                    lineage="",
                    reason=f"dependency {name} failed (skip_dependents)",
                )
    em.emit("SuperstepCommitted", superstep=state["superstep"], state=merged, next_frontier=next_frontier)
    if next_frontier:
        plan_superstep(em)
    else:
        finish_run(em)


def finish_run(em: Emitter) -> None:
    """The frontier is empty: fail with a skip_dependents failure if one remains, else form
    and check the output."""
    state = em.state
    pinned = em.pinned
    definition = pinned.root
    skipped_failures = sorted(
        (
            step
            for step in state["steps"].values()
            if step["status"] == "failed"
            and pinned.node(step["node"]).on_failure == "skip_dependents"
            and not is_loop_lineage(step["lineage"])  # a failed tool call is an error result for the model
        ),
        key=lambda step: order_key(step["node"], step["lineage"]),
    )
    if skipped_failures:
        first = skipped_failures[0]
        # seed 003: a skip_dependents failure propagates as DependencySkipped
        problem = failure(
            "DependencySkipped",
            f"{first['failure']['message']} (dependents skipped)",
            node=first["node"],
            lineage=first["lineage"],
        )
        em.emit("RunFailed", failure=problem, usage=em.usage())
        return
    for key in definition.required:
        if state["state"].get(key) is None:
            em.emit(
                "RunFailed", failure=failure("State", f"required state key {key!r} is null"), usage=em.usage()
            )
            return
    try:
        output = (
            state["state"]
            if definition.output is None
            else resolve(definition.output, Scope(input=state["input"], state=state["state"]))
        )
    except RefError as exc:
        em.emit("RunFailed", failure=failure("UnknownReference", f"output: {exc.message}"), usage=em.usage())
        return
    validator = pinned.output_validator()
    if validator is not None:
        invalid = schema_problem(validator, output)
        if invalid is not None:
            em.emit(
                "RunFailed",
                failure=failure("InvalidOutput", f"run output {invalid}"),
                usage=em.usage(),
            )
            return
    em.emit("RunSucceeded", output=output, usage=em.usage())
