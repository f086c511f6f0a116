"""What `decide(state, msg, ctx)` takes besides the state and the message, and what it gives.

A `Decision` carries the events `decide` emitted and the run state after each of them: the
engine folds every event as it emits it (emitter.py), so the runtime takes those states instead
of folding the same events a second time. `evolve` is the fold itself, for whoever has only
the events (restore, replay, a downstream consumer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.engine.definition import Ceilings
from processors.engine.state import RunState

Event = dict[str, Any]


@dataclass(frozen=True)
class EngineContext:
    """What `decide` may consult besides the run state: the definition catalog, the server
    ceilings and the activation queues that exist (node queues must be among them)."""

    catalog: Any  # processors.engine.catalog.Catalog (Any: tests may pass a subclass)
    ceilings: Ceilings = field(default_factory=Ceilings)
    queues: frozenset[str] = frozenset({"default", "agents"})


@dataclass(frozen=True, slots=True)
class Decision:
    """`events` to append, in order; `states[i]`: the run state after `events[i]` (what
    `evolve` gives; None only for a run that never was, after a RunRejected of its start);
    `dropped`: why the input changed nothing, when it did not."""

    events: list[Event]
    states: list[RunState | None]
    dropped: str | None = None

    def state_after(self, before: RunState | None) -> RunState | None:
        """The run state after the whole decision (`before` when it emitted nothing)."""
        return self.states[-1] if self.states else before


def unchanged(dropped: str) -> Decision:
    """Nothing to emit, and why."""
    return Decision([], [], dropped)


def rejected(state: RunState | None, event: Event, dropped: str) -> Decision:
    """A `RunRejected` (sequence 0: it belongs to no run and changes none) and why."""
    return Decision([event], [state], dropped)
