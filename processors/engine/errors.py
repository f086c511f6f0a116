"""Errors raised by the definition language and its building blocks.

Every error says what was wrong and where; none of them carries a user value
(a secret could hide in any value), only paths, keys and rule names.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Issue:
    """One finding about a definition: a dotted path (`nodes.search.retry.max_attempts`,
    list items as `[0]`) and a message (`must be >= 1`)."""

    path: str
    message: str
    severity: Severity = "error"
    rule: str = ""  # short machine name of the rule, e.g. "unknown_node", "secret_literal"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class DefinitionError(ValueError):
    """A definition (or bundle) is invalid. `errors` lists every error found, not just the first."""

    code = "InvalidInput"

    def __init__(self, errors: list[Issue]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(str(issue) for issue in self.errors))


class ConditionError(Exception):
    """A route condition failed to compile or evaluate, or did not yield a bool."""

    code = "Evaluation"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class EventBeforeStart(ValueError):
    """A run event of a run whose `RunAccepted` was not folded first. In a committed log this
    means the log no longer holds the run's beginning (run-events retention deleted it): the
    run cannot be rebuilt from it. `run_id` names the run."""

    def __init__(self, event_type: str, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"{event_type} for run {run_id!r} before its RunAccepted")


class RefError(Exception):
    """A reference could not be resolved (absent scope, missing pointer target, bad shape)."""

    code = "UnknownReference"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(f"UnknownReference: {message}")


class ReducerConflict(Exception):
    """A `reject_concurrent` state key was written by more than one node instance in one superstep."""

    code = "State"

    def __init__(self, key: str, writers: list[tuple[str, str]]) -> None:
        self.key = key
        self.writers = list(writers)
        names = ", ".join(f"{node}[{lineage}]" if lineage else node for node, lineage in self.writers)
        super().__init__(f"state key {key!r} is reject_concurrent but was written by {names}")


class ReducerTypeError(Exception):
    """A write cannot be merged into a state key (e.g. `sum` of a non-number)."""

    code = "State"

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"state key {key!r}: {reason}" if key else reason)


def schema_error(error: Any) -> str:
    """A JSON Schema error without the offending value (it may hold a secret): where, which rule,
    and what the schema asked for, in the schema's own words (property names it requires, the
    type it expects), so the producer can fix the message without the schema at hand."""
    path = error.json_path
    rule, wanted, detail = error.validator, error.validator_value, ""
    if rule == "required" and isinstance(error.instance, dict) and isinstance(wanted, list):
        missing = [str(name) for name in wanted if name not in error.instance]
        detail = f": missing {', '.join(repr(m) for m in missing)}" if missing else ""
    elif rule == "type":
        detail = f": expected {' or '.join(wanted) if isinstance(wanted, list) else wanted}"
    return f"at {path} fails {rule!r}{detail} (schema {'/'.join(str(p) for p in error.schema_path)})"


# The frames a schema check may use, counted from where it starts: Python's default limit, so
# that while a check runs the interpreter's limit only ever rises above the default.
SCHEMA_CHECK_FRAMES = 1_000
# The recursion limit is the interpreter's, shared by every thread: checks in the worker's
# threads (an agent's structured output) take turns, so that one never restores a limit another
# had set for itself.
_LIMIT_LOCK = threading.Lock()


def schema_problem(validator: Any, value: Any) -> str | None:
    """How `value` fails `validator` first (`schema_error`'s words), or None if it conforms.

    jsonschema recurses in Python, a few frames per level of the value and more for a schema
    whose `$ref`s nest (16+ a level for a contrived one), so a value within `max_json_depth`
    can still exhaust the stack. How many frames the caller left differs between callers, and
    between the interpreted and the compiled engine (compiled functions take no frame), so the
    check gets the same budget whoever calls it, and a value that exhausts it fails the check:
    the same answer everywhere, and never an exception out of `decide`. The limit is only ever
    raised for the check, never lowered: other threads may be recursing under a limit their
    code raised (the budget is then that limit's, more than the default's; the processor keeps
    the default)."""
    depth = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:  # the Python frames under this one: what the recursion limit counts
        depth, frame = depth + 1, frame.f_back
    with _LIMIT_LOCK:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, depth + SCHEMA_CHECK_FRAMES))
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except RecursionError:
            return (
                f"cannot be checked: the schema's checks nest past {SCHEMA_CHECK_FRAMES} frames on this value"
            )
        finally:
            sys.setrecursionlimit(limit)
    return None if error is None else schema_error(error)
