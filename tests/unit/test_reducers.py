"""Reducers, superstep write application and state-node mutations."""

from __future__ import annotations

from typing import Any

import pytest

from processors.engine.errors import ReducerConflict, ReducerTypeError
from processors.engine.reducers import apply_mutations, apply_writes, lineage_order, merge


@pytest.mark.parametrize(
    ("policy", "current", "incoming", "expected"),
    [
        ("replace", [1], 2, 2),
        ("replace", 1, None, None),
        ("reject_concurrent", 1, 2, 2),
        ("append", [1], [2, 3], [1, 2, 3]),
        ("append", [1], "x", [1, "x"]),
        ("append", None, {"a": 1}, [{"a": 1}]),
        ("merge", {"a": 1, "b": 1}, {"b": 2, "c": 3}, {"a": 1, "b": 2, "c": 3}),
        ("merge", None, {"a": 1}, {"a": 1}),
        ("sum", 1, 2, 3),
        ("sum", None, 2.5, 2.5),
        ("max", 1, 5, 5),
        ("max", 7, 5, 7),
        ("max", None, -1, -1),
    ],
)
def test_merge_policies(policy: str, current: Any, incoming: Any, expected: Any) -> None:
    assert merge(policy, current, incoming) == expected


@pytest.mark.parametrize(
    ("policy", "current", "incoming", "reason"),
    [
        ("append", {"a": 1}, 1, "append needs a list in state, found object"),
        ("merge", {"a": 1}, [1], "merge needs objects, found object in state and array written"),
        ("merge", 3, {"a": 1}, "merge needs objects, found number in state and object written"),
        ("sum", 1, "2", "sum needs numbers, found number in state and string written"),
        ("sum", 1, True, "sum needs numbers, found number in state and boolean written"),
        ("max", "a", 1, "max needs numbers, found string in state and number written"),
        ("average", 1, 1, "unknown reducer 'average'"),
    ],
)
def test_merge_type_errors_name_key_and_reason(policy: str, current: Any, incoming: Any, reason: str) -> None:
    with pytest.raises(ReducerTypeError) as info:
        merge(policy, current, incoming, key="k")
    assert (info.value.key, info.value.reason) == ("k", reason)
    assert info.value.code == "State"


def test_merge_never_mutates_its_arguments() -> None:
    current, incoming = [1], [2]
    merge("append", current, incoming)
    d = {"a": 1}
    merge("merge", d, {"b": 2})
    assert current == [1] and d == {"a": 1}


def test_apply_writes_orders_by_node_then_lineage_and_is_pure() -> None:
    state = {"notes": ["seed"], "last": None, "total": 0}
    writes = [
        ("notes", "search", "10", "n10"),
        ("notes", "search", "2", "n2"),
        ("notes", "plan", "", "p"),
        ("notes", "search", "", "s"),
        ("last", "b", "", "from-b"),
        ("last", "a", "", "from-a"),
        ("total", "x", "0", 2),
        ("total", "x", "1", 3),
    ]
    out = apply_writes(state, writes, {"notes": "append", "total": "sum"})
    assert out == {"notes": ["seed", "p", "s", "n2", "n10"], "last": "from-b", "total": 5}
    assert state == {"notes": ["seed"], "last": None, "total": 0}
    shuffled = apply_writes(state, list(reversed(writes)), {"notes": "append", "total": "sum"})
    assert shuffled == out
    assert lineage_order("") < lineage_order("0") < lineage_order("2") < lineage_order("10")


def test_reject_concurrent_allows_one_writer_and_rejects_two() -> None:
    state = {"count": 0}
    assert apply_writes(state, [("count", "inc", "", 1)], {"count": "reject_concurrent"}) == {"count": 1}
    with pytest.raises(ReducerConflict) as info:
        apply_writes(
            state,
            [("count", "b", "", 2), ("count", "a", "1", 1), ("count", "a", "0", 1)],
            {"count": "reject_concurrent"},
        )
    assert info.value.key == "count"
    assert info.value.writers == [("a", "0"), ("a", "1"), ("b", "")]
    assert "a[0], a[1], b" in str(info.value)


def test_apply_writes_type_errors_and_undeclared_keys_name_the_key() -> None:
    with pytest.raises(ReducerTypeError) as info:
        apply_writes({"total": 0}, [("total", "a", "", "x")], {"total": "sum"})
    assert info.value.key == "total"
    with pytest.raises(ReducerTypeError, match="'ghost': not a declared state key"):
        apply_writes({"total": 0}, [("ghost", "a", "", 1)], {})


def test_mutations() -> None:
    state = {"n": None, "l": [1, 2, 1], "d": {"a": 1, "b": 2}, "s": "x", "flag": [True, 1]}
    out = apply_mutations(
        state,
        [
            ("increment", "n", None),
            ("increment", "n", 2),
            ("append", "l", 3),
            ("remove", "l", 1),
            ("remove", "d", "a"),
            ("set", "s", {"new": True}),
            ("remove", "flag", True),
        ],
    )
    assert out == {"n": 3, "l": [2, 3], "d": {"b": 2}, "s": {"new": True}, "flag": [1]}
    assert state["n"] is None and state["l"] == [1, 2, 1]
    assert apply_mutations({"x": [1]}, [("remove", "x", None)]) == {"x": None}


def test_mutation_errors() -> None:
    with pytest.raises(ReducerTypeError, match="'ghost': not a declared state key"):
        apply_mutations({}, [("set", "ghost", 1)])
    with pytest.raises(ReducerTypeError, match="sum needs numbers"):
        apply_mutations({"n": "a"}, [("increment", "n", 1)])
    with pytest.raises(ReducerTypeError, match="remove needs a list or object"):
        apply_mutations({"n": 1}, [("remove", "n", 1)])
    with pytest.raises(ReducerTypeError, match="unknown mutation 'zap'"):
        apply_mutations({"n": 1}, [("zap", "n", 1)])
