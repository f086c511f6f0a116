"""The pinned bundle of a run, parsed and compiled once per bundle hash (a module LRU).

The run state holds the bundle JSON (it travels in RunAccepted); evolve, decide and
effects look the parsed form up here by hash instead of re-parsing per record. The
cache is pure: its values depend only on the key's content.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson
from jsonschema import Draft202012Validator

from processors.engine.catalog import Bundle, tree_height
from processors.engine.definition import Definition, Node

_CACHE: OrderedDict[str, Pinned] = OrderedDict()
_CACHE_MAX = 256


class Pinned:
    """A run's bundle with its root definition and compiled JSON Schemas."""

    __slots__ = ("_approvals", "_canonical", "_children", "_height", "_validators", "bundle", "json", "root")

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.root: Definition = bundle.definition()
        # The bundle JSON a RunAccepted carries: one object for every run started from this pin,
        # so its canonical bytes (most of a small run's state) are computed once, not per snapshot.
        self.json: dict[str, Any] = bundle.to_json()
        self._canonical: orjson.Fragment | None = None
        self._validators: dict[str, Draft202012Validator | None] = {}
        self._approvals: frozenset[str] | None = None
        self._children: dict[str, dict[str, Any]] = {}
        self._height: int | None = None

    def node(self, name: str) -> Node:
        return self.root.nodes[name]

    def input_validator(self) -> Draft202012Validator | None:
        return self._validator("input", self.root.input_schema)

    def output_validator(self) -> Draft202012Validator | None:
        return self._validator("output", self.root.output_schema)

    def node_output_validator(self, name: str) -> Draft202012Validator | None:
        return self._validator(f"node:{name}", self.root.nodes[name].output_schema)

    def payload_validator(self, name: str) -> Draft202012Validator | None:
        """The `payload_schema` of wait node `name`: what a signal it takes must meet."""
        return self._validator(f"payload:{name}", self.root.nodes[name].payload_schema)

    @property
    def approval_signals(self) -> frozenset[str]:
        """The signals that approve or deny an agent loop's tool calls (worked out once)."""
        if self._approvals is None:
            self._approvals = frozenset(
                tool.approval.signal
                for node in self.root.nodes.values()
                for tool in node.tools.values()
                if tool.approval is not None
            )
        return self._approvals

    def tool_input_validator(self, name: str, tool: str) -> Draft202012Validator | None:
        """The validator of the arguments of tool `tool` of agent node `name`."""
        return self._validator(f"tool:{name}:{tool}", self.root.nodes[name].tools[tool].input_schema)

    def child_bundle(self, definition_id: str, revision: int) -> dict[str, Any]:
        """The sub-bundle JSON a ChildRunActivation carries (computed once)."""
        key = f"{definition_id}@{revision}"
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = self.bundle.child(definition_id, revision).to_json()
        return found

    @property
    def height(self) -> int:
        """How many levels of child workflows the root nests below itself (catalog.tree_height)."""
        if self._height is None:
            found = {key: self.bundle.definition(key) for key in self.bundle.definitions}
            self._height = tree_height(self.root, found)
        return self._height

    def _validator(self, key: str, schema: dict[str, Any] | None) -> Draft202012Validator | None:
        if key not in self._validators:
            self._validators[key] = Draft202012Validator(schema) if schema is not None else None
        return self._validators[key]


def pinned(bundle_json: dict[str, Any], bundle_hash: str) -> Pinned:
    """The parsed bundle of a run state (`state["bundle"]`, `state["bundle_hash"]`). The JSON
    came from a RunAccepted this engine emitted after checking it, so it is not re-validated."""
    found = _CACHE.get(bundle_hash)
    if found is not None:
        try:  # noqa: SIM105 (zero-cost try; contextlib.suppress costs a call per hit on the hot path)
            _CACHE.move_to_end(bundle_hash)
        except KeyError:  # evicted by another thread meanwhile: the pin is still good
            pass
        return found
    bundle = Bundle(bundle_json["root"], bundle_json["definitions"], bundle_hash)
    return remember(bundle)


def remember(bundle: Bundle) -> Pinned:
    """Cache a bundle that was just pinned or verified (keeps its parsed definitions)."""
    found = _CACHE.get(bundle.hash)
    if found is None:
        found = Pinned(bundle)
        _CACHE[bundle.hash] = found
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return found


def canonical_bundle(bundle_json: Any, bundle_hash: Any) -> orjson.Fragment | None:
    """`dump_state`'s bytes of a state's bundle, if it is the very object a cached pin handed
    out (`Pinned.json`, never mutated, like every state value); None: serialize it as usual."""
    found = _CACHE.get(bundle_hash) if type(bundle_hash) is str else None
    if found is None or found.json is not bundle_json:
        return None
    if found._canonical is None:
        found._canonical = orjson.Fragment(orjson.dumps(bundle_json, option=orjson.OPT_SORT_KEYS))
    return found._canonical


def root_definition(bundle_json: dict[str, Any], bundle_hash: str) -> Definition:
    return pinned(bundle_json, bundle_hash).root
