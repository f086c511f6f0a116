"""The client's view of `<p>.definitions`: validate and publish, list, look up (cached).

The topic is compacted and keyed `id@revision`, so reading it from the beginning
gives every registered revision. The cache is refreshed when a lookup misses, so
a definition registered by someone else a moment ago is still found.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson

from processors.client.errors import DefinitionConflict, InvalidDefinition, UnknownDefinition
from processors.client.reader import PartitionReader
from processors.engine.catalog import Catalog, content_hash
from processors.engine.definition import read_source
from processors.engine.errors import DefinitionError
from schemas import Codec
from topology.catalog import TopicNames


class ClientLink(Protocol):
    """What the registry uses of the client that owns it (client.py): its reader and
    producer, topic names, codec and timeout."""

    timeout_s: float

    topics: TopicNames

    @property
    def codec(self) -> Codec: ...

    @property
    def reader(self) -> PartitionReader: ...

    def produce(self, topic: str, key: str, value: bytes) -> tuple[int, int]: ...


def _describe(err: DefinitionError) -> str:
    parts = []
    for issue in err.errors:
        where = issue.path or "(top level)"
        rule = f" [{issue.rule}]" if issue.rule else ""
        parts.append(f"{where}: {issue.message}{rule}")
    return "; ".join(parts)


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
        raise InvalidDefinition(name, _describe(e)) from None


class DefinitionRegistry:
    def __init__(self, client: ClientLink) -> None:
        self._client = client
        self._records: dict[str, dict[int, dict[str, Any]]] | None = None

    def refresh(self) -> dict[str, dict[int, dict[str, Any]]]:
        """Re-read the whole definitions topic (committed records only)."""
        c = self._client
        decode = c.codec.decoder("definitions")
        records: dict[str, dict[int, dict[str, Any]]] = {}
        deadline = time.monotonic() + c.timeout_s * 4
        for msg in c.reader.read_all(c.topics.definitions, deadline=deadline):
            if msg.value() is None:
                continue
            rec = decode(msg.value())
            records.setdefault(rec["definition_id"], {})[rec["revision"]] = rec
        self._records = records
        return records

    def all(self, refresh: bool = True) -> dict[str, dict[int, dict[str, Any]]]:
        if refresh or self._records is None:
            return self.refresh()
        return self._records

    def get(self, definition_id: str, revision: int | None = None) -> dict[str, Any]:
        """The DefinitionRecord (latest revision when `revision` is None); `UnknownDefinition`."""
        for refresh in (False, True):
            revisions = self.all(refresh=refresh).get(definition_id, {})
            if revisions and (revision is None or revision in revisions):
                return revisions[max(revisions) if revision is None else revision]
        raise UnknownDefinition(
            definition_id, revision, sorted(self.all(refresh=False).get(definition_id, {}))
        )

    def require(self, definition_id: str, revision: int | None = None) -> None:
        self.get(definition_id, revision)

    def catalog(self) -> Catalog:
        """A Catalog of every registered definition (child workflows resolve against it)."""
        catalog = Catalog()
        for revisions in self.all(refresh=False).values():
            for rev in sorted(revisions):
                try:
                    catalog.register(revisions[rev]["definition"])
                except DefinitionError:
                    continue  # registered under older rules; the processor decides about it
        return catalog

    def register(self, source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
        name, raw = load_source(source)
        catalog = Catalog()
        try:
            defn = catalog.register(raw)
        except DefinitionError as e:
            raise InvalidDefinition(name, _describe(e)) from None
        digest = content_hash(defn)
        existing = self.all(refresh=True).get(defn.id, {}).get(defn.revision)
        if existing is not None:
            if existing["content_hash"] != digest:
                raise DefinitionConflict(
                    f"{name}: {defn.key} is already registered with different content; "
                    f"definitions are immutable, publish revision {max(self.all(False)[defn.id]) + 1} instead"
                )
            return existing  # same content: registering again is a no-op
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
        return record


def definition_json(record: dict[str, Any]) -> str:
    return orjson.dumps(record["definition"], option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
