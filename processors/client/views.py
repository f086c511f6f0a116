"""What the client returns about a run: `RunView`, built from a snapshot, a query answer or
a terminal event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processors.engine.vocabulary import TERMINAL_EVENTS, TERMINAL_STATUSES


@dataclass(frozen=True)
class RunView:
    run_id: str
    status: str
    sequence: int
    definition_id: str | None = None
    revision: int | None = None
    output: Any = None
    failure: dict[str, Any] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    ts_ms: int | None = None
    state_digest: str | None = None
    state: dict[str, Any] | None = None  # the engine's run state (snapshot / query), if read
    source: str = "snapshot"  # snapshot | query | events

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def steps(self) -> dict[str, dict[str, Any]]:
        """Per-node-instance step records of the engine state (empty when not read)."""
        return dict((self.state or {}).get("steps") or {})

    def to_dict(self, with_state: bool = False) -> dict[str, Any]:
        out = {
            "run_id": self.run_id,
            "status": self.status,
            "sequence": self.sequence,
            "definition_id": self.definition_id,
            "revision": self.revision,
            "output": self.output,
            "failure": self.failure,
            "usage": self.usage,
            "ts_ms": self.ts_ms,
            "state_digest": self.state_digest,
            "source": self.source,
        }
        if with_state:
            out["state"] = self.state
        return out

    @classmethod
    def from_terminal_event(
        cls, ev: dict[str, Any], definition_id: str | None = None, revision: int | None = None
    ) -> RunView:
        return cls(
            run_id=ev["run_id"],
            status=TERMINAL_EVENTS[ev["type"]],
            sequence=ev["sequence"],
            definition_id=definition_id,
            revision=revision,
            output=ev.get("output"),
            failure=ev.get("failure"),
            usage=dict(ev.get("usage") or {}),
            ts_ms=ev["ts_ms"],
            source="events",
        )


def _usage(state: dict[str, Any]) -> dict[str, int]:
    ledger = state.get("usage") or {}
    return {k: int(ledger.get(k, 0)) for k in ("prompt_tokens", "completion_tokens", "cost_micros")}


def view_from_state(
    run_id: str,
    status: str,
    state: dict[str, Any],
    *,
    sequence: int | None = None,
    ts_ms: int | None = None,
    digest: str | None = None,
    source: str,
    with_state: bool = True,
) -> RunView:
    return RunView(
        run_id=run_id,
        status=status,
        sequence=int(sequence if sequence is not None else state.get("sequence", 0)),
        definition_id=state.get("definition_id"),
        revision=state.get("revision"),
        output=state.get("output"),
        failure=state.get("failure"),
        usage=_usage(state),
        ts_ms=ts_ms,
        state_digest=digest,
        state=state if with_state else None,
        source=source,
    )


def view_from_snapshot(snapshot: dict[str, Any], with_state: bool = True) -> RunView:
    state = snapshot.get("state") or {}
    view = view_from_state(
        snapshot["run_id"],
        snapshot["status"],
        state,
        sequence=snapshot["sequence"],
        ts_ms=snapshot["ts_ms"],
        digest=snapshot["state_digest"],
        source="snapshot",
        with_state=with_state,
    )
    if view.definition_id is None:
        view = RunView(
            **{**view.__dict__, "definition_id": snapshot["definition_id"], "revision": snapshot["revision"]}
        )
    return view


def view_from_query(run_id: str, body: dict[str, Any]) -> RunView:
    """The processor's `GET /runs/{id}` answer: a status plus the run state (shape of the
    snapshot when the endpoint mirrors it, else the bare state)."""
    inner = body.get("state")
    state: dict[str, Any] = inner if isinstance(inner, dict) else body
    status = body.get("status") or state.get("status") or "unknown"
    return view_from_state(
        run_id,
        status,
        state,
        sequence=body.get("sequence"),
        ts_ms=body.get("ts_ms"),
        digest=body.get("state_digest"),
        source="query",
    )
