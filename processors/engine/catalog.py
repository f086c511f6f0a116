"""The definition catalog and pinned bundles.

`Catalog` holds validated definitions by `(id, revision)`; the runtime fills it from the
compacted definitions topic, the CLI/SDK call `register` before publishing. A run pins
a `Bundle` at start: its root definition plus every nested child workflow, in canonical
JSON, with a SHA-256 over the whole. The bundle travels in `RunAccepted` and
`ChildRunActivation`/`StartRun`, so a run never re-reads the live catalog.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from processors.engine.definition import (
    Ceilings,
    Definition,
    definition_key,
    parse_definition,
)
from processors.engine.errors import DefinitionError, Issue
from processors.engine.lifecycle import Lifecycle, RevisionStates
from processors.engine.refs import canonical_json
from processors.engine.validation import load_definition

__all__ = ["Bundle", "Catalog", "Ceilings", "bundle_hash", "collect_bundle", "content_hash", "parse_key"]


def content_hash(defn: Definition) -> str:
    """SHA-256 hex of the definition's canonical JSON (defaults omitted, keys sorted)."""
    return hashlib.sha256(canonical_json(defn.canonical())).hexdigest()


def parse_key(key: str) -> tuple[str, int]:
    """`"research-brief@3"` → `("research-brief", 3)`."""
    definition_id, sep, revision = key.rpartition("@")
    if not sep or not revision.isdigit():
        raise DefinitionError([Issue("", f"not a definition key (id@revision): {key!r}", rule="bundle")])
    return definition_id, int(revision)


class Catalog:
    """Validated definitions by id and revision. Not thread-safe (one per processor loop)."""

    def __init__(self, ceilings: Ceilings | None = None) -> None:
        self.ceilings = ceilings or Ceilings()
        self._definitions: dict[str, dict[int, Definition]] = {}
        self._hashes: dict[str, str] = {}
        self.lifecycle = RevisionStates()  # deprecated and promoted revisions (lifecycle.py)

    def register(self, raw: dict[str, Any] | Definition) -> Definition:
        """Validate and add. Re-registering identical content is a no-op; the same
        `id@revision` with different content raises `DefinitionError` (revisions are immutable)."""
        defn = load_definition(raw.canonical() if isinstance(raw, Definition) else raw, self.ceilings)
        digest = content_hash(defn)
        existing = self._hashes.get(defn.key)
        if existing is not None:
            if existing != digest:
                raise DefinitionError(
                    [
                        Issue(
                            "revision",
                            f"{defn.key} is already registered with different content; "
                            "publish a new revision instead",
                            rule="conflict",
                        )
                    ]
                )
            return self._definitions[defn.id][defn.revision]
        self._definitions.setdefault(defn.id, {})[defn.revision] = defn
        self._hashes[defn.key] = digest
        return defn

    def get(self, definition_id: str, revision: int | None = None) -> Definition | None:
        """A definition; `revision=None` is `latest`."""
        if revision is None:
            return self.latest(definition_id)
        return self._definitions.get(definition_id, {}).get(revision)

    def latest(self, definition_id: str) -> Definition | None:
        """What an unpinned start starts (`RevisionStates.latest`); None when none is left."""
        revisions = self._definitions.get(definition_id, {})
        revision = self.lifecycle.latest(definition_id, revisions)
        return None if revision is None else revisions[revision]

    def is_deprecated(self, definition_id: str, revision: int) -> bool:
        return self.lifecycle.is_deprecated(definition_id, revision)

    def deprecation(self, definition_id: str, revision: int) -> str | None:
        return self.lifecycle.deprecation(definition_id, revision)

    def apply(self, event: Lifecycle) -> None:
        """Fold a lifecycle event (deprecate, reinstate, promote, unpin), in topic order."""
        self.lifecycle.apply(event)

    def revisions(self, definition_id: str) -> list[int]:
        return sorted(self._definitions.get(definition_id, {}))

    def ids(self) -> list[str]:
        return sorted(self._definitions)

    def content_hash(self, definition_id: str, revision: int) -> str | None:
        return self._hashes.get(definition_key(definition_id, revision))

    def pin_bundle(self, definition_id: str, revision: int | None = None) -> Bundle:
        """The root and every nested child workflow, checked: children exist, no nesting
        cycle, static depth within the root's `max_nesting_depth`, child budgets within
        the root's. Raises `DefinitionError`."""
        root = self.get(definition_id, revision)
        if root is None:
            wanted = definition_id if revision is None else definition_key(definition_id, revision)
            raise DefinitionError([Issue("", f"unknown definition {wanted}", rule="not_found")])
        definitions: dict[str, Definition] = {}
        issues = collect_bundle(root, self.get, definitions)
        if issues:
            raise DefinitionError(issues)
        return Bundle.of(root.key, definitions)


@dataclass(frozen=True)
class Bundle:
    """A pinned set of definitions: `root` (`id@rev`), `definitions` (`id@rev` → canonical
    JSON), `hash` (SHA-256 hex of the canonical JSON of `{root, definitions}`)."""

    root: str
    definitions: dict[str, dict[str, Any]]
    hash: str
    _parsed: dict[str, Definition] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, root: str, definitions: dict[str, Definition]) -> Bundle:
        raw = {key: definitions[key].canonical() for key in sorted(definitions)}
        return cls(root, raw, bundle_hash(root, raw), dict(definitions))

    @classmethod
    def from_json(cls, data: dict[str, Any] | str | bytes, ceilings: Ceilings | None = None) -> Bundle:
        """Rebuild and fully re-check a bundle from the wire: hash, every definition, the
        nesting rules. Raises `DefinitionError`."""
        if isinstance(data, (str, bytes)):
            try:
                data = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise DefinitionError([Issue("bundle", "not valid JSON", rule="bundle")]) from None
        if not isinstance(data, dict) or set(data) != {"root", "definitions", "hash"}:
            raise DefinitionError([Issue("bundle", "must be {root, definitions, hash}", rule="bundle")])
        root, raw, claimed = data["root"], data["definitions"], data["hash"]
        if not isinstance(root, str) or not isinstance(raw, dict) or root not in raw:
            raise DefinitionError(
                [Issue("bundle.root", "must name one of the bundle's definitions", rule="bundle")]
            )
        if bundle_hash(root, raw) != claimed:
            raise DefinitionError(
                [Issue("bundle.hash", "does not match the bundle's content", rule="bundle_hash")]
            )
        parsed: dict[str, Definition] = {}
        issues: list[Issue] = []
        for key, body in raw.items():
            try:
                defn = _load_cached(body, ceilings)
            except DefinitionError as exc:
                issues += [
                    Issue(f"bundle.{key}.{i.path}".rstrip("."), i.message, rule=i.rule) for i in exc.errors
                ]
                continue
            if defn.key != key:
                issues.append(Issue(f"bundle.{key}", f"holds {defn.key}", rule="bundle"))
            parsed[key] = defn
        if issues:
            raise DefinitionError(issues)
        reachable: dict[str, Definition] = {}
        issues = collect_bundle(parsed[root], lambda i, r: parsed.get(definition_key(i, r)), reachable)
        extra = sorted(set(parsed) - set(reachable))
        if extra:
            issues.append(
                Issue("bundle.definitions", f"not used by the root: {', '.join(extra)}", rule="bundle")
            )
        if issues:
            raise DefinitionError(issues)
        return cls(root, raw, claimed, parsed)

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "definitions": self.definitions, "hash": self.hash}

    def definition(self, key: str | None = None) -> Definition:
        """The parsed definition `key` (`id@rev`; None = the root), parsed once."""
        key = self.root if key is None else key
        defn = self._parsed.get(key)
        if defn is None:
            if key not in self.definitions:
                raise KeyError(f"{key} is not in bundle {self.root}")
            defn = parse_definition(self.definitions[key])  # validated when the bundle was pinned
            self._parsed[key] = defn
        return defn

    def child(self, definition_id: str, revision: int) -> Bundle:
        """The sub-bundle rooted at a child workflow (what a ChildRunActivation carries)."""
        key = definition_key(definition_id, revision)
        wanted: dict[str, Definition] = {}
        collect_bundle(self.definition(key), lambda i, r: self.definition(definition_key(i, r)), wanted)
        return Bundle.of(key, wanted)


def bundle_hash(root: str, definitions: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({"root": root, "definitions": definitions})).hexdigest()


Lookup = Callable[[str, int], Definition | None]


def collect_bundle(root: Definition, lookup: Lookup, out: dict[str, Definition]) -> list[Issue]:
    """Depth-first over child workflow nodes, filling `out`; returns the problems found."""
    issues: list[Issue] = []
    root_limits = root.budgets.limits()
    cyclic = False

    def visit(defn: Definition, stack: list[str]) -> None:
        nonlocal cyclic
        out[defn.key] = defn
        if defn is not root:
            for name, value in defn.budgets.limits().items():
                root_value = root_limits.get(name)
                if name != "max_nesting_depth" and root_value is not None and value > root_value:
                    issues.append(
                        Issue(
                            f"bundle.{defn.key}.budgets.{name}",
                            f"{value} exceeds the root {root.key} limit {root_value}",
                            rule="nested_budget",
                        )
                    )
        for path, workflow, revision in defn.child_workflows():
            key = definition_key(workflow, revision)
            if key in stack or key == defn.key:
                cyclic = True
                issues.append(
                    Issue(
                        f"bundle.{defn.key}.{path}",
                        f"nested workflow cycle includes {key}",
                        rule="cycle",
                    )
                )
                continue
            if key in out:
                continue
            child = lookup(workflow, revision)
            if child is None:
                issues.append(
                    Issue(
                        f"bundle.{defn.key}.{path}.workflow",
                        f"unknown child workflow {key}",
                        rule="missing_child",
                    )
                )
                continue
            visit(child, [*stack, defn.key])

    visit(root, [])
    if not cyclic:
        issues += _nesting_issues(root, out)
    return issues


def _children(defn: Definition, found: dict[str, Definition]) -> list[Definition]:
    keys = {definition_key(workflow, revision) for _, workflow, revision in defn.child_workflows()}
    return [found[key] for key in sorted(keys) if key in found]


def tree_height(root: Definition, found: dict[str, Definition]) -> int:
    """How many levels of child workflows a definition nests below itself (0: none), over the
    acyclic set of definitions `found` (its bundle)."""
    heights: dict[str, int] = {}

    def height(defn: Definition) -> int:
        if defn.key not in heights:
            heights[defn.key] = max((1 + height(child) for child in _children(defn, found)), default=0)
        return heights[defn.key]

    return height(root)


def _nesting_issues(root: Definition, found: dict[str, Definition]) -> list[Issue]:
    """`max_nesting_depth` counts the levels of the whole run tree, the root included (seeds 001
    and 003: a child at depth d, the root being 0, needs d < max_nesting_depth). A run checks at
    its start that its depth plus the levels its own bundle nests stays under its limit
    (start.py); pinning the root checks the same for every definition of the tree, at the
    deepest place it can run, so that no child the root pins is refused at its own start."""
    deepest: dict[str, int] = {}
    pending = [(root, 0)]
    while pending:
        defn, depth = pending.pop()
        if deepest.get(defn.key, -1) >= depth:
            continue
        deepest[defn.key] = depth
        pending += [(child, depth + 1) for child in _children(defn, found)]
    issues = []
    for key in sorted(deepest):
        defn, depth = found[key], deepest[key]
        height = tree_height(defn, found)
        limit = defn.budgets.max_nesting_depth
        if depth + height < limit:
            continue
        where = "the root" if defn is root else f"{key}, at nesting depth {depth},"
        issues.append(
            Issue(
                f"bundle.{key}.budgets.max_nesting_depth",
                f"{where} nests {height} workflow level(s) below itself: {depth + height + 1} levels in all, "
                f"over its max_nesting_depth {limit} (the levels of the run tree, the root included)",
                rule="nesting_depth",
            )
        )
    return issues


_PARSED: OrderedDict[str, Definition] = OrderedDict()
_PARSED_MAX = 512


def _load_cached(body: Any, ceilings: Ceilings | None) -> Definition:
    """Parse + validate a canonical definition body, memoised by content (bundles repeat)."""
    if not isinstance(body, dict):
        raise DefinitionError([Issue("", "a definition must be a mapping", rule="shape")])
    digest = hashlib.sha256(canonical_json(body)).hexdigest()
    if ceilings is not None:
        digest += repr(ceilings)
    cached = _PARSED.get(digest)
    if cached is not None:
        _PARSED.move_to_end(digest)
        return cached
    defn = load_definition(body, ceilings)
    _PARSED[digest] = defn
    if len(_PARSED) > _PARSED_MAX:
        _PARSED.popitem(last=False)
    return defn
