"""References, templates, RFC 6901 pointers and input hashes."""

from __future__ import annotations

from typing import Any

import pytest

from processors.engine.definition import Ref
from processors.engine.errors import RefError
from processors.engine.refs import Scope, input_hash, iter_refs, pointer_get, resolve

DOC: dict[str, Any] = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
    "nested": {"list": [{"x": None}]},
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [  # RFC 6901 section 5
        ("", DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
        ("/nested/list/0/x", None),
    ],
)
def test_rfc6901_examples(pointer: str, expected: Any) -> None:
    assert pointer_get(DOC, pointer) == expected


@pytest.mark.parametrize(
    ("pointer", "reason"),
    [
        ("foo", "must be empty or start with '/'"),
        ("/missing", "no key 'missing'"),
        ("/foo/2", "index 2 out of range"),
        ("/foo/-", "'-' is not an array index"),
        ("/foo/01", "'01' is not an array index"),
        ("/foo/0/x", "cannot descend into a string"),
        ("/nested/list/0/x/y", "cannot descend into a null"),
    ],
)
def test_missing_targets_raise_key_error_with_a_reason(pointer: str, reason: str) -> None:
    with pytest.raises(KeyError) as info:
        pointer_get(DOC, pointer)
    assert reason in str(info.value)


def test_resolve_walks_templates_and_resolves_every_source() -> None:
    scope = Scope(
        input={"topic": "kafka"}, state={"notes": ["n1"]}, output={"v": 1}, item="q1", signal={"ok": True}
    )
    template = {
        "query": {"from": "item"},
        "topic": {"from": "input", "pointer": "/topic"},
        "first": {"from": "state", "pointer": "/notes/0"},
        "list": [{"from": "output", "pointer": "/v"}, "plain", 3, None],
        "sig": {"from": "signal", "pointer": "/ok"},
        "lit": {"from": "literal", "value": {"from": "not a ref"}},
        "lit_ptr": {"from": "literal", "value": {"a": [5]}, "pointer": "/a/0"},
    }
    assert resolve(template, scope) == {
        "query": "q1",
        "topic": "kafka",
        "first": "n1",
        "list": [1, "plain", 3, None],
        "sig": True,
        "lit": {"from": "not a ref"},
        "lit_ptr": 5,
    }


def test_resolve_accepts_ref_models_and_whole_values() -> None:
    scope = Scope(state={"brief": {"t": 1}})
    assert resolve(Ref.model_validate({"from": "state", "pointer": "/brief"}), scope) == {"t": 1}
    assert resolve({"from": "state"}, scope) == {"brief": {"t": 1}}


def test_resolve_copies_containers_of_the_template() -> None:
    template = {"a": [1, {"b": 2}]}
    out = resolve(template, Scope())
    assert out == template and out is not template and out["a"] is not template["a"]


def test_null_is_a_value_but_absent_scope_is_an_unknown_reference() -> None:
    assert resolve({"from": "output"}, Scope(output=None)) is None
    with pytest.raises(RefError, match="UnknownReference: no 'item' in this scope") as info:
        resolve({"x": {"from": "item"}}, Scope(state={}))
    assert info.value.code == "UnknownReference"


def test_missing_pointer_and_bad_source_are_unknown_references() -> None:
    with pytest.raises(RefError, match=r"UnknownReference: /plan/queries not found in state: no key 'plan'"):
        resolve({"from": "state", "pointer": "/plan/queries"}, Scope(state={"secret_value": "sk-x"}))
    with pytest.raises(RefError, match="unknown reference source 'elsewhere'"):
        resolve({"from": "elsewhere"}, Scope())
    with pytest.raises(RefError, match="pointer of a 'state' reference must be a string"):
        resolve({"from": "state", "pointer": 3}, Scope(state={}))


def test_error_messages_never_contain_values() -> None:
    with pytest.raises(RefError) as info:
        resolve({"from": "state", "pointer": "/token/x"}, Scope(state={"token": "sk-verysecret"}))
    assert "sk-verysecret" not in str(info.value)


def test_input_hash_is_canonical() -> None:
    a = input_hash({"b": 1, "a": [1, 2, {"z": None, "y": "é"}]})
    b = input_hash({"a": [1, 2, {"y": "é", "z": None}], "b": 1})
    assert a == b and len(a) == 64
    assert input_hash({"a": 1}) != input_hash({"a": 1.0})
    assert input_hash([1, 2]) != input_hash([2, 1])


def test_iter_refs_lists_paths() -> None:
    found = iter_refs({"a": [{"from": "item"}], "b": {"c": {"from": "state", "pointer": "/x"}}}, "in")
    assert [path for path, _ in found] == ["in.a[0]", "in.b.c"]
