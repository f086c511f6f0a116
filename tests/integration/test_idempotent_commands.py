"""Idempotent commands (issue 44) against the real broker and processor: a client's retry of a
signal or a cancel after a timeout takes effect once and gets the original answer."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from processor_support import Reader, make_settings, running, setup_topology

from processors.client import AnswerTimeout, RunClient
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
WAIT = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples/definitions/await-approval.yaml").read_text()
)


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [WAIT])
    return s


def _waiting(client: RunClient, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while client.get(run_id).status != "waiting":
        assert time.monotonic() < deadline, "the run never waited"
        time.sleep(0.2)


def test_a_signal_sent_three_times_by_retrying_clients_is_received_once(settings: ProcessorSettings) -> None:
    """The done-when of issue 44: one SignalRun, sent 3 times with one key by three client calls
    (two of them timed out while no processor ran, from two different clients): one
    SignalReceived; the repeats are CommandDeduplicated naming it; the call that waited is
    answered with that SignalReceived. The first call gives no key: its record id is the key,
    which its AnswerTimeout names (docs/client.md, Guarantees)."""
    run_id = f"idem-{uuid.uuid4().hex[:8]}"
    approve = {"approved": True}
    with running(settings), RunClient(settings, timeout_s=10) as client:
        client.start("await-approval", {}, run_id=run_id)
        _waiting(client, run_id)
    # no processor now: each call's answer wait times out, as a client's does when one is slow
    with RunClient(settings, timeout_s=10) as first, pytest.raises(AnswerTimeout) as timed_out:
        first.signal(run_id, "approval", approve, answer_timeout=1.0)
    key = timed_out.value.record_id
    assert key == first.last_record_id
    with RunClient(settings, timeout_s=10) as second, pytest.raises(AnswerTimeout):
        second.signal(run_id, "approval", approve, answer_timeout=1.0, idempotency_key=key)
    with running(settings), RunClient(settings, timeout_s=10) as third:
        answer = third.signal(run_id, "approval", approve, answer_timeout=30, idempotency_key=key)
        assert answer is not None and answer.outcome == "accepted" and answer.event_type == "SignalReceived"
        outcome = third.wait(run_id, timeout=30)
        assert outcome.status == "succeeded" and outcome.output is True
        events = Reader(settings, [settings.topics.run_events], "run_events")
        events.wait_for(lambda evs: len([e for e in evs if e["sequence"] == 0]) >= 2, what="two repeats")
        time.sleep(0.5)  # nothing more may come: a second effect would show here
        events.drain()
        mine = events.of(run_id)
        events.close()
    received = [e for e in mine if e["type"] == "SignalReceived"]
    assert len(received) == 1 and received[0]["idempotency_key"] == key
    assert answer.sequence == received[0]["sequence"]  # the original answer, whichever call got it
    repeats = [e for e in mine if e["type"] == "CommandDeduplicated"]
    assert len(repeats) == 2
    for repeat in repeats:
        assert repeat["sequence"] == 0 and repeat["idempotency_key"] == key
        assert (repeat["answer_sequence"], repeat["answer_type"]) == (
            received[0]["sequence"],
            "SignalReceived",
        )
    sequenced = [e["sequence"] for e in mine if e["sequence"]]
    assert sorted(sequenced) == list(range(1, len(sequenced) + 1))


def test_a_cancel_retried_with_its_key_gets_the_original_answer(settings: ProcessorSettings) -> None:
    """Without a key of its own a retry is a new command (a cancelled run: "unchanged"); with the
    first call's key, `client.last_record_id` when none was given, it gets the first answer."""
    run_id = f"idem-c-{uuid.uuid4().hex[:8]}"
    with running(settings), RunClient(settings, timeout_s=10) as client:
        client.start("await-approval", {}, run_id=run_id)
        _waiting(client, run_id)
        first = client.cancel(run_id, "enough")
        assert first is not None and first.event_type == "RunCancelled"
        key = client.last_record_id
        assert key is not None
        again = client.cancel(run_id, "enough", idempotency_key=key)
        assert again is not None and (again.outcome, again.event_type, again.sequence) == (
            "accepted",
            "RunCancelled",
            first.sequence,
        )
        assert "a repeat of idempotency key" in again.detail
        fresh = client.cancel(run_id, "enough")  # another key: nothing to do, as before
        assert fresh is not None and fresh.outcome == "unchanged"
