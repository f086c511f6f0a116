"""Route conditions in CEL (the `cel` package, cel-rust underneath).

A condition sees three variables: `state` (the merged state), `input` (the run input)
and `output` (the output of the node whose routes are evaluated; null if it has none).
JSON maps to CEL directly: objects → map, arrays → list, integers → int, floats →
double, null → null. CEL never coerces `int` and `double` in arithmetic
(`state.count + 0.5` is an error: write `double(state.count) + 0.5`), though comparisons
across them work. A missing key is an error (use `has(state.x)`), as is a result that is
not a bool: both surface as `ConditionError`.

Programs are compiled once per expression text and reused. Converting Python values to
CEL costs time proportional to their size, so a program is handed only the parts of
`state`, `input` and `output` it reads through field selections (`state.a.b` converts
`b`, not the whole state; `condition_limits.narrow`).

Conditions are bounded (`condition_limits`): registration refuses one that is too long,
too deeply nested or nests too many comprehensions, and an evaluation whose estimated
cost on the data it is handed exceeds the budget is not run. Both raise `ConditionLimit`
(a `ConditionError`, so the run fails with code `Evaluation`), naming the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

import cel

from processors.engine.condition_limits import (
    MAX_CHARS,
    MAX_COST_NS,
    Analysis,
    ConditionLimit,
    analyze,
    estimate_ns,
    narrow,
)
from processors.engine.definition import END, Route
from processors.engine.errors import ConditionError

VARIABLES: Final = ("state", "input", "output")
_MAX_MESSAGE = 240


class Condition:
    """A compiled route condition. Immutable; safe to share across runs."""

    __slots__ = ("_analysis", "_program", "source")

    def __init__(self, source: str, program: Any, analysis: Analysis) -> None:
        self.source = source
        self._program = program
        self._analysis = analysis

    def evaluate(self, *, state: Any, input: Any, output: Any = None) -> bool:
        """True or False; `ConditionError` for any evaluation error or a non-bool result,
        `ConditionLimit` (rule `condition_cost`) when its estimated cost on this data is over
        the budget (it is then not run)."""
        values = {"state": state, "input": input, "output": output}
        variables = {name: narrow(values[name], paths) for name, paths in self._analysis.reads.items()}
        cost = estimate_ns(self._analysis.tree, variables)
        if cost > MAX_COST_NS:
            raise ConditionLimit(
                "condition_cost",
                (
                    f"condition {_quoted(self.source)} was not evaluated: on this data its estimated cost "
                    f"({cost / 1e6:,.0f} ms) exceeds the limit of {MAX_COST_NS / 1e6:,.0f} ms; read less "
                    "(select the fields you need) or iterate over smaller lists"
                ),
            )
        try:
            result = self._program.execute(variables)
        except Exception as exc:  # the binding raises several types (KeyError, TypeError, RuntimeError, ...)
            raise ConditionError(f"condition {_quoted(self.source)} failed: {_describe(exc)}") from None
        if type(result) is not bool:
            raise ConditionError(
                f"condition {_quoted(self.source)} must yield a bool, got {_cel_type_name(result)}"
            )
        return result

    def __repr__(self) -> str:
        return f"Condition({self.source!r})"


def _quoted(source: str) -> str:
    """The condition in a message: whole when short, else its start (a limit error must stay small)."""
    return repr(source) if len(source) <= 120 else repr(source[:117] + "...")


@lru_cache(maxsize=4096)
def compile_condition(expr: str) -> Condition:
    """Compile (cached by expression text). Raises `ConditionError` for a syntax error and
    `ConditionLimit` for a condition over a registration limit (length, depth, nesting)."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConditionError("condition must be a non-empty CEL expression")
    if len(expr) > MAX_CHARS:  # before compiling: the parser's time grows with the text
        raise ConditionLimit(
            "condition_length", f"condition is {len(expr)} characters; the limit is {MAX_CHARS}"
        )
    try:
        program = cel.compile(expr)
    except Exception as exc:
        raise ConditionError(f"invalid CEL condition {_quoted(expr)}: {_describe(exc)}") from None
    return Condition(expr, program, analyze(expr))


def unknown_variables(expr: str) -> set[str]:
    """Free variables other than state/input/output. Comprehension variables
    (`state.items.exists(i, i > 1)`) also appear here, so callers treat this as a hint."""
    return set(compile_condition(expr)._program.variables()) - set(VARIABLES)


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
