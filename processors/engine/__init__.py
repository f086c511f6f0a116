"""The pure workflow engine: decide, evolve, effects (docs/engine-api.md)."""

from processors.native_engine import compiled_dir

# First, before any module of the package loads: a build of exactly these sources, when there is
# one, goes first on the package's path, so its compiled modules load instead of their sources.
_compiled = compiled_dir()
if _compiled is not None:
    __path__.insert(0, _compiled)

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
