"""The workflow definition language (`runfold.workflow/v1`): pydantic models and the loader.

Pydantic checks the shape (types, ranges, unknown fields); `validation.py` checks the
meaning (routes, state keys, conditions, ceilings, secrets). `load_definition` runs
both, so a `Definition` it returns is ready to run.

Templates (`node.input`, `node.writes` values, `node.prompt`, mutation values) stay
plain JSON: they are resolved in the hot loop by `refs.resolve`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from processors.engine.errors import DefinitionError, Issue

SCHEMA_V1 = "runfold.workflow/v1"
END = "end"  # route target that ends the run
DEFINITION_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
NODE_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
# No ".": a queue is a topic-name suffix, and topology.settings refuses "." in queue names.
QUEUE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"

NodeKind = Literal["action", "agent", "workflow", "state", "wait", "sleep"]
Reducer = Literal["replace", "append", "merge", "sum", "max", "reject_concurrent"]
RefSource = Literal["input", "state", "output", "item", "signal", "literal"]
FailurePolicy = Literal["fail_fast", "continue", "skip_dependents"]
MutationOp = Literal["set", "increment", "append", "remove"]

DEFAULT_QUEUES: dict[str, str] = {"action": "default", "agent": "agents"}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)


class Ref(_Model):
    """`{from: state, pointer: /brief}` — a value taken from a scope by RFC 6901 pointer."""

    from_: RefSource = Field(alias="from")
    pointer: str = ""
    value: Any = None  # only for `from: literal`

    def to_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.from_}
        if self.pointer:
            out["pointer"] = self.pointer
        if self.from_ == "literal":
            out["value"] = self.value
        return out


class RetryPolicy(_Model):
    max_attempts: int = Field(ge=1)
    backoff_ms: int = Field(default=0, ge=0)
    multiplier: float = Field(default=1.0, ge=1.0, le=100.0)
    max_backoff_ms: int | None = Field(default=None, ge=0)

    def delay_ms(self, attempt: int) -> int:
        """Delay before the attempt after failed attempt number `attempt` (1-based); no jitter,
        so replay computes the same timer."""
        exponent = min(max(attempt - 1, 0), 64)  # bounded: never a float overflow
        delay = self.backoff_ms * self.multiplier**exponent
        if self.max_backoff_ms is not None:
            delay = min(delay, self.max_backoff_ms)
        return int(min(delay, 2**62))


class Budgets(_Model):
    """Run limits. A limit that is absent or 0 does not count; only positive limits do."""

    max_steps: int | None = Field(default=None, ge=0)
    max_retries: int | None = Field(default=None, ge=0)
    max_agents: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost_micros: int | None = Field(default=None, ge=0)
    wall_time_ms: int | None = Field(default=None, ge=0)
    max_concurrency: int | None = Field(default=None, ge=0)
    max_nesting_depth: int = Field(default=4, ge=1)
    warn_at_percent: int = Field(default=80, ge=1, le=100)

    def limits(self) -> dict[str, int]:
        """The limits that count (positive), by dimension name; `warn_at_percent` excluded."""
        out: dict[str, int] = {}
        for name in LIMIT_DIMENSIONS:
            value = getattr(self, name)
            if value:
                out[name] = value
        return out


LIMIT_DIMENSIONS: tuple[str, ...] = (
    "max_steps",
    "max_retries",
    "max_agents",
    "max_tokens",
    "max_cost_micros",
    "wall_time_ms",
    "max_concurrency",
    "max_nesting_depth",
)


MAX_JSON_DEPTH = 100


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Server ceilings. A definition whose budget exceeds one is rejected, never clamped; a
    definition that leaves a dimension unlimited runs under the ceiling."""

    max_steps: int = 10_000
    max_retries: int = 1_000
    max_agents: int = 1_000
    max_tokens: int = 10_000_000
    max_cost_micros: int = 100_000_000
    wall_time_ms: int = 7 * 24 * 3600 * 1000
    max_concurrency: int = 256
    max_nesting_depth: int = 8
    # A run's input is copied into RunAccepted, its snapshots and step inputs: kept well under
    # Kafka's default 1 MB record limit so those records can always be produced.
    max_input_bytes: int = 256 * 1024
    # The same reason bounds what arrives later: a signal payload or a step's output (each is
    # copied into an event, the step record and the snapshot), and the run's `state` after a
    # superstep merge (SuperstepCommitted and every snapshot carry it). Sizes are orjson bytes.
    max_payload_bytes: int = 256 * 1024
    max_state_bytes: int = 512 * 1024
    # How many levels of JSON containers any value a run takes in may nest (nesting.py): inputs,
    # labels, signal payloads, outputs, values written into state, definitions. At most
    # MAX_JSON_DEPTH: a step input built from a template over the state nests up to about twice
    # this bound, plus the few levels a snapshot adds, and orjson refuses past 254.
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH:
            raise ValueError(f"max_json_depth must be within 1..{MAX_JSON_DEPTH}, not {self.max_json_depth}")

    def effective(self, budgets: Budgets) -> dict[str, int]:
        """The limits a run actually gets: the definition's where set, else the ceiling
        (plus `warn_at_percent`). Assumes the budgets were validated against these ceilings."""
        limits = budgets.limits()
        out = {name: limits.get(name, getattr(self, name)) for name in LIMIT_DIMENSIONS}
        out["warn_at_percent"] = budgets.warn_at_percent
        return out


class Mutation(_Model):
    """A pure state change of a `state` node. `value` is a template (it may hold refs)."""

    op: MutationOp
    target: str
    value: Any = None


class Route(_Model):
    """`{to: review, when: "size(state.notes) > 3"}`; the string `review` is shorthand for
    `{to: review}`. `to: end` adds no node (the branch ends). How a list of routes is
    followed is the decider's rule; `conditions.select_routes` implements the if/else one."""

    to: str
    when: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"to": data} if isinstance(data, str) else data


# A tool's name is what the model calls it by: the name rule both OpenAI and Anthropic accept.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_TURNS_CEILING = 50
MAX_TOOL_CALLS_CEILING = 200


class Approval(_Model):
    """A tool call waits for a signal `{approved: bool, reason?}` before it runs; a denial, or
    no answer within `timeout_ms`, goes back to the model as an error result."""

    signal: str = Field(min_length=1, max_length=256)
    timeout_ms: int | None = Field(default=None, ge=1)


class Tool(_Model):
    """A tool an agent node's model may call: an action on a queue, run like an action node's
    attempt (lease, heartbeat, retry, timeout), or a child run of `workflow@revision`, run like a
    workflow node's; its arguments (the action's input, the child's run input) checked against
    `input_schema`. Exactly one of `action` and `workflow` (validation.py)."""

    description: str = ""
    action: str | None = Field(default=None, min_length=1, max_length=256)
    workflow: str | None = Field(default=None, pattern=DEFINITION_ID_PATTERN)
    revision: int | None = Field(default=None, ge=1)
    queue: str = Field(default="default", pattern=QUEUE_PATTERN)
    capabilities: list[str] = Field(default_factory=list)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    retry: RetryPolicy | None = None
    timeout_ms: int | None = Field(default=None, ge=1)
    approval: Approval | None = None


class Node(_Model):
    """One node; fields that do not apply to its `kind` are rejected by `validate_definition`."""

    kind: NodeKind
    description: str = ""
    # action / agent
    action: str | None = None
    queue: str | None = Field(default=None, pattern=QUEUE_PATTERN)
    capabilities: list[str] = Field(default_factory=list)
    agent: str | None = None
    model: str | None = None
    prompt: Any = None
    output_schema: dict[str, Any] | None = None
    structured_output_attempts: int = Field(default=1, ge=1, le=20)
    # agent with tools: a loop of model turns and tool calls (agent_loop.py), bounded per step
    tools: dict[str, Tool] = Field(default_factory=dict)
    max_turns: int = Field(default=8, ge=1, le=MAX_TURNS_CEILING)
    max_tool_calls: int = Field(default=20, ge=0, le=MAX_TOOL_CALLS_CEILING)
    # workflow (child run)
    workflow: str | None = Field(default=None, pattern=DEFINITION_ID_PATTERN)
    revision: int | None = Field(default=None, ge=1)
    # wait / sleep
    signal: str | None = Field(default=None, min_length=1, max_length=256)
    # wait: the JSON Schema a signal's payload must meet (a SignalRun that fails it is rejected
    # and the run keeps waiting), and whether a signal sent before the wait is reached is kept
    # for it (true) or refused (false: only a signal that arrives while it waits is taken)
    payload_schema: dict[str, Any] | None = None
    accept_early: bool = True
    duration_ms: int | None = Field(default=None, ge=0)
    # state
    mutations: list[Mutation] = Field(default_factory=list)
    # common
    input: Any = None  # template; None = the whole run input
    map: Ref | None = None
    retry: RetryPolicy | None = None
    timeout_ms: int | None = Field(default=None, ge=1)
    lease_ms: int = Field(default=30_000, ge=1)
    heartbeat_ms: int = Field(default=5_000, ge=1)
    # how long a cancelled or timed-out attempt may take to prove it stopped (None: the lease for
    # an action or agent, WORKFLOW_STOP_TIMEOUT_MS for a child run); then it is stop_unconfirmed
    stop_timeout_ms: int | None = Field(default=None, ge=1)
    on_failure: FailurePolicy = "fail_fast"
    writes: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_queue(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("queue") is None and data.get("kind") in DEFAULT_QUEUES:
            return {**data, "queue": DEFAULT_QUEUES[data["kind"]]}
        return data


class Definition(_Model):
    schema_: Literal["runfold.workflow/v1"] = Field(alias="schema")
    id: str = Field(pattern=DEFINITION_ID_PATTERN)
    revision: int = Field(ge=1)
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    output: Ref | None = None  # None: the run output is the whole final state
    state: dict[str, Any] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)
    reducers: dict[str, Reducer] = Field(default_factory=dict)
    entry: list[str] = Field(min_length=1)
    nodes: dict[str, Node] = Field(min_length=1)
    routes: dict[str, list[Route]] = Field(default_factory=dict)
    budgets: Budgets = Field(default_factory=Budgets)

    @property
    def key(self) -> str:
        """`id@revision`, the catalog and bundle key."""
        return f"{self.id}@{self.revision}"

    def reducer(self, state_key: str) -> Reducer:
        return self.reducers.get(state_key, "replace")

    def child_workflows(self) -> list[tuple[str, str, int]]:
        """Every child workflow this definition can start, as (path, id, revision): its workflow
        nodes (`nodes.x`) and its agents' workflow tools (`nodes.x.tools.t`), in the definition's order."""
        out: list[tuple[str, str, int]] = []
        for node_id, node in self.nodes.items():
            if node.kind == "workflow" and node.workflow is not None and node.revision is not None:
                out.append((f"nodes.{node_id}", node.workflow, node.revision))
            for name, tool in node.tools.items():
                if tool.workflow is not None and tool.revision is not None:
                    out.append((f"nodes.{node_id}.tools.{name}", tool.workflow, tool.revision))
        return out

    def canonical(self) -> dict[str, Any]:
        """The canonical JSON form: aliases, defaults omitted, routes as objects. Parsing it
        gives back an equal definition; `content_hash` hashes it."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def definition_key(definition_id: str, revision: int) -> str:
    return f"{definition_id}@{revision}"


# --------------------------------------------------------------------------- loading


def parse_definition(raw: dict[str, Any]) -> Definition:
    """Shape-check only (pydantic). Raises `DefinitionError` with dotted paths."""
    if not isinstance(raw, dict):
        raise DefinitionError([Issue("", "a definition must be a mapping", rule="shape")])
    try:
        return Definition.model_validate(raw)
    except ValidationError as exc:
        raise DefinitionError([_issue_from_pydantic(err) for err in exc.errors()]) from None


def read_source(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    if isinstance(source, Path):
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise DefinitionError([Issue(str(source), f"cannot read: {exc.strerror}", rule="io")]) from None
        except UnicodeDecodeError as exc:
            raise DefinitionError(
                [
                    Issue(
                        "",
                        f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                        rule="encoding",
                    )
                ]
            ) from None
    else:
        text = source
    try:
        if text.lstrip().startswith("{"):
            data = orjson.loads(text)
            _json_duplicate_keys(text)
        else:
            data = yaml.load(text, Loader=_YamlLoader)
    except RecursionError:
        raise DefinitionError([Issue("", "nests too deeply to read", rule="json_depth")]) from None
    except (orjson.JSONDecodeError, yaml.YAMLError, ValueError) as exc:
        raise DefinitionError(
            [Issue("", f"not valid YAML or JSON: {_first_line(exc)}", rule="syntax")]
        ) from None
    if not isinstance(data, dict):
        raise DefinitionError([Issue("", "a definition must be a mapping", rule="shape")])
    return data


def _first_line(exc: Exception) -> str:
    mark = exc.problem_mark or exc.context_mark if isinstance(exc, yaml.MarkedYAMLError) else None
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        what = exc.problem or exc.context or type(exc).__name__
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _json_duplicate_keys(text: str) -> None:
    """JSON's parser keeps the last of duplicate keys silently; refuse them, as YAML's loader does."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe loader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# ------------------------------------------------------------- pydantic error paths

_MESSAGES: dict[str, str] = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be a boolean",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "too_short": "must not be empty",
}


def _issue_from_pydantic(err: ErrorDetails) -> Issue:
    path = format_path(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values()), "")
        message = f"must be {op} {bound}"
    elif kind == "literal_error":
        message = f"must be one of {ctx.get('expected', '')}"
    elif kind == "string_pattern_mismatch":
        message = f"must match {ctx.get('pattern', '')}"
    elif kind == "too_short" and ctx.get("min_length", 1) > 1:
        message = f"must have at least {ctx['min_length']} items"
    elif kind in _MESSAGES:
        message = _MESSAGES[kind]
    else:
        message = err["msg"][:1].lower() + err["msg"][1:]
    return Issue(path, message, rule=kind)


def format_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """`("nodes", "search", "retry", "max_attempts")` → `nodes.search.retry.max_attempts`;
    list indices as `[0]`. Model-validator pseudo-locations are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "model-")):
            continue
        else:
            out = f"{out}.{part}" if out else part
    return out
