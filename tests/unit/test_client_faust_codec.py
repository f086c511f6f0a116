"""The Faust codec and record for run events (no broker)."""

from __future__ import annotations

import pytest
from faust.serializers import codecs

from processors.downstream.faust_codec import CODEC_NAME, RunEvent
from schemas import Codec, DecodeError

USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "cost_micros": 3}


def test_codec_round_trip_and_record_shape() -> None:
    raw = Codec.default().encode(
        "run_events",
        {
            "type": "RunSucceeded",
            "run_id": "r",
            "sequence": 4,
            "ts_ms": 9,
            "record_id": "x",
            "output": {"a": [1, 2]},
            "usage": USAGE,
        },
    )
    data = codecs.loads(CODEC_NAME, raw)
    assert data == {
        "type": "RunSucceeded",
        "run_id": "r",
        "sequence": 4,
        "ts_ms": 9,
        "record_id": "x",
        "data": {"output": {"a": [1, 2]}, "usage": USAGE},
    }
    ev = RunEvent.loads(raw, serializer=CODEC_NAME)
    assert (ev.type, ev.run_id, ev.sequence, ev.status) == ("RunSucceeded", "r", 4, "succeeded")
    assert codecs.dumps(CODEC_NAME, ev) == raw
    accepted = RunEvent("RunAccepted", "r", 1, 1, "y", {"definition_id": "d"})
    assert (accepted.status, accepted.definition_id) == ("queued", "d")
    assert RunEvent("StepStarted", "r", 2, 1, "z", {}).status is None


def test_codec_rejects_bytes_that_are_not_a_run_event() -> None:
    with pytest.raises(DecodeError):
        codecs.loads(CODEC_NAME, b"\xc3\x01garbage")
