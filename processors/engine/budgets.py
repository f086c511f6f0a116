"""Budgets: effective limits at start and resume, reservations, warnings, exhaustion.

Steps, agents and retries are reserved before dispatch; tokens and cost are recorded
after a receipt; wall time runs on a timer. Only positive limits count. Exhaustion is
recoverable: BudgetExhausted, in-flight work cancelled, RunPaused; ResumeRun with more
budget continues (docs/semantics.md, "Budgets").
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final, NamedTuple

from processors.engine.definition import LIMIT_DIMENSIONS, Budgets, Ceilings
from processors.engine.emitter import Emitter
from processors.engine.state import RunState

# usage dimension -> limit key in the effective budgets
DIMENSIONS: dict[str, str] = {
    "steps": "max_steps",
    "retries": "max_retries",
    "agents": "max_agents",
    "tokens": "max_tokens",
    "cost_micros": "max_cost_micros",
    "wall_time_ms": "wall_time_ms",
}
_DIMENSION_ITEMS = tuple(DIMENSIONS.items())
_POSITION = {dimension: i for i, dimension in enumerate(DIMENSIONS)}
_LEDGER_DIMENSIONS = frozenset({"steps", "retries", "agents", "cost_micros"})  # named as in the ledger
RECORDED_AFTER = ("tokens", "cost_micros")  # exhausted when the recorded usage exceeds the limit
OVERRIDABLE = frozenset({*LIMIT_DIMENSIONS, "warn_at_percent"})


def usage(state: RunState, now: int | None = None) -> tuple[int, ...]:
    """What the run used of every dimension, in the order of DIMENSIONS (the wall time
    running since `wall.since_ms` counts only when `now` is given)."""
    ledger, wall = state["usage"], state["wall"]
    running = (now - wall["since_ms"]) if now is not None and wall["since_ms"] is not None else 0
    return (
        int(ledger["steps"]),
        int(ledger["retries"]),
        int(ledger["agents"]),
        int(ledger["prompt_tokens"] + ledger["completion_tokens"]),
        int(ledger["cost_micros"]),
        int(wall["used_ms"] + max(running, 0)),
    )


def used(state: RunState, dimension: str, now: int | None = None) -> int:
    """One dimension of `usage` (the step, agent and retry reservations, and cost, are the
    ledger's own entries: read without working out the other five)."""
    if dimension in _LEDGER_DIMENSIONS:
        return int(state["usage"][dimension])
    return usage(state, now)[_POSITION[dimension]]


def limit(state: RunState, dimension: str) -> int:
    return int(state["budgets"].get(DIMENSIONS[dimension]) or 0)


def effective_budgets(
    definition_budgets: Budgets, ceilings: Ceilings, overrides: Any, *, may_raise: bool
) -> tuple[dict[str, int] | None, str]:
    """The limits a run gets, or (None, reason). At start, overrides may only lower the
    definition's limits (`may_raise=False`); at resume they may raise them. Never above a
    server ceiling: exceeding one rejects, it does not clamp."""
    base, reason = _definition_limits(definition_budgets, ceilings)
    if base is None:
        return None, reason
    out = dict(base)
    if overrides is None:
        return out, ""
    if not isinstance(overrides, dict):
        return None, "budgets must be an object"
    for name, value in sorted(overrides.items()):
        if name not in OVERRIDABLE:
            return None, f"unknown budget {str(name)[:64]!r}"  # cut: the reason lands in a RunRejected
        if type(value) is not int or value < 0:
            return None, f"budget {name} must be a non-negative integer"
        if name == "warn_at_percent":
            if not 1 <= value <= 100:
                return None, "budget warn_at_percent must be within 1..100"
            out[name] = value
            continue
        if value == 0:  # a limit of 0 counts as none: above any definition's limit and any ceiling
            return None, f"budget {name} must be positive (0 would lift the limit)"
        ceiling = getattr(ceilings, name)
        if value > ceiling:
            return None, f"budget {name} {value} exceeds the server ceiling {ceiling}"
        if not may_raise and value > out[name]:
            return (
                None,
                f"budget {name} {value} exceeds the definition's limit {out[name]} (overrides may only lower)",
            )
        out[name] = value
    return out, ""


@lru_cache(maxsize=256)
def _definition_limits(definition_budgets: Budgets, ceilings: Ceilings) -> tuple[dict[str, int] | None, str]:
    """A definition's limits under the server ceilings, or (None, reason). Both are immutable,
    so this is worked out once per pair, not at every start (callers copy the dict)."""
    for name, value in definition_budgets.limits().items():
        if value > getattr(ceilings, name):
            return (
                None,
                f"definition exceeds server workflow budget ceilings: {name} {value} > {getattr(ceilings, name)}",
            )
    return ceilings.effective(definition_budgets), ""


def fits(state: RunState, dimension: str, amount: int) -> bool:
    cap = limit(state, dimension)
    return cap <= 0 or used(state, dimension) + amount <= cap


class Overrun(NamedTuple):
    """A budget dimension that does not fit: what `steps.pause_for` reports and pauses for.
    `amount`: what was about to be spent on top of the recorded usage (0: already spent)."""

    dimension: str
    reason: str
    amount: int = 0


def overrun(state: RunState, steps: int, agents: int, mapped: bool) -> Overrun | None:
    """Whether the steps and agents about to be dispatched overrun a budget, and which."""
    if not fits(state, "steps", steps):
        reason = (
            "map cardinality exceeds remaining workflow step budget"
            if mapped
            else "workflow step budget exhausted"
        )
        return Overrun("steps", reason, steps)
    if not fits(state, "agents", agents):
        return Overrun("agents", "workflow agent budget exhausted", agents)
    return None


WALL_TIME_OVERRUN: Final = Overrun("wall_time_ms", "workflow wall-time budget exceeded")


def enforce(em: Emitter) -> Overrun | None:
    """Warn once per dimension at warn_at_percent (BudgetWarning); the recorded usage that
    overran a limit, if any (the caller pauses the run)."""
    state = em.state
    limits = state["budgets"]
    percent = int(limits.get("warn_at_percent") or 80)
    # every dimension's usage at once: this runs after every receipt, and a BudgetWarning
    # changes none of them
    for (dimension, limit_key), amount in zip(_DIMENSION_ITEMS, usage(state, em.ts), strict=True):
        cap = limits.get(limit_key) or 0
        if cap <= 0 or amount * 100 < cap * percent:
            continue
        if dimension in RECORDED_AFTER and amount > cap:
            return Overrun(dimension, f"workflow {dimension.replace('_', ' ')} budget exhausted")
        if dimension not in state["warned"]:
            em.emit("BudgetWarning", dimension=dimension, used=amount, limit=cap)
            state = em.state
    return None
