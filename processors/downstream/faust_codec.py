"""faust-streaming integration: a codec for runfold's Avro run events and a Record model.

    import faust
    from processors.downstream.faust_codec import RunEvent, run_events_topic

    app = faust.App("billing", broker="kafka://127.0.0.1:9092",
                    processing_guarantee="exactly_once")    # read_committed: see below
    events = run_events_topic(app, "runfold")                # <prefix>.run-events, RunEvent values

    @app.agent(events)
    async def bill(stream):
        async for ev in stream:                              # ev: RunEvent
            if ev.type == "RunSucceeded":
                ...ev.data["usage"]...

The codec is registered under the name "runfold_run_event" (importing this module
registers it). It decodes runfold's single-object Avro (schemas/) into the
`RunEvent` shape: the envelope fields (`type`, `run_id`, `sequence`, `ts_ms`,
`record_id`) plus `data`, the body's own fields. It encodes that shape back.

Use `processing_guarantee="exactly_once"`: Faust only reads `read_committed` in that
mode; otherwise it would also see events of aborted processor transactions.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.serializers import codecs

from schemas import Codec

CODEC_NAME = "runfold_run_event"
ENVELOPE = ("type", "run_id", "sequence", "ts_ms", "record_id")
TERMINAL = {"RunSucceeded": "succeeded", "RunFailed": "failed", "RunCancelled": "cancelled"}
# status a run has after an event of this type (events not listed leave it unchanged)
STATUS_AFTER = {
    "RunAccepted": "queued",
    "RunStarted": "running",
    "RunWaiting": "waiting",
    "SignalReceived": "running",
    "RunPaused": "paused",
    "RunResumed": "running",
    "RunCancelling": "cancelling",  # waits for its stopping attempts, then RunCancelled/RunFailed
    **TERMINAL,
}


class RunEventCodec(codecs.Codec):
    """bytes (runfold Avro single-object encoding) <-> the `RunEvent` dict shape."""

    def _loads(self, s: bytes) -> Any:
        flat = Codec.default().decode("run_events", s)
        out = {k: flat.pop(k) for k in ENVELOPE}
        out["data"] = flat
        return out

    def _dumps(self, s: Any) -> bytes:
        if isinstance(s, faust.Record):
            s = s.asdict()
        return Codec.default().encode("run_events", {**s.get("data", {}), **{k: s[k] for k in ENVELOPE}})


codecs.register(CODEC_NAME, RunEventCodec())


class RunEvent(faust.Record, serializer=CODEC_NAME):
    """One committed run event (docs/messages.md); body fields are in `data`."""

    type: str
    run_id: str
    sequence: int
    ts_ms: int
    record_id: str
    data: dict[str, Any]

    @property
    def status(self) -> str | None:
        """The run's status after this event, when the event changes it."""
        return STATUS_AFTER.get(self.type)

    @property
    def definition_id(self) -> str | None:
        return self.data.get("definition_id")


def run_events_topic(app: faust.App, topic_prefix: str) -> Any:
    """The `<prefix>.run-events` topic of `app` with raw string keys and RunEvent values."""
    return app.topic(
        f"{topic_prefix}.run-events",
        key_type=str,
        value_type=RunEvent,
        key_serializer="raw",
        value_serializer=CODEC_NAME,
    )
