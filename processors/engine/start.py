"""StartRun: resolve and pin the definition, check everything, accept or reject.

A rejected start emits RunRejected (sequence 0) and leaves no run. Starting an existing
run id again with the same content is a no-op; with different content it is rejected
(code Conflict) and the existing run is untouched.
"""

from __future__ import annotations

import weakref
from typing import Any

from processors.engine import budgets
from processors.engine.catalog import Bundle, content_hash, parse_key
from processors.engine.context import Decision, EngineContext, rejected, unchanged
from processors.engine.emitter import Emitter, rejection
from processors.engine.errors import DefinitionError, schema_problem
from processors.engine.ids import control_character
from processors.engine.nesting import json_size, nesting_reason, too_deep
from processors.engine.pinned import Pinned, remember
from processors.engine.refs import input_hash
from processors.engine.secrets import find_secret_literals
from processors.engine.state import RunState
from processors.engine.steps import plan_superstep
from processors.engine.superstep import progress
from processors.engine.vocabulary import EXECUTOR_KINDS

Message = dict[str, Any]


def start_run(state: RunState | None, msg: Message, ctx: EngineContext) -> Decision:
    # First: nothing below may serialize or walk a value nested past the ceiling.
    limit = ctx.ceilings.max_json_depth
    for field in ("input", "labels"):
        where = too_deep(msg.get(field), limit, field)
        if where is not None:
            reason = nesting_reason(f"StartRun.{field}", where, limit)
            return rejected(
                state,
                rejection(msg, "InvalidInput", reason, revision=_int_or_none(msg.get("revision"))),
                reason,
            )
    if state is not None:
        return _restart(state, msg)
    bad = control_character(msg["run_id"])
    if bad is not None:
        reason = f"run_id contains the control character {bad!r}; run ids are printable text"
        return rejected(state, rejection(msg, "InvalidInput", reason), reason)
    pinned_or_reason = _pin(msg, ctx)
    if isinstance(pinned_or_reason, tuple):
        code, reason = pinned_or_reason
        return rejected(
            state, rejection(msg, code, reason, revision=_int_or_none(msg.get("revision"))), reason
        )
    pinned = pinned_or_reason
    definition = pinned.root

    def reject(code: str, reason: str) -> Decision:
        return rejected(
            state,
            rejection(msg, code, reason, definition_id=definition.id, revision=definition.revision),
            reason,
        )

    run_input = msg.get("input")
    secrets = find_secret_literals(run_input, "input")
    if secrets:
        return reject(
            "InvalidInput",
            f'secret material in input at {", ".join(secrets[:5])}; pass a {{"$secret": name}} handle',
        )
    input_bytes, unwritable = json_size(run_input)
    if unwritable:
        return reject("InvalidInput", f"input {unwritable}")
    if input_bytes > ctx.ceilings.max_input_bytes:
        return reject(
            "Limit", f"input is {input_bytes} bytes; the server ceiling is {ctx.ceilings.max_input_bytes}"
        )
    labels = msg.get("labels")
    if labels is not None and not isinstance(labels, dict):
        return reject("InvalidInput", "labels must be an object of strings")
    if labels:  # shown by `runfold runs list`, the index and the UI: no place for a secret either
        secrets = find_secret_literals(labels, "labels")
        if secrets:
            return reject("InvalidInput", f"secret material in labels at {', '.join(secrets[:5])}")
    labels_bytes, unwritable = json_size(labels or {})
    if unwritable:
        return reject("InvalidInput", f"labels {unwritable}")
    if labels_bytes > ctx.ceilings.max_payload_bytes:
        return reject(
            "Limit", f"labels are {labels_bytes} bytes; max_payload_bytes is {ctx.ceilings.max_payload_bytes}"
        )
    validator = pinned.input_validator()
    if validator is not None:
        problem = schema_problem(validator, run_input)
        if problem is not None:
            return reject("InvalidInput", f"input {problem}")
    limits, reason = budgets.effective_budgets(
        definition.budgets, ctx.ceilings, msg.get("budgets"), may_raise=False
    )
    if limits is None:
        return reject("Limit", reason)
    parent = msg.get("parent")
    if parent is not None:
        problem = _check_parent(parent)
        if problem:
            return reject("InvalidInput", problem)
    # max_nesting_depth counts the levels of the run tree, the root included (seeds 001, 003):
    # this run's depth (the root is 0) plus the levels its bundle nests must stay under it.
    depth = parent["depth"] if parent is not None else 0
    levels = depth + pinned.height + 1
    if levels > limits["max_nesting_depth"]:
        return reject(
            "BudgetExceeded",
            f"maxDepth exceeded: a run at nesting depth {depth} whose definition nests {pinned.height} more "
            f"level(s) makes a run tree of {levels} levels, over max_nesting_depth {limits['max_nesting_depth']}",
        )
    for name, node in sorted(definition.nodes.items()):
        if node.kind in EXECUTOR_KINDS and node.queue not in ctx.queues:
            return reject(
                "InvalidInput",
                f"node {name}: unknown queue {node.queue!r} (known: {', '.join(sorted(ctx.queues))})",
            )
        if node.kind == "workflow" and node.revision is None:
            return reject("InvalidInput", f"node {name}: a workflow node must pin a revision")
        for tool_name, tool in sorted(node.tools.items()):
            if tool.action is not None and tool.queue not in ctx.queues:
                return reject(
                    "InvalidInput",
                    f"node {name} tool {tool_name}: unknown queue {tool.queue!r} (known: {', '.join(sorted(ctx.queues))})",
                )
    em = Emitter(None, msg, ctx)
    em.emit(
        "RunAccepted",
        definition_id=definition.id,
        revision=definition.revision,
        bundle_hash=pinned.bundle.hash,
        bundle=pinned.json,
        input=run_input,
        parent=parent,
        budgets=limits,
        labels=dict(labels or {}),
    )
    em.emit("RunStarted", superstep=1)
    plan_superstep(em)
    progress(em)
    return em.decision()


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def _pin(msg: Message, ctx: EngineContext) -> Pinned | tuple[str, str]:
    definition_id, revision, bundle_json = msg.get("definition_id"), msg.get("revision"), msg.get("bundle")
    if not isinstance(definition_id, str) or not definition_id:
        return "InvalidInput", "definition_id is required"
    if revision is not None and type(revision) is not int:
        return "InvalidInput", "revision must be an integer or null"
    try:
        if bundle_json is not None:
            if msg.get("parent") is None:
                return "InvalidInput", (
                    "bundle is for child runs only (runfold's child executor sends it with their "
                    "parent); start a registered definition by its definition_id and revision"
                )
            bundle = Bundle.from_json(bundle_json, ctx.ceilings)
            root = bundle.definition()
            if root.id != definition_id or (revision is not None and root.revision != revision):
                return (
                    "Conflict",
                    f"bundle root {bundle.root} is not the requested {definition_id}@{revision}",
                )
            unregistered = _unregistered(ctx.catalog, bundle)
            if unregistered is not None:
                return unregistered
        else:
            refused = _lifecycle_refusal(ctx.catalog, definition_id, revision)
            if refused is not None:
                return refused
            bundle = _pin_cached(ctx.catalog, definition_id, revision)
    except DefinitionError as exc:
        not_found = any(issue.rule == "not_found" for issue in exc.errors)
        return ("NotFound" if not_found else "InvalidInput"), str(exc)
    return remember(bundle)


def _unregistered(catalog: Any, bundle: Bundle) -> tuple[str, str] | None:
    """Why a child run's bundle is not what the registry holds, or None. The bundle decides
    what the run does and which definition id its activations claim (the secrets policy trusts
    it), so every definition in it must be the registered content of its id@revision: else
    whoever may write the commands topic could run content of their own under a registered id.
    A parent pinned its bundle from the registry, and revisions are immutable, so a real child
    always passes. A bundle found registered stays so (a catalog never changes a registered
    id@revision), so each is checked once per catalog."""
    try:
        verified = _VERIFIED.setdefault(catalog, set())
    except TypeError:  # a catalog that cannot be weakly referenced: no cache
        verified = set()
    if bundle.hash in verified:
        return None
    for key in sorted(bundle.definitions):
        definition_id, revision = parse_key(key)
        registered = catalog.content_hash(definition_id, revision)
        if registered is None:
            return "NotFound", f"bundle definition {key} is not registered"
        if registered != content_hash(bundle.definition(key)):
            return "Conflict", f"bundle definition {key} differs from the registered {key}"
    verified.add(bundle.hash)
    return None


def _lifecycle_refusal(catalog: Any, definition_id: str, revision: int | None) -> tuple[str, str] | None:
    """A deprecated revision starts no new run (a bundle-carrying StartRun, a child run of a
    running parent, is not asked: running runs go on); an unpinned start when every revision
    is deprecated is NotFound."""
    revisions = catalog.revisions(definition_id)
    if not revisions:
        return None  # pinning answers NotFound
    hint = f"reinstate one with `runfold defs deprecate {definition_id}@REV --undo`"
    if revision is None:
        if catalog.latest(definition_id) is None:
            return "NotFound", (
                f"every revision of {definition_id} is deprecated ({', '.join(map(str, revisions))}); "
                f"{hint} or register a new revision"
            )
        return None
    if not catalog.is_deprecated(definition_id, revision):
        return None
    why = catalog.deprecation(definition_id, revision)
    latest = catalog.latest(definition_id)
    instead = f"start {latest.key} (latest) or " if latest is not None else ""
    return "Conflict", (
        f"{definition_id}@{revision} is deprecated{f' ({why})' if why else ''}: it starts no new run, "
        f"runs already started continue; {instead}{hint.replace('REV', str(revision))}"
    )


# Child-run bundles found to be the registered content, by bundle hash, per catalog.
_VERIFIED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

# Pinned bundles per catalog: revisions are immutable, so (id, revision) pins the same
# bundle for the catalog's lifetime. Only successes are cached (a missing child may be
# registered later).
_PINS: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], Bundle]] = weakref.WeakKeyDictionary()


def _pin_cached(catalog: Any, definition_id: str, revision: int | None) -> Bundle:
    if revision is None:
        latest = catalog.get(definition_id)
        if latest is None:
            bundle: Bundle = catalog.pin_bundle(definition_id, None)  # raises the NotFound error
            return bundle
        revision = latest.revision
    assert revision is not None
    try:
        pins = _PINS.setdefault(catalog, {})
    except TypeError:  # a catalog that cannot be weakly referenced: no cache
        return catalog.pin_bundle(definition_id, revision)  # type: ignore[no-any-return]
    found = pins.get((definition_id, revision))
    if found is None:
        found = pins[(definition_id, revision)] = catalog.pin_bundle(definition_id, revision)
    return found


def _check_parent(parent: Any) -> str:
    if not isinstance(parent, dict):
        return "parent must be a ParentRef object"
    for key in ("parent_run_id", "parent_node", "parent_lineage", "parent_dispatch_id", "root_run_id"):
        if not isinstance(parent.get(key), str):
            return f"parent.{key} must be a string"
    if type(parent.get("depth")) is not int or parent["depth"] < 1:
        return "parent.depth must be an integer >= 1"
    return ""


def _restart(state: RunState, msg: Message) -> Decision:
    """Idempotent start: same definition, revision (or latest requested), input and parent."""
    revision = msg.get("revision")
    same = (
        msg.get("definition_id") == state["definition_id"]
        and (revision is None or revision == state["revision"])
        and input_hash(msg.get("input")) == state["input_hash"]
        and (msg.get("parent") or None) == state["parent"]
    )
    if same:
        return unchanged("duplicate start")
    reason = f"run {state['run_id']} already exists with a different definition, revision, input or parent"
    return rejected(state, rejection(msg, "Conflict", reason), "conflicting start")
