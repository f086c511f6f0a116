"""Revision lifecycle (issue 24, point 2): deprecate / reinstate / promote / unpin events on the
definitions topic, folded by every processor's Catalog alike. A deprecated revision starts no
new run (StartRun rejected with the reason), running runs go on; an unpinned start starts
`latest`: the promoted revision unless deprecated, else the highest not deprecated."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import RunHarness, definition
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.engine import Catalog
from processors.engine.errors import DefinitionError
from processors.engine.lifecycle import (
    LIFECYCLE_SCHEMA,
    Lifecycle,
    is_lifecycle,
    lifecycle_key,
    parse_lifecycle,
)
from processors.runtime.drop_reasons import START_REJECTED, dropped_reason
from schemas import Codec


def event(kind: str, revision: int | None, definition_id: str = "wf", reason: str = "") -> Lifecycle:
    body: dict[str, Any] = {"schema": LIFECYCLE_SCHEMA, "event": kind, "definition_id": definition_id}
    if revision is not None:
        body["revision"] = revision
    if reason:
        body["reason"] = reason
    return parse_lifecycle(body)


def revisions(*numbers: int) -> list[dict[str, Any]]:
    return [definition({"a": {"kind": "action", "action": f"do{n}"}}, revision=n) for n in numbers]


def harness(*numbers: int, events: tuple[Lifecycle, ...] = ()) -> RunHarness:
    h = RunHarness(*revisions(*numbers))
    for e in events:
        h.catalog.apply(e)
    return h


def test_a_deprecated_revision_is_refused_with_the_reason_and_what_to_start_instead() -> None:
    h = harness(1, 2, events=(event("deprecate", 2, reason="drops the approval"),))
    h.start({}, revision=2)
    assert h.types == ["RunRejected"]
    rejection = h.last.events[0]
    assert rejection["code"] == "Conflict" and rejection["revision"] == 2
    assert "wf@2 is deprecated (drops the approval): it starts no new run" in rejection["reason"]
    assert (
        "start wf@1 (latest)" in rejection["reason"] and "defs deprecate wf@2 --undo" in rejection["reason"]
    )


def test_an_unpinned_start_skips_deprecated_revisions() -> None:
    h = harness(1, 2, 3, events=(event("deprecate", 3),))
    h.start({})
    assert h.types[0] == "RunAccepted" and h.last.events[0]["revision"] == 2


def test_every_revision_deprecated_is_not_found_with_how_to_fix_it() -> None:
    h = harness(1, 2, events=(event("deprecate", 1), event("deprecate", 2)))
    h.start({})
    assert h.types == ["RunRejected"] and h.last.events[0]["code"] == "NotFound"
    assert "every revision of wf is deprecated (1, 2)" in h.last.events[0]["reason"]


def test_a_promoted_revision_is_latest_even_with_newer_ones_until_deprecated_or_unpinned() -> None:
    catalog = Catalog()
    for raw in revisions(1, 2, 3):
        catalog.register(raw)
    catalog.apply(event("promote", 1))
    assert catalog.get("wf").revision == 1  # type: ignore[union-attr]
    catalog.register(revisions(4)[0])
    assert catalog.latest("wf").revision == 1  # type: ignore[union-attr]
    catalog.apply(event("deprecate", 1))
    assert catalog.latest("wf").revision == 4  # type: ignore[union-attr]
    catalog.apply(event("reinstate", 1))
    assert catalog.latest("wf").revision == 1  # type: ignore[union-attr]
    catalog.apply(event("unpin", None))
    assert catalog.latest("wf").revision == 4  # type: ignore[union-attr]


def test_a_run_already_started_goes_on_and_a_bundle_carrying_start_is_not_refused() -> None:
    h = harness(1).start({})
    h.catalog.apply(event("deprecate", 1))
    h.complete("a", {"ok": True})
    assert h.status == "succeeded"
    bundle = h.catalog.pin_bundle("wf", 1).to_json()
    child = RunHarness(*revisions(1), run_id="r-2")
    child.catalog.apply(event("deprecate", 1))
    parent = {
        "parent_run_id": "r-1",
        "parent_node": "sub",
        "parent_lineage": "",
        "parent_dispatch_id": "d",
        "root_run_id": "r-1",
        "depth": 1,
    }
    child.start({}, revision=1, bundle=bundle, parent=parent)
    assert child.types[0] == "RunAccepted"


@pytest.mark.parametrize(
    "body",
    [
        {"schema": LIFECYCLE_SCHEMA, "event": "deprecate", "definition_id": "wf"},
        {"schema": LIFECYCLE_SCHEMA, "event": "unpin", "definition_id": "wf", "revision": 2},
        {"schema": LIFECYCLE_SCHEMA, "event": "delete", "definition_id": "wf", "revision": 2},
        {"schema": LIFECYCLE_SCHEMA, "event": "promote", "definition_id": "WF!", "revision": 2},
        {"schema": LIFECYCLE_SCHEMA, "event": "promote", "definition_id": "wf", "revision": 0},
        {"schema": LIFECYCLE_SCHEMA, "event": "promote", "definition_id": "wf", "revision": 1, "x": 1},
    ],
)
def test_malformed_lifecycle_events_are_refused(body: dict[str, Any]) -> None:
    assert is_lifecycle(body)
    with pytest.raises(DefinitionError):
        parse_lifecycle(body)


def test_a_lifecycle_record_is_an_ordinary_definition_record_an_older_reader_skips() -> None:
    """No schema change: the record encodes with today's DefinitionRecord schema, and a reader
    that predates lifecycle events (Catalog.register of every record) refuses it as a
    definition, a ValueError the definitions reader counts and logs, then goes on."""
    e = event("deprecate", 2, reason="bad prompt")
    record = {
        "definition_id": "wf",
        "revision": 0,
        "content_hash": "0" * 64,
        "definition": e.body(),
        "registered_ms": 1,
    }
    codec = Codec(history=[])
    assert codec.decode("definitions", codec.encode("definitions", record))["definition"] == e.body()
    with pytest.raises(ValueError):
        Catalog().register(e.body())
    assert lifecycle_key(e) == "wf@2#deprecation" and lifecycle_key(event("unpin", None)) == "wf#latest"
    assert not is_lifecycle(revisions(1)[0])


events = st.lists(
    st.tuples(st.sampled_from(["deprecate", "reinstate", "promote", "unpin"]), st.integers(1, 4)),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(events)
def test_latest_is_never_deprecated_and_follows_the_rule(sequence: list[tuple[str, int]]) -> None:
    """Revisions 1-3 registered (4 never is); any sequence of events. A model of the rule:
    the last promoted revision if registered and not deprecated, else the highest live one."""
    catalog = Catalog()
    for raw in revisions(1, 2, 3):
        catalog.register(raw)
    deprecated: set[int] = set()
    promoted: int | None = None
    for kind, revision in sequence:
        catalog.apply(event(kind, None if kind == "unpin" else revision))
        if kind == "deprecate":
            deprecated.add(revision)
        elif kind == "reinstate":
            deprecated.discard(revision)
        elif kind == "promote":
            promoted = revision
        else:
            promoted = None
    live = [r for r in (1, 2, 3) if r not in deprecated]
    expected = promoted if promoted in live else (max(live) if live else None)
    latest = catalog.latest("wf")
    assert (latest.revision if latest else None) == expected
    if latest is not None:
        assert not catalog.is_deprecated("wf", latest.revision)


def test_the_new_rejections_map_to_bounded_metric_labels() -> None:
    """`dropped_inputs{reason}` stays bounded: a deprecated start counts as a rejected start."""
    h = harness(1, 2, events=(event("deprecate", 2, reason="x"),))
    h.start({}, revision=2)
    assert dropped_reason(h.last.dropped or "") == START_REJECTED
    gone = harness(1, events=(event("deprecate", 1),)).start({})
    assert dropped_reason(gone.last.dropped or "") == START_REJECTED
