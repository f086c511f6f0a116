"""The client's view of `<p>.definitions`: validate and publish, list, look up (cached),
deprecate and promote revisions.

The topic is compacted and keyed `id@revision`, so reading it from the beginning
gives every registered revision, and the lifecycle events (engine lifecycle.py: deprecate,
reinstate, promote, unpin) under keys of their own. The cache is refreshed when a lookup
misses, so a definition registered by someone else a moment ago is still found.

`check_sources` is the offline half (`runfold defs validate`): every check registration
makes, over a set of files and the topology's served queues, with no broker.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from processors.client.errors import DefinitionConflict, InvalidDefinition, UnknownDefinition
from processors.client.reader import PartitionReader
from processors.engine.catalog import Catalog, content_hash
from processors.engine.definition import Definition, read_source
from processors.engine.errors import DefinitionError, Issue
from processors.engine.lifecycle import (
    LIFECYCLE_SCHEMA,
    Lifecycle,
    LifecycleEvent,
    RevisionStates,
    is_lifecycle,
    lifecycle_key,
    parse_lifecycle,
)
from processors.engine.registration import registration_issues
from processors.engine.validation import validate_definition
from schemas import Codec
from topology.catalog import TopicNames
from topology.settings import KafkaSettings


class ClientLink(Protocol):
    """What the registry uses of the client that owns it (client.py): its reader and
    producer, topic names, codec and timeout."""

    timeout_s: float

    topics: TopicNames

    settings: KafkaSettings

    @property
    def codec(self) -> Codec: ...

    @property
    def reader(self) -> PartitionReader: ...

    def produce(self, topic: str, key: str, value: bytes) -> tuple[int, int]: ...


def describe_issue(issue: Issue) -> str:
    """`nodes.search.queue: unknown queue 'tools': ... [unknown_queue]`."""
    rule = f" [{issue.rule}]" if issue.rule else ""
    return f"{issue.path or '(top level)'}: {issue.message}{rule}"


def _describe(err: DefinitionError) -> str:
    return "; ".join(describe_issue(issue) for issue in err.errors)


@dataclass
class SourceCheck:
    """What `check_sources` found about one source: its name, the definition (None when it
    does not parse or validate on its own), and every finding, errors then warnings."""

    source: str
    definition: Definition | None
    issues: list[Issue] = field(default_factory=list)
    named: str | None = None  # id@revision as the source gives them, when it does not validate

    @property
    def key(self) -> str | None:
        return self.named if self.definition is None else self.definition.key

    @property
    def errors(self) -> list[Issue]:
        return [issue for issue in self.issues if issue.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [issue for issue in self.issues if issue.severity == "warning"]


def check_sources(
    sources: list[str | Path | Mapping[str, Any]],
    queues: frozenset[str] | None,
    registered: Catalog | None = None,
) -> list[SourceCheck]:
    """Every check registration makes, offline: each source on its own (`validate_definition`),
    then against the others given and `registered` (child workflows, budgets against every
    definition nesting it, conflicting content for one id@revision) and the served `queues`."""
    catalog = registered or Catalog()
    checks: list[SourceCheck] = []
    for source in sources:
        try:
            name, raw = load_source(source)
        except InvalidDefinition as e:  # its own findings (syntax, shape, encoding, io) once each
            checks.append(SourceCheck(e.source, None, e.issues or [Issue("", e.detail, rule="syntax")]))
            continue
        check = SourceCheck(name, None, named=_named(raw))
        checks.append(check)
        try:
            check.definition = catalog.register(raw)
        except DefinitionError as e:
            check.issues += e.errors
        if check.definition is not None:
            check.issues += warnings_of(check.definition)
    for check in checks:
        if check.definition is not None:
            check.issues += registration_issues(check.definition, catalog, queues)
            check.issues.sort(key=lambda issue: issue.severity != "error")
    return checks


def warnings_of(defn: Definition) -> list[Issue]:
    return [issue for issue in validate_definition(defn) if issue.severity == "warning"]


def _named(raw: Mapping[str, Any]) -> str | None:
    """`id@revision` of a source that does not validate, when both read as what they must be."""
    ident, revision = raw.get("id"), raw.get("revision")
    return f"{ident}@{revision}" if isinstance(ident, str) and type(revision) is int else None


def load_source(source: str | Path | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(a name for messages, the raw definition dict) from a path, a YAML/JSON text or a dict."""
    if isinstance(source, Mapping):
        raw = dict(source)
        return f"definition {raw.get('id', '?')}@{raw.get('revision', '?')}", raw
    path = Path(source)
    is_path = isinstance(source, Path) or (
        len(str(source)) < 4096 and "\n" not in str(source) and path.suffix in (".yaml", ".yml", ".json")
    )
    name = str(path) if is_path else "definition text"
    try:
        return name, read_source(path if is_path else str(source))
    except DefinitionError as e:
        raise InvalidDefinition(name, _describe(e), e.errors) from None


class DefinitionRegistry:
    def __init__(self, client: ClientLink) -> None:
        self._client = client
        self._records: dict[str, dict[int, dict[str, Any]]] | None = None
        self.lifecycle = RevisionStates()

    def refresh(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Re-read the whole definitions topic (committed records only)."""
        c = self._client
        decode = c.codec.decoder("definitions")
        records: dict[str, dict[int, dict[str, Any]]] = {}
        lifecycle = RevisionStates()
        deadline = time.monotonic() + c.timeout_s * 4
        for msg in c.reader.read_all(c.topics.definitions, deadline=deadline):
            if msg.value() is None:
                continue
            rec = decode(msg.value())
            if is_lifecycle(rec["definition"]):
                with contextlib.suppress(DefinitionError):  # malformed: the processor logs it
                    lifecycle.apply(parse_lifecycle(rec["definition"]))
                continue
            records.setdefault(rec["definition_id"], {})[rec["revision"]] = rec
        self._records, self.lifecycle = records, lifecycle
        return records

    def all(self, refresh: bool = True) -> dict[str, dict[int, dict[str, Any]]]:
        if refresh or self._records is None:
            return self.refresh()
        return self._records

    def latest(self, definition_id: str, refresh: bool = False) -> int | None:
        """The revision an unpinned start starts (promoted, else the highest not deprecated)."""
        return self.lifecycle.latest(definition_id, self.all(refresh=refresh).get(definition_id, {}))

    def get(self, definition_id: str, revision: int | None = None) -> dict[str, Any]:
        """The DefinitionRecord (`latest` when `revision` is None; the highest revision when
        every one is deprecated); `UnknownDefinition`."""
        for refresh in (False, True):
            revisions = self.all(refresh=refresh).get(definition_id, {})
            if revisions and (revision is None or revision in revisions):
                if revision is None:
                    revision = self.latest(definition_id) or max(revisions)
                return revisions[revision]
        raise UnknownDefinition(
            definition_id, revision, sorted(self.all(refresh=False).get(definition_id, {}))
        )

    def require(self, definition_id: str, revision: int | None = None) -> None:
        self.get(definition_id, revision)

    def catalog(self) -> Catalog:
        """A Catalog of every registered definition (child workflows resolve against it), with
        the lifecycle events folded in."""
        catalog = Catalog()
        catalog.lifecycle = self.lifecycle
        for revisions in self.all(refresh=False).values():
            for rev in sorted(revisions):
                try:
                    catalog.register(revisions[rev]["definition"])
                except DefinitionError:
                    continue  # registered under older rules; the processor decides about it
        return catalog

    def register(self, source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
        """Validate (with every registration check: `check_sources`) and publish. Returns the
        DefinitionRecord; `InvalidDefinition`, `DefinitionConflict`."""
        return self.register_checked(source)[0]

    def register_checked(self, source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], list[Issue]]:
        """`register`, and the warnings found (a child workflow not registered yet, ...)."""
        name, raw = load_source(source)
        try:
            Catalog().register(raw)  # on its own first: a bad file needs no broker
        except DefinitionError as e:
            raise InvalidDefinition(name, _describe(e), e.errors, _named(raw)) from None
        self.all(refresh=True)
        registered = self.catalog()
        queues = frozenset(self._client.settings.activation_queues)
        (check,) = check_sources([raw], queues, registered)
        defn = check.definition
        conflict = next((i for i in check.errors if i.rule == "conflict"), None)
        if conflict is not None:
            assert self._records is not None
            key = raw.get("id", "?")
            raise DefinitionConflict(
                f"{name}: {conflict.message.split(';')[0]}; definitions are immutable, publish revision "
                f"{max(self._records.get(key, {0: None})) + 1} instead"
            )
        if check.errors or defn is None:
            detail = "; ".join(describe_issue(i) for i in check.errors)
            raise InvalidDefinition(name, detail, check.errors, check.key)
        digest = content_hash(defn)
        existing = self.all(refresh=False).get(defn.id, {}).get(defn.revision)
        if existing is not None:
            return existing, check.warnings  # same content: registering again is a no-op
        record = {
            "definition_id": defn.id,
            "revision": defn.revision,
            "content_hash": digest,
            "definition": defn.canonical(),
            "registered_ms": int(time.time() * 1000),
        }
        c = self._client
        c.produce(c.topics.definitions, defn.key, c.codec.encode("definitions", record))
        assert self._records is not None
        self._records.setdefault(defn.id, {})[defn.revision] = record
        return record, check.warnings

    # ------------------------------------------------------------------ lifecycle

    def deprecate(self, definition_id: str, revision: int, reason: str = "", undo: bool = False) -> Lifecycle:
        """No new run starts from `id@revision` (runs already started go on); `undo` reinstates it."""
        self.require(definition_id, revision)
        return self._publish("reinstate" if undo else "deprecate", definition_id, revision, reason)

    def promote(self, definition_id: str, revision: int, reason: str = "") -> Lifecycle:
        """Make `id@revision` what an unpinned start starts. A deprecated one is refused
        (`ValueError`): reinstate it first."""
        self.require(definition_id, revision)
        if self.lifecycle.is_deprecated(definition_id, revision):
            raise ValueError(
                f"{definition_id}@{revision} is deprecated; reinstate it first "
                f"(runfold defs deprecate {definition_id}@{revision} --undo)"
            )
        return self._publish("promote", definition_id, revision, reason)

    def unpin(self, definition_id: str, reason: str = "") -> Lifecycle:
        """Forget the promoted revision: latest is the highest revision not deprecated again."""
        self.require(definition_id)
        return self._publish("unpin", definition_id, None, reason)

    def _publish(
        self, event: LifecycleEvent, definition_id: str, revision: int | None, reason: str
    ) -> Lifecycle:
        body = {
            "schema": LIFECYCLE_SCHEMA,
            "event": event,
            "definition_id": definition_id,
            "revision": revision,
        }
        if reason:
            body["reason"] = reason
        parsed = parse_lifecycle(body)
        canonical = parsed.body()
        record = {
            "definition_id": definition_id,
            "revision": 0,  # no definition has revision 0 (lifecycle.py)
            "content_hash": hashlib.sha256(orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest(),
            "definition": canonical,
            "registered_ms": int(time.time() * 1000),
        }
        c = self._client
        c.produce(c.topics.definitions, lifecycle_key(parsed), c.codec.encode("definitions", record))
        self.lifecycle.apply(parsed)
        return parsed


def definition_json(record: dict[str, Any]) -> str:
    return orjson.dumps(record["definition"], option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
