"""What registration checks beyond `validate_definition`: the things knowable once the other
definitions and the topology are known, which would otherwise surface only when a run starts
or a route is evaluated.

- every action/agent node's queue is one the topology serves (`queues`), with how to add one;
- every route condition reads only the variables a condition has (`state`, `input`, `output`:
  `stat.approved` is an error) and only declared state keys;
- every `{from: state}` reference points into a declared state key;
- child workflows: present (a warning when not registered yet), no cycle, the run tree's depth,
  and each child's budgets within those of every definition that nests it, at any depth.

These run where a definition is registered or validated (`runfold defs register|validate`, the
SDK's `register`), never where the processor reads the definitions topic or a bundle: a
definition registered before a check existed keeps starting, and a pinned bundle of a running
run is never refused by a newer rule. Pure: the caller passes the catalog and the queues.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from processors.engine.catalog import Catalog, collect_bundle
from processors.engine.condition_limits import ITERATED, PRESENT, SIZED, analyze, free_variables
from processors.engine.conditions import VARIABLES
from processors.engine.definition import Definition, definition_key
from processors.engine.errors import ConditionError, Issue
from processors.engine.refs import iter_refs, parse_pointer
from processors.engine.vocabulary import EXECUTOR_KINDS

__all__ = ["QUEUES_ENV", "registration_issues"]

QUEUES_ENV: Final = "RUNFOLD_ACTIVATION_QUEUES"
# CEL's type identifiers (`type(state.n) == int`): names a condition may use besides its variables
_CEL_TYPES: Final = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn"}
)
_MARKS: Final = frozenset({SIZED, PRESENT, ITERATED})


def registration_issues(defn: Definition, catalog: Catalog, queues: frozenset[str] | None) -> list[Issue]:
    """Every finding about `defn` (already valid on its own) against `catalog` (which holds it,
    and every definition registered with it) and the topology's served `queues` (None: not
    checked). Errors refuse the registration; warnings are reported."""
    issues: list[Issue] = []
    if queues is not None:
        issues += _queue_issues(defn, queues)
    issues += _condition_issues(defn)
    issues += _state_ref_issues(defn)
    issues += _tree_issues(defn, catalog)
    issues += _ancestor_budget_issues(defn, catalog)
    return issues


def _queue_issues(defn: Definition, queues: frozenset[str]) -> list[Issue]:
    issues = []
    wanted_by: list[tuple[str, str]] = []  # (path, queue) of every queue the definition dispatches to
    for node_id, node in defn.nodes.items():
        if node.kind in EXECUTOR_KINDS and node.queue is not None:
            wanted_by.append((f"nodes.{node_id}.queue", node.queue))
        wanted_by += [
            (f"nodes.{node_id}.tools.{name}.queue", tool.queue)
            for name, tool in node.tools.items()
            if tool.action is not None  # a workflow tool runs a child run, on no queue
        ]
    for path, queue in wanted_by:
        if queue in queues:
            continue
        wanted = ",".join(sorted(queues | {queue}))
        issues.append(
            Issue(
                path,
                f"unknown queue {queue!r}: the topology serves {', '.join(sorted(queues))}; to add it, "
                f"set {QUEUES_ENV}={wanted} for `runfold topology create`, the processor and `defs register`, "
                f"and run a worker on it (`runfold worker --queue {queue} --module MODULE`)",
                rule="unknown_queue",
            )
        )
    return issues


def _condition_issues(defn: Definition) -> list[Issue]:
    issues = []
    for source, routes in defn.routes.items():
        for index, route in enumerate(routes):
            if route.when is None:
                continue
            path = f"routes.{source}[{index}].when"
            try:
                names = free_variables(route.when)
                reads = analyze(route.when).reads
            except ConditionError:
                continue  # validate_definition has reported it
            for name in sorted(names - set(VARIABLES) - _CEL_TYPES):
                issues.append(
                    Issue(
                        path,
                        f"unknown variable {name!r}: a condition sees only {', '.join(VARIABLES)}",
                        rule="condition_scope",
                    )
                )
            for key, present_only in _state_keys_read(reads.get("state")):
                if key in defn.state:
                    continue
                issues.append(_undeclared_read(defn, path, f"state.{key}", key, present_only))
    return issues


def _state_keys_read(paths: frozenset[tuple[str, ...]] | None) -> Iterator[tuple[str, bool]]:
    """(state key, read only through `has(...)`) for each key a condition selects statically."""
    for fields in sorted(paths or ()):
        if fields and fields[0] not in _MARKS:
            yield fields[0], fields[1:] == (PRESENT,)


def _undeclared_read(defn: Definition, path: str, what: str, key: str, present_only: bool) -> Issue:
    declared = ", ".join(sorted(defn.state)) or "none"
    if present_only:
        return Issue(
            path,
            f"tests {what}, a state key the definition does not declare (declared: {declared}): always false",
            severity="warning",
            rule="undeclared_state_key",
        )
    return Issue(
        path,
        f"reads {what}, a state key the definition does not declare (declared: {declared})",
        rule="undeclared_state_key",
    )


def _state_ref_issues(defn: Definition) -> list[Issue]:
    templates: list[tuple[str, Any]] = []
    for node_id, node in defn.nodes.items():
        base = f"nodes.{node_id}"
        templates += [(f"{base}.input", node.input), (f"{base}.prompt", node.prompt)]
        templates += [(f"{base}.writes.{key}", value) for key, value in node.writes.items()]
        templates += [(f"{base}.mutations[{i}].value", m.value) for i, m in enumerate(node.mutations)]
        if node.map is not None:
            templates.append((f"{base}.map", node.map.to_template()))
    if defn.output is not None:
        templates.append(("output", defn.output.to_template()))
    issues = []
    for where, template in templates:
        for ref_path, ref in iter_refs(template, where):
            if ref.get("from") != "state":
                continue
            try:
                tokens = parse_pointer(ref.get("pointer", ""))
            except (ValueError, TypeError):
                continue  # validate_definition has reported it
            if tokens and tokens[0] not in defn.state:
                issues.append(
                    _undeclared_read(defn, f"{ref_path}.pointer", f"state /{tokens[0]}", tokens[0], False)
                )
    return issues


def _tree_issues(defn: Definition, catalog: Catalog) -> list[Issue]:
    """What pinning `defn` as a run's root would refuse (catalog.pin_bundle: a cycle, the depth
    of the run tree), a child not registered yet being a warning: it may be registered next."""
    found: dict[str, Definition] = {}
    # nested budgets: _ancestor_budget_issues checks them against every ancestor, the root included
    issues = [i for i in collect_bundle(defn, catalog.get, found) if i.rule != "nested_budget"]
    return [
        Issue(
            issue.path.removeprefix(f"bundle.{defn.key}."),
            f"{issue.message}: not registered yet; a run of {defn.key} is refused until it is",
            severity="warning",
            rule=issue.rule,
        )
        if issue.rule == "missing_child"
        else issue
        for issue in issues
    ]


def _ancestor_budget_issues(defn: Definition, catalog: Catalog) -> list[Issue]:
    """A child's budget over that of any definition nesting it, directly or deeper, is refused
    whether `defn` is the child or the one nesting it (`catalog.pin_bundle` compares with the
    root only, at a run's start)."""
    issues: list[Issue] = []
    seen: set[tuple[str, str, str]] = set()

    def visit(current: Definition, ancestors: list[tuple[Definition, str]]) -> None:
        for ancestor, via in ancestors:
            if defn.key not in (current.key, ancestor.key):
                continue
            limits = ancestor.budgets.limits()
            for name, value in sorted(current.budgets.limits().items()):
                limit = limits.get(name)
                if name == "max_nesting_depth" or limit is None or value <= limit:
                    continue
                if (ancestor.key, current.key, name) in seen:
                    continue
                seen.add((ancestor.key, current.key, name))
                if current is defn:
                    where = f"budgets.{name}"
                    message = f"{value} exceeds the {name} {limit} of {ancestor.key}, which nests {defn.key}"
                else:
                    where = f"nodes.{via}.workflow"
                    message = f"nests {current.key}, whose {name} {value} exceeds this definition's {limit}"
                issues.append(Issue(where, message, rule="nested_budget"))
        for path, workflow, revision in sorted(current.child_workflows()):
            key = definition_key(workflow, revision)
            if key == current.key or any(a.key == key for a, _ in ancestors):
                continue  # a cycle: _tree_issues reports it
            child = catalog.get(workflow, revision)
            if child is not None:
                visit(child, [*ancestors, (current, path.removeprefix("nodes."))])

    for definition_id in catalog.ids():
        for revision in catalog.revisions(definition_id):
            root = catalog.get(definition_id, revision)
            if root is not None:
                visit(root, [])
    return issues
