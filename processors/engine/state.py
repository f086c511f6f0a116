"""The run state: plain JSON-able dicts, canonical bytes, digest and status.

A run state is a `dict[str, Any]` (see docs/semantics.md, "Run state", for every key).
It holds the pinned bundle JSON once; parsed definitions are cached by bundle hash in
`pinned.py`, never stored. `evolve` is the only writer; it copies what it changes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from processors.engine.pinned import canonical_bundle, pinned
from processors.engine.vocabulary import OPEN_STEP_STATUSES, Usage

RunState = dict[str, Any]


_DUMP_OPTIONS = orjson.OPT_SORT_KEYS


def dump_state(state: RunState) -> bytes:
    """Canonical bytes: orjson with sorted keys (the RocksDB value and the snapshot body). The
    pinned bundle's part is serialized once per pin (`canonical_bundle`): the same bytes."""
    bundle = canonical_bundle(state.get("bundle"), state.get("bundle_hash"))
    if bundle is not None:
        state = {**state, "bundle": bundle}
    return orjson.dumps(state, option=_DUMP_OPTIONS)


def load_state(data: bytes) -> RunState:
    """The state `dump_state` wrote. Its bundle becomes the pin's own object (`Pinned.json`,
    the same content by its hash), as in a state built live: one copy in memory for every
    run of a pin (a running 3-step run's state: ~10 KB of objects → ~5.6 KB), and
    `dump_state` serializes it once."""
    return state_from_json(orjson.loads(data))


def state_from_json(state: Any) -> RunState:
    """`load_state` of an already parsed JSON value (a RunStateSnapshot's `state` field)."""
    if not isinstance(state, dict) or "run_id" not in state:
        raise ValueError("not a run state: expected a JSON object with a run_id")
    bundle, bundle_hash = state.get("bundle"), state.get("bundle_hash")
    if type(bundle) is dict and type(bundle_hash) is str:
        state["bundle"] = pinned(bundle, bundle_hash).json
    return state


def state_digest(state: RunState) -> str:
    return hashlib.sha256(dump_state(state)).hexdigest()


def run_status(state: RunState) -> str:
    """queued|running|waiting|cancelling|paused|succeeded|failed|cancelled. `waiting` is derived: the
    run is running but every open step of its superstep is a wait node waiting for a signal."""
    status: str = state["status"]
    if status != "running" or not state["waits"]:
        return status
    superstep = state["superstep"]
    for step in state["steps"].values():
        if (
            step["superstep"] == superstep
            and step["status"] in OPEN_STEP_STATUSES
            and step["status"] != "waiting"
            and "loop" not in step  # an agent loop's step: its calls waiting for approval are the wait
        ):
            return "running"
    return "waiting"


def usage_of(state: RunState) -> Usage:
    """The run's `Usage` record (docs/messages.md) from its ledger."""
    ledger = state["usage"]
    return {
        "prompt_tokens": ledger["prompt_tokens"],
        "completion_tokens": ledger["completion_tokens"],
        "cost_micros": ledger["cost_micros"],
    }
