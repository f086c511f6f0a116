"""The pure workflow engine: decide, evolve, effects (docs/engine-api.md)."""

from processors.engine.catalog import Bundle, Catalog
from processors.engine.context import Decision, EngineContext
from processors.engine.decider import decide
from processors.engine.definition import Ceilings, Definition
from processors.engine.effects import Effects, effects
from processors.engine.errors import DefinitionError, EventBeforeStart
from processors.engine.evolve import evolve
from processors.engine.state import RunState, dump_state, load_state, run_status, state_digest
from processors.engine.validation import load_definition

__all__ = [
    "Bundle",
    "Catalog",
    "Ceilings",
    "Decision",
    "Definition",
    "DefinitionError",
    "Effects",
    "EngineContext",
    "EventBeforeStart",
    "RunState",
    "decide",
    "dump_state",
    "effects",
    "evolve",
    "load_definition",
    "load_state",
    "run_status",
    "state_digest",
]
