"""Revision lifecycle events: which revisions may start new runs, and which one is "latest".

They travel on the definitions topic beside the definitions, so every processor folds the same
events in the same order (the topic has one partition) and agrees on what an unpinned StartRun
starts. The record is an ordinary DefinitionRecord (no schema change: processors and clients
that predate these events keep reading the topic) whose `definition` field holds

    {"schema": "runfold.lifecycle/v1", "event": "deprecate", "definition_id": "triage",
     "revision": 3, "reason": "..."}

(a definition's `schema` is `runfold.workflow/v1`, so the two never mix), `revision` 0 (no
definition has revision 0: an older client lists it apart from every real revision) and a key
of its own (`lifecycle_key`) so that compaction keeps the last event of each kind:

- `deprecate` / `reinstate` ID@REV (key `ID@REV#deprecation`): a deprecated revision starts
  no new run (a StartRun naming it is rejected); runs already started from it, and child runs
  their bundles pin, go on.
- `promote` ID@REV / `unpin` ID (key `ID#latest`): an unpinned StartRun starts the promoted
  revision, unless it is deprecated; without one (or after `unpin`), the highest revision that
  is not deprecated (`Catalog.latest`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from processors.engine.definition import DEFINITION_ID_PATTERN
from processors.engine.errors import DefinitionError, Issue

__all__ = [
    "LIFECYCLE_SCHEMA",
    "Lifecycle",
    "RevisionStates",
    "is_lifecycle",
    "lifecycle_key",
    "parse_lifecycle",
]

LIFECYCLE_SCHEMA: Final = "runfold.lifecycle/v1"
LifecycleEvent = Literal["deprecate", "reinstate", "promote", "unpin"]
REASON_CHARS: Final = 1000


class Lifecycle(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)

    schema_: Literal["runfold.lifecycle/v1"] = Field(alias="schema")
    event: LifecycleEvent
    definition_id: str = Field(pattern=DEFINITION_ID_PATTERN)
    revision: int | None = Field(default=None, ge=1)
    reason: str = Field(default="", max_length=REASON_CHARS)

    @model_validator(mode="after")
    def _revision_when_needed(self) -> Lifecycle:
        if (self.event == "unpin") != (self.revision is None):
            needs = "no revision" if self.event == "unpin" else "a revision"
            raise ValueError(f"{self.event} takes {needs}")
        return self

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)

    @property
    def target(self) -> str:
        return self.definition_id if self.revision is None else f"{self.definition_id}@{self.revision}"


def is_lifecycle(body: Any) -> bool:
    """Whether a DefinitionRecord's `definition` is a lifecycle event rather than a definition."""
    return isinstance(body, dict) and body.get("schema") == LIFECYCLE_SCHEMA


def parse_lifecycle(body: Any) -> Lifecycle:
    """Raises `DefinitionError` naming the field."""
    try:
        return Lifecycle.model_validate(body)
    except ValidationError as exc:
        raise DefinitionError(
            [
                Issue(".".join(str(p) for p in err["loc"]), err["msg"], rule="lifecycle")
                for err in exc.errors()
            ]
        ) from None


def lifecycle_key(event: Lifecycle) -> str:
    """The topic key: one per revision for deprecate/reinstate, one per id for promote/unpin."""
    if event.event in ("deprecate", "reinstate"):
        return f"{event.definition_id}@{event.revision}#deprecation"
    return f"{event.definition_id}#latest"


class RevisionStates:
    """The lifecycle events folded so far: which revisions are deprecated, which is promoted.
    The Catalog (processor) and the client's registry hold one each and answer `latest` alike."""

    def __init__(self) -> None:
        self._deprecated: dict[tuple[str, int], str] = {}  # -> the reason given
        self._promoted: dict[str, int] = {}

    def apply(self, event: Lifecycle) -> None:
        """In topic order. An event may name a revision not registered (yet): it holds once it is."""
        if event.event == "unpin":
            self._promoted.pop(event.definition_id, None)
            return
        assert event.revision is not None  # Lifecycle checks it
        if event.event == "deprecate":
            self._deprecated[(event.definition_id, event.revision)] = event.reason
        elif event.event == "reinstate":
            self._deprecated.pop((event.definition_id, event.revision), None)
        else:
            self._promoted[event.definition_id] = event.revision

    def is_deprecated(self, definition_id: str, revision: int) -> bool:
        return (definition_id, revision) in self._deprecated

    def deprecation(self, definition_id: str, revision: int) -> str | None:
        """The reason given when it was deprecated ("" if none); None when it is not."""
        return self._deprecated.get((definition_id, revision))

    def promoted(self, definition_id: str) -> int | None:
        return self._promoted.get(definition_id)

    def latest(self, definition_id: str, revisions: Iterable[int]) -> int | None:
        """Of the registered `revisions`: the promoted one unless it is deprecated, else the
        highest not deprecated; None when every one is."""
        registered = set(revisions)
        promoted = self._promoted.get(definition_id)
        if promoted in registered and not self.is_deprecated(definition_id, promoted):
            return promoted
        live = [rev for rev in registered if not self.is_deprecated(definition_id, rev)]
        return max(live) if live else None
