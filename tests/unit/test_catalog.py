"""Catalog registration, revisions, bundle pinning, hashing and wire round trips."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest

from processors.engine.catalog import Bundle, Catalog, Ceilings, bundle_hash, content_hash, parse_key
from processors.engine.errors import DefinitionError
from processors.engine.validation import load_definition


def defn(
    def_id: str, revision: int = 1, children: tuple[tuple[str, int], ...] = (), **extra: Any
) -> dict[str, Any]:
    nodes: dict[str, Any] = {"s": {"kind": "state"}}
    for index, (child, child_rev) in enumerate(children):
        nodes[f"c{index}"] = {"kind": "workflow", "workflow": child, "revision": child_rev}
    return {
        "schema": "runfold.workflow/v1",
        "id": def_id,
        "revision": revision,
        "entry": list(nodes),
        "nodes": nodes,
        **extra,
    }


def test_register_get_latest_and_revisions() -> None:
    catalog = Catalog()
    catalog.register(defn("a", 2))
    catalog.register(defn("a", 1))
    assert catalog.revisions("a") == [1, 2]
    latest = catalog.get("a")
    assert latest is not None and latest.revision == 2
    assert catalog.get("a", 1) is not None and catalog.get("a", 3) is None and catalog.get("zz") is None
    assert catalog.ids() == ["a"]


def test_reregistering_identical_content_is_a_noop_even_if_spelled_differently() -> None:
    catalog = Catalog()
    first = catalog.register(defn("a"))
    spelled = defn("a")
    spelled["nodes"]["s"]["on_failure"] = "fail_fast"  # an explicit default
    assert catalog.register(spelled) is first
    assert catalog.register(first) is first


def test_same_revision_different_content_is_a_conflict() -> None:
    catalog = Catalog()
    catalog.register(defn("a"))
    with pytest.raises(DefinitionError, match="a@1 is already registered with different content") as info:
        catalog.register(defn("a", description="changed"))
    assert info.value.errors[0].rule == "conflict"


def test_register_validates_against_the_catalog_ceilings() -> None:
    catalog = Catalog(Ceilings(max_steps=100))
    with pytest.raises(
        DefinitionError, match=re.escape("budgets.max_steps: 101 exceeds the server ceiling 100")
    ):
        catalog.register(defn("a", budgets={"max_steps": 101}))
    assert catalog.get("a") is None


def test_content_hash_is_stable_and_content_sensitive() -> None:
    a = load_definition(defn("a"))
    reordered = dict(reversed(list(defn("a").items())))
    assert content_hash(a) == content_hash(load_definition(reordered))
    assert content_hash(a) != content_hash(load_definition(defn("a", description="x")))


def test_pin_bundle_includes_every_nested_child_once() -> None:
    catalog = Catalog()
    catalog.register(defn("leaf"))
    catalog.register(defn("mid", children=(("leaf", 1),)))
    catalog.register(defn("root", 3, children=(("mid", 1), ("leaf", 1))))
    bundle = catalog.pin_bundle("root", 3)
    assert bundle.root == "root@3"
    assert sorted(bundle.definitions) == ["leaf@1", "mid@1", "root@3"]
    assert bundle.definition().key == "root@3"
    assert bundle.definition("leaf@1") is bundle.definition("leaf@1")
    assert catalog.pin_bundle("root") == bundle  # latest, same content, same hash
    sub = bundle.child("mid", 1)
    assert sub.root == "mid@1" and sorted(sub.definitions) == ["leaf@1", "mid@1"]
    with pytest.raises(KeyError, match="nope@1 is not in bundle root@3"):
        bundle.definition("nope@1")


def test_pin_bundle_errors() -> None:
    catalog = Catalog()
    with pytest.raises(DefinitionError, match="unknown definition ghost"):
        catalog.pin_bundle("ghost")
    catalog.register(defn("root", children=(("child", 2),)))
    with pytest.raises(
        DefinitionError, match=r"bundle.root@1.nodes.c0.workflow: unknown child workflow child@2"
    ):
        catalog.pin_bundle("root")


def test_nested_cycles_are_detected() -> None:
    catalog = Catalog()
    catalog.register(defn("research-brief", 3, children=(("summarize", 2),)))
    catalog.register(defn("summarize", 2, children=(("research-brief", 3),)))
    with pytest.raises(DefinitionError, match="nested workflow cycle includes research-brief@3") as info:
        catalog.pin_bundle("research-brief", 3)
    assert info.value.errors[0].rule == "cycle"
    catalog.register(defn("selfish", children=(("selfish", 1),)))
    with pytest.raises(DefinitionError, match="nested workflow cycle includes selfish@1"):
        catalog.pin_bundle("selfish")


def test_nested_budgets_must_fit_the_roots_and_depth_is_bounded() -> None:
    catalog = Catalog()
    catalog.register(defn("child", budgets={"max_steps": 500, "max_tokens": 10}))
    catalog.register(defn("root", children=(("child", 1),), budgets={"max_steps": 100}))
    with pytest.raises(
        DefinitionError,
        match=re.escape("bundle.child@1.budgets.max_steps: 500 exceeds the root root@1 limit 100"),
    ):
        catalog.pin_bundle("root")
    catalog.register(defn("d3"))
    catalog.register(defn("d2", children=(("d3", 1),)))
    catalog.register(defn("d1", children=(("d2", 1),)))
    catalog.register(defn("shallow", children=(("d1", 1),), budgets={"max_nesting_depth": 2}))
    # max_nesting_depth counts the levels of the run tree, the root included (seeds 001, 003)
    with pytest.raises(DefinitionError, match=re.escape("4 levels in all, over its max_nesting_depth 2")):
        catalog.pin_bundle("shallow")
    catalog.register(defn("three", children=(("d1", 1),), budgets={"max_nesting_depth": 3}))
    with pytest.raises(DefinitionError, match=re.escape("4 levels in all, over its max_nesting_depth 3")):
        catalog.pin_bundle("three")
    catalog.register(defn("deep", children=(("d1", 1),), budgets={"max_nesting_depth": 4}))
    assert len(catalog.pin_bundle("deep").definitions) == 4


def test_bundle_wire_round_trip_and_tamper_detection() -> None:
    catalog = Catalog()
    catalog.register(defn("leaf"))
    catalog.register(defn("root", children=(("leaf", 1),)))
    bundle = catalog.pin_bundle("root")
    wire = orjson.dumps(bundle.to_json())
    again = Bundle.from_json(wire)
    assert again == bundle and again.hash == bundle.hash and again.definition().key == "root@1"
    assert Bundle.from_json(bundle.to_json()) == bundle

    tampered = copy.deepcopy(bundle.to_json())
    tampered["definitions"]["leaf@1"]["description"] = "evil"
    with pytest.raises(DefinitionError, match=re.escape("bundle.hash: does not match")):
        Bundle.from_json(tampered)

    missing = {"root": "root@1", "definitions": {"root@1": bundle.definitions["root@1"]}}
    missing["hash"] = Bundle.of("root@1", {"root@1": bundle.definition()}).hash
    with pytest.raises(DefinitionError, match="unknown child workflow leaf@1"):
        Bundle.from_json(missing)

    extra = copy.deepcopy(bundle.to_json())
    extra["definitions"]["stray@1"] = load_definition(defn("stray")).canonical()
    extra["hash"] = bundle_hash(extra["root"], extra["definitions"])
    with pytest.raises(DefinitionError, match="not used by the root: stray@1"):
        Bundle.from_json(extra)

    with pytest.raises(DefinitionError, match=re.escape("must be {root, definitions, hash}")):
        Bundle.from_json({"root": "x"})
    with pytest.raises(DefinitionError, match="not valid JSON"):
        Bundle.from_json(b"{nope")


def test_bundle_from_json_revalidates_definitions_and_ceilings() -> None:
    bad = defn("root", budgets={"max_steps": 50})
    body = load_definition(bad).canonical()
    body["entry"] = ["ghost"]
    definitions = {"root@1": body}
    wire = {"root": "root@1", "definitions": definitions, "hash": bundle_hash("root@1", definitions)}
    with pytest.raises(DefinitionError, match=r"bundle.root@1.entry\[0\]: unknown node 'ghost'"):
        Bundle.from_json(wire)
    good = Catalog().register(defn("root", budgets={"max_steps": 50}))
    wire = Bundle.of("root@1", {"root@1": good}).to_json()
    with pytest.raises(DefinitionError, match="exceeds the server ceiling 10"):
        Bundle.from_json(wire, Ceilings(max_steps=10))


def test_parse_key() -> None:
    assert parse_key("research-brief@3") == ("research-brief", 3)
    with pytest.raises(DefinitionError):
        parse_key("no-revision")
