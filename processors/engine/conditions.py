"""Route conditions in CEL (the `cel` package, cel-rust underneath).

A condition sees three variables: `state` (the merged state), `input` (the run input)
and `output` (the output of the node whose routes are evaluated; null if it has none).
JSON maps to CEL directly: objects → map, arrays → list, integers → int, floats →
double, null → null. CEL never coerces `int` and `double` in arithmetic
(`state.count + 0.5` is an error: write `double(state.count) + 0.5`), though comparisons
across them work. A missing key is an error (use `has(state.x)`), as is a result that is
not a bool: both surface as `ConditionError`.

Programs are compiled once per expression text and reused. Converting Python values to
CEL costs time proportional to their size, so when an expression reads `state` only as
`state.<key>` (the common case), only those keys are converted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

import cel

from processors.engine.definition import END, Route
from processors.engine.errors import ConditionError

VARIABLES: Final = ("state", "input", "output")
_STRING_LITERAL = re.compile(
    r"""[rRbB]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")"""
)
_MAX_MESSAGE = 240


class Condition:
    """A compiled route condition. Immutable; safe to share across runs."""

    __slots__ = ("_input_keys", "_program", "_state_keys", "_uses", "source")

    def __init__(self, source: str, program: Any) -> None:
        self.source = source
        self._program = program
        uses = set(program.variables())
        stripped = _STRING_LITERAL.sub('""', source)
        self._uses = frozenset(uses)
        self._state_keys = _field_keys(stripped, "state") if "state" in uses else ()
        self._input_keys = _field_keys(stripped, "input") if "input" in uses else ()

    def evaluate(self, *, state: Any, input: Any, output: Any = None) -> bool:
        """True or False; `ConditionError` for any evaluation error or a non-bool result."""
        variables: dict[str, Any] = {}
        if "state" in self._uses:
            variables["state"] = _narrow(state, self._state_keys)
        if "input" in self._uses:
            variables["input"] = _narrow(input, self._input_keys)
        if "output" in self._uses:
            variables["output"] = output
        try:
            result = self._program.execute(variables)
        except Exception as exc:  # the binding raises several types (KeyError, TypeError, RuntimeError, ...)
            raise ConditionError(f"condition {self.source!r} failed: {_describe(exc)}") from None
        if type(result) is not bool:
            raise ConditionError(f"condition {self.source!r} must yield a bool, got {_cel_type_name(result)}")
        return result

    def __repr__(self) -> str:
        return f"Condition({self.source!r})"


@lru_cache(maxsize=4096)
def compile_condition(expr: str) -> Condition:
    """Compile (cached by expression text). Raises `ConditionError` for a syntax error."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConditionError("condition must be a non-empty CEL expression")
    try:
        program = cel.compile(expr)
    except Exception as exc:
        raise ConditionError(f"invalid CEL condition {expr!r}: {_describe(exc)}") from None
    return Condition(expr, program)


def unknown_variables(expr: str) -> set[str]:
    """Free variables other than state/input/output. Comprehension variables
    (`state.items.exists(i, i > 1)`) also appear here, so callers treat this as a hint."""
    return set(compile_condition(expr)._uses) - set(VARIABLES)


def _field_keys(expr: str, name: str) -> tuple[str, ...] | None:
    """The keys read as `name.<key>` if every use of `name` has that form, else None
    (meaning: pass the whole value). `expr` has its string literals blanked out."""
    keys: list[str] = []
    for match in re.finditer(rf"(?<![\w.]){name}\b(\s*\.\s*([A-Za-z_][A-Za-z0-9_]*))?", expr):
        if match.group(2) is None:
            return None
        keys.append(match.group(2))
    return tuple(dict.fromkeys(keys))


def _narrow(value: Any, keys: tuple[str, ...] | None) -> Any:
    if keys is None or not isinstance(value, dict):
        return value
    return {key: value[key] for key in keys if key in value}


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        text = f"no such key {exc.args[0]!r}" if exc.args else "no such key"
    else:
        lines = str(exc).strip().splitlines()
        text = " ".join(line.strip() for line in lines[:3]) if lines else type(exc).__name__
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _cel_type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {int: "int", float: "double", str: "string", list: "list", dict: "map", bytes: "bytes"}.get(
        type(value), type(value).__name__
    )


def select_routes(routes: Sequence[Route], *, state: Any, input: Any, output: Any = None) -> list[str]:
    """The nodes a finished node routes to (`end` and duplicates dropped, list order kept).

    Routes are checked in order. A route with `when` is taken if its condition holds;
    several can hold (a conditional fan-out). A route without `when` is taken unless an
    earlier conditional route in the list was taken: it is the `else`. So `[a, b]` fans
    out to both, `[{to: a, when: c}, {to: b}]` is if/else, and `[{to: end, when: c},
    {to: loop}]` ends the branch when `c` holds. `end` adds no node: the run finishes when
    no node is left to run. Raises `ConditionError`.
    """
    targets: list[str] = []
    conditional_taken = False
    for route in routes:
        if route.when is None:
            if conditional_taken:
                continue
        elif compile_condition(route.when).evaluate(state=state, input=input, output=output):
            conditional_taken = True
        else:
            continue
        if route.to != END and route.to not in targets:
            targets.append(route.to)
    return targets
