"""Semantic checks of a parsed definition (pydantic has already checked its shape).

`validate_definition` returns every finding; errors reject the definition, warnings
(`Issue.severity == "warning"`) are reported but do not. Each issue names its path and
its rule (`Issue.rule`). Cross-definition checks (child workflows exist, no nesting
cycle, nested budgets within the root's) belong to `catalog.pin_bundle`.
"""

from __future__ import annotations

import math
import re
from collections import deque
from pathlib import Path
from typing import Any, Final

import jsonschema
import orjson

from processors.engine.condition_limits import ConditionLimit
from processors.engine.conditions import compile_condition
from processors.engine.definition import (
    END,
    LIMIT_DIMENSIONS,
    NODE_ID_PATTERN,
    TOOL_NAME_PATTERN,
    Ceilings,
    Definition,
    Node,
    parse_definition,
    read_source,
)
from processors.engine.errors import ConditionError, DefinitionError, Issue
from processors.engine.nesting import too_deep
from processors.engine.refs import REF_KEYS, REF_SOURCES, iter_refs, parse_pointer
from processors.engine.secrets import find_secret_literals, is_secret_handle
from processors.engine.vocabulary import EXECUTOR_KINDS

_COMMON: Final = frozenset({"kind", "description", "on_failure"})
_EXECUTED: Final = frozenset({"input", "map", "retry", "timeout_ms", "stop_timeout_ms", "writes"})
_LEASED: Final = frozenset({"queue", "capabilities", "lease_ms", "heartbeat_ms", "output_schema"})
ALLOWED_FIELDS: Final[dict[str, frozenset[str]]] = {
    "action": _COMMON | _EXECUTED | _LEASED | {"action"},
    "agent": _COMMON
    | _EXECUTED
    | _LEASED
    | {
        "agent",
        "model",
        "prompt",
        "structured_output_attempts",
        "tools",
        "max_turns",
        "max_tool_calls",
    },
    "workflow": _COMMON | _EXECUTED | {"workflow", "revision"},
    "state": _COMMON | {"mutations", "writes"},
    "wait": _COMMON | {"signal", "timeout_ms", "writes", "payload_schema", "accept_early"},
    "sleep": _COMMON | {"duration_ms"},
}
REQUIRED_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "action": ("action",),
    "agent": ("agent",),
    "workflow": ("workflow", "revision"),
    "state": (),
    "wait": ("signal",),
    "sleep": ("duration_ms",),
}
# which reference sources make sense where
_INPUT_SOURCES: Final = frozenset({"input", "state", "literal"})
_WRITES_SOURCES: Final[dict[str, frozenset[str]]] = {
    "action": frozenset({"input", "state", "output", "literal"}),
    "agent": frozenset({"input", "state", "output", "literal"}),
    "workflow": frozenset({"input", "state", "output", "literal"}),
    "state": _INPUT_SOURCES,
    "wait": frozenset({"input", "state", "output", "signal", "literal"}),
    "sleep": _INPUT_SOURCES,
}


def validate_definition(defn: Definition, ceilings: Ceilings | None = None) -> list[Issue]:
    """Every finding, errors and warnings. Budgets are checked against `ceilings` when given
    (the catalog always gives them); `None` skips that one check."""
    issues: list[Issue] = []
    _check_graph(defn, issues)
    _check_state_keys(defn, issues)
    for node_id, node in defn.nodes.items():
        _check_node(defn, node_id, node, issues)
    _check_signal_contracts(defn, issues)
    _check_conditions(defn, issues)
    if ceilings is not None:
        _check_budgets(defn, ceilings, issues)
    _check_schemas(defn, issues)
    if defn.output is not None:
        _check_ref_template(defn.output.to_template(), "output", _INPUT_SOURCES, issues)
    for path in find_secret_literals(defn.canonical()):
        issues.append(
            Issue(path, "looks like a secret literal; use a {$secret: <name>} handle", rule="secret_literal")
        )
    return issues


def errors_of(issues: list[Issue]) -> list[Issue]:
    return [issue for issue in issues if issue.severity == "error"]


def _check_graph(defn: Definition, issues: list[Issue]) -> None:
    node_id_re = re.compile(NODE_ID_PATTERN)
    for node_id in defn.nodes:
        if node_id == END:
            issues.append(
                Issue(
                    f"nodes.{END}",
                    f"{END!r} is reserved for the route target that ends a branch",
                    rule="reserved_name",
                )
            )
        elif not node_id_re.match(node_id):
            issues.append(Issue(f"nodes.{node_id}", f"node id must match {NODE_ID_PATTERN}", rule="node_id"))
    for index, node_id in enumerate(defn.entry):
        if node_id not in defn.nodes:
            issues.append(Issue(f"entry[{index}]", f"unknown node {node_id!r}", rule="unknown_node"))
    for source, routes in defn.routes.items():
        if source not in defn.nodes:
            issues.append(Issue(f"routes.{source}", f"unknown node {source!r}", rule="unknown_node"))
        for index, route in enumerate(routes):
            if route.to != END and route.to not in defn.nodes:
                issues.append(
                    Issue(f"routes.{source}[{index}].to", f"unknown node {route.to!r}", rule="unknown_node")
                )
    reached = _reachable(defn)
    for node_id in defn.nodes:
        if node_id not in reached:
            issues.append(
                Issue(f"nodes.{node_id}", "unreachable from entry", severity="warning", rule="unreachable")
            )


def _reachable(defn: Definition) -> set[str]:
    seen = {node for node in defn.entry if node in defn.nodes}
    queue = deque(seen)
    while queue:
        for route in defn.routes.get(queue.popleft(), []):
            if route.to in defn.nodes and route.to not in seen:
                seen.add(route.to)
                queue.append(route.to)
    return seen


def _check_state_keys(defn: Definition, issues: list[Issue]) -> None:
    for key in defn.reducers:
        if key not in defn.state:
            issues.append(
                Issue(f"reducers.{key}", f"undeclared state key {key!r}", rule="undeclared_state_key")
            )
    for index, key in enumerate(defn.required):
        if key not in defn.state:
            issues.append(
                Issue(f"required[{index}]", f"undeclared state key {key!r}", rule="undeclared_state_key")
            )


def _check_node(defn: Definition, node_id: str, node: Node, issues: list[Issue]) -> None:
    base = f"nodes.{node_id}"
    allowed = ALLOWED_FIELDS[node.kind]
    for name in sorted(node.model_fields_set - allowed):
        issues.append(Issue(f"{base}.{name}", f"not allowed for kind {node.kind}", rule="kind_field"))
    for name in REQUIRED_FIELDS[node.kind]:
        if getattr(node, name) is None:
            issues.append(Issue(f"{base}.{name}", f"is required for kind {node.kind}", rule="kind_field"))
    if node.kind in EXECUTOR_KINDS and node.heartbeat_ms >= node.lease_ms:
        issues.append(Issue(f"{base}.heartbeat_ms", "must be less than lease_ms", rule="lease"))
    if node.kind == "agent" and node.structured_output_attempts > 1 and node.output_schema is None:
        issues.append(
            Issue(
                f"{base}.structured_output_attempts",
                "has no effect without output_schema",
                severity="warning",
                rule="no_effect",
            )
        )
    _check_tools(base, node, issues)
    for key in node.writes:
        if key not in defn.state:
            issues.append(
                Issue(f"{base}.writes.{key}", f"undeclared state key {key!r}", rule="undeclared_state_key")
            )
    for index, mutation in enumerate(node.mutations):
        path = f"{base}.mutations[{index}]"
        if mutation.target not in defn.state:
            issues.append(
                Issue(
                    f"{path}.target", f"undeclared state key {mutation.target!r}", rule="undeclared_state_key"
                )
            )
        if mutation.op == "increment" and not _number_or_ref(mutation.value):
            issues.append(
                Issue(f"{path}.value", "increment needs a number (or a reference)", rule="mutation")
            )
        _check_ref_template(mutation.value, f"{path}.value", _INPUT_SOURCES, issues)
    mapped = node.map is not None
    item = frozenset({"item"}) if mapped else frozenset()
    if node.map is not None:
        if node.map.from_ not in _INPUT_SOURCES:
            issues.append(
                Issue(
                    f"{base}.map.from",
                    "a map source must come from input, state or literal",
                    rule="map_source",
                )
            )
        elif node.map.from_ == "literal" and not isinstance(node.map.value, list):
            issues.append(
                Issue(f"{base}.map.value", "a literal map source must be a list", rule="map_source")
            )
        _check_pointer(node.map.pointer, f"{base}.map.pointer", issues)
    _check_ref_template(node.input, f"{base}.input", _INPUT_SOURCES | item, issues)
    _check_ref_template(node.prompt, f"{base}.prompt", _INPUT_SOURCES | item, issues)
    if isinstance(node.prompt, dict) and ("system" in node.prompt or "user" in node.prompt):
        # the executor sends `system` and `user` only: any other key of this form would be lost
        for key in sorted(set(node.prompt) - {"system", "user"}):
            issues.append(
                Issue(
                    f"{base}.prompt.{key}",
                    "a prompt with system/user takes no other key (put the values under user)",
                    rule="prompt_key",
                )
            )
    for path in _secret_handles(node.prompt, f"{base}.prompt"):
        issues.append(Issue(path, "secret handles are not allowed in a prompt", rule="secret_in_prompt"))
    for key, template in node.writes.items():
        _check_ref_template(template, f"{base}.writes.{key}", _WRITES_SOURCES[node.kind] | item, issues)


def _check_tools(base: str, node: Node, issues: list[Issue]) -> None:
    if not node.tools:
        return
    for name, tool in node.tools.items():
        path = f"{base}.tools.{name}"
        if not re.match(TOOL_NAME_PATTERN, name):
            issues.append(Issue(path, f"a tool name must match {TOOL_NAME_PATTERN}", rule="tool_name"))
        if (tool.action is None) == (tool.workflow is None):
            issues.append(
                Issue(path, "a tool runs an action or a workflow: give exactly one", rule="tool_kind")
            )
        if (tool.workflow is None) != (tool.revision is None):
            issues.append(
                Issue(
                    f"{path}.revision",
                    "a workflow tool pins its workflow's revision (and only it has one)",
                    rule="tool_kind",
                )
            )
        if tool.workflow is not None and (tool.queue != "default" or tool.capabilities):
            issues.append(
                Issue(
                    path,
                    "queue and capabilities are an action tool's; a workflow tool runs a child run",
                    rule="tool_kind",
                )
            )
        if tool.input_schema.get("type", "object") != "object":
            issues.append(
                Issue(
                    f"{path}.input_schema",
                    "a tool's arguments are an object: type must be object",
                    rule="tool_schema",
                )
            )
    if node.max_tool_calls == 0:
        issues.append(
            Issue(
                f"{base}.max_tool_calls",
                "0 tool calls: the tools can never be called",
                severity="warning",
                rule="no_effect",
            )
        )


def _check_signal_contracts(defn: Definition, issues: list[Issue]) -> None:
    """A signal name is one contract: every wait node on it declares the same payload_schema and
    accept_early. A SignalRun is then checked once, when it arrives, and a signal kept for a wait
    not reached yet is one any of them may take (the buffer holds no signal one of them refuses)."""
    first: dict[str, tuple[str, Node]] = {}
    for node_id, node in defn.nodes.items():
        if node.kind != "wait" or node.signal is None:
            continue
        seen = first.setdefault(node.signal, (node_id, node))
        other_id, other = seen
        for name in ("payload_schema", "accept_early"):
            if getattr(node, name) != getattr(other, name):
                issues.append(
                    Issue(
                        f"nodes.{node_id}.{name}",
                        f"differs from wait node {other_id!r} on the same signal {node.signal!r}; "
                        "the wait nodes of one signal must declare the same payload_schema and accept_early",
                        rule="signal_contract",
                    )
                )
    for node_id, node in defn.nodes.items():
        for tool_name, tool in node.tools.items():
            if tool.approval is not None and tool.approval.signal in first:
                issues.append(
                    Issue(
                        f"nodes.{node_id}.tools.{tool_name}.approval.signal",
                        f"wait node {first[tool.approval.signal][0]!r} waits for signal {tool.approval.signal!r}; "
                        "an approval signal must be a name of its own (its payload is {approved, reason})",
                        rule="signal_contract",
                    )
                )


def _number_or_ref(value: Any) -> bool:
    if value is None or (isinstance(value, dict) and "from" in value):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_ref_template(template: Any, path: str, sources: frozenset[str], issues: list[Issue]) -> None:
    for ref_path, ref in iter_refs(template, path):
        source = ref.get("from")
        extra = set(ref) - REF_KEYS
        if extra:
            issues.append(
                Issue(
                    ref_path,
                    f"unknown reference field(s) {sorted(extra)}; wrap literal objects "
                    "that have a 'from' key as {from: literal, value: ...}",
                    rule="ref_shape",
                )
            )
        if source not in REF_SOURCES:
            issues.append(
                Issue(f"{ref_path}.from", f"must be one of {sorted(REF_SOURCES)}", rule="ref_shape")
            )
            continue
        if source not in sources:
            issues.append(
                Issue(
                    f"{ref_path}.from",
                    f"{source!r} is not available here (use one of {sorted(sources)})",
                    rule="ref_scope",
                )
            )
        if "value" in ref and source != "literal":
            issues.append(
                Issue(f"{ref_path}.value", "only a literal reference has a value", rule="ref_shape")
            )
        _check_pointer(ref.get("pointer", ""), f"{ref_path}.pointer", issues)


def _check_pointer(pointer: Any, path: str, issues: list[Issue]) -> None:
    if not isinstance(pointer, str):
        issues.append(Issue(path, "must be a string", rule="pointer"))
        return
    try:
        parse_pointer(pointer)
    except ValueError:
        issues.append(Issue(path, "must be empty or an RFC 6901 pointer starting with '/'", rule="pointer"))


def _secret_handles(value: Any, path: str) -> list[str]:
    if is_secret_handle(value):
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _secret_handles(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in _secret_handles(item, f"{path}[{index}]")]
    return []


def _check_conditions(defn: Definition, issues: list[Issue]) -> None:
    for source, routes in defn.routes.items():
        unconditional_seen = False
        for index, route in enumerate(routes):
            if route.when is None:
                if unconditional_seen and route.to == END:
                    issues.append(
                        Issue(
                            f"routes.{source}[{index}]",
                            "an 'end' route after an unconditional route is never needed",
                            severity="warning",
                            rule="redundant_route",
                        )
                    )
                unconditional_seen = True
                continue
            try:
                compile_condition(route.when)
            except (
                ConditionError
            ) as exc:  # a ConditionLimit names its rule (condition_length, _depth, _nesting)
                rule = exc.rule if isinstance(exc, ConditionLimit) else "condition"
                issues.append(Issue(f"routes.{source}[{index}].when", exc.message, rule=rule))


def _check_budgets(defn: Definition, ceilings: Ceilings, issues: list[Issue]) -> None:
    limits = defn.budgets.limits()
    for name in LIMIT_DIMENSIONS:
        value, ceiling = limits.get(name), getattr(ceilings, name)
        if value is not None and value > ceiling:
            issues.append(
                Issue(f"budgets.{name}", f"{value} exceeds the server ceiling {ceiling}", rule="ceiling")
            )


def _check_schemas(defn: Definition, issues: list[Issue]) -> None:
    schemas: list[tuple[str, dict[str, Any] | None]] = [
        ("input_schema", defn.input_schema),
        ("output_schema", defn.output_schema),
    ]
    schemas += [
        (f"nodes.{node_id}.output_schema", node.output_schema) for node_id, node in defn.nodes.items()
    ]
    schemas += [
        (f"nodes.{node_id}.payload_schema", node.payload_schema) for node_id, node in defn.nodes.items()
    ]
    schemas += [
        (f"nodes.{node_id}.tools.{name}.input_schema", tool.input_schema)
        for node_id, node in defn.nodes.items()
        for name, tool in node.tools.items()
    ]
    for path, schema in schemas:
        if schema is None:
            continue
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "".join(f"/{part}" for part in exc.path)
            issues.append(
                Issue(path, f"not a valid JSON Schema at '{where}': {exc.message}", rule="json_schema")
            )


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in `value` (depth already bounded), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "(top level)")
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(
            item, f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        )
        if found is not None:
            return found
    return None


def load_definition(source: str | Path | dict[str, Any], ceilings: Ceilings | None = None) -> Definition:
    """Parse and fully validate a definition from a dict, YAML/JSON text (`str`), or a file
    (`Path` — the only I/O here). Raises `DefinitionError` listing every error; warnings
    (e.g. unreachable nodes) do not fail the load — see `validate_definition`. Budgets are
    checked against `ceilings` only when given (`Catalog.register` always gives them)."""
    raw = read_source(source)
    limit = (ceilings or Ceilings()).max_json_depth
    where = too_deep(raw, limit, "")
    if where is not None:  # before pydantic walks it: a run's state and events nest it deeper still
        raise DefinitionError([Issue(where, f"nests deeper than max_json_depth {limit}", rule="json_depth")])
    try:  # what the catalog hashes and the definitions topic carries: orjson's JSON
        orjson.dumps(raw)
    except TypeError as e:  # an integer beyond 64 bits, a lone surrogate, a value JSON has no form for
        raise DefinitionError(
            [Issue("", f"is not JSON the processor can store ({e})", rule="not_json")]
        ) from e
    bad = _non_finite(raw, "")
    if bad is not None:  # YAML's .nan / .inf: orjson would write null, a value nobody wrote
        raise DefinitionError([Issue(bad, "NaN and infinity have no JSON form", rule="not_json")])
    definition = parse_definition(raw)
    errors = [issue for issue in validate_definition(definition, ceilings) if issue.severity == "error"]
    state_bytes, state_limit = len(orjson.dumps(definition.state)), (ceilings or Ceilings()).max_state_bytes
    if state_bytes > state_limit:  # every start would fail: its snapshots could not be produced
        errors.append(
            Issue(
                "state",
                f"the initial state is {state_bytes} bytes, over max_state_bytes {state_limit}",
                rule="state_size",
            )
        )
    if errors:
        raise DefinitionError(errors)
    return definition
