"""A cancelled handler that does not stop within its grace time is reported stop_unconfirmed,
once, and only while it still runs (processors/executors/stop_watch.py)."""

from __future__ import annotations

import asyncio

from processors.executors import receipts, stop_watch
from processors.executors.inflight import Entry

ACT = {"run_id": "r", "node": "a", "lineage": "", "attempt": 1, "dispatch_id": "d1"}


async def _entries() -> tuple[Entry, Entry, asyncio.Event]:
    release = asyncio.Event()
    sync = Entry(dict(ACT), ("t", 0), [0], is_async=False)
    sync.task = asyncio.get_running_loop().create_task(release.wait())
    finished = Entry({**ACT, "dispatch_id": "d2"}, ("t", 0), [1], is_async=True)
    finished.task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    return sync, finished, release


def test_a_handler_past_its_grace_is_reported_once_and_a_finished_one_never() -> None:
    async def scenario() -> None:
        sync, finished, release = await _entries()
        assert stop_watch.unconfirmed([sync, finished], 10_000, 1000) == []  # nobody asked to stop
        stop_watch.requested(sync, 1_000)
        stop_watch.requested(sync, 1_500)  # the first cancel counts
        stop_watch.requested(finished, 1_000)
        assert stop_watch.unconfirmed([sync, finished], 1_999, 1000) == []
        assert stop_watch.unconfirmed([sync, finished], 2_000, 1000) == [sync]
        assert stop_watch.unconfirmed([sync, finished], 9_000, 1000) == []  # once
        receipt = stop_watch.unconfirmed_receipt(sync, "w1", 2_000)
        assert receipt["type"] == "ActivationCancelled" and receipt["confirmed"] is False
        assert receipt["reason"].startswith("stop_unconfirmed") and "1000 ms" in receipt["reason"]
        assert receipt["record_id"] != receipts.cancelled(ACT, "w1", "x")["record_id"]
        release.set()

    asyncio.run(scenario())


def test_an_async_handler_gets_a_grace_before_and_after_its_hard_cancel() -> None:
    async def scenario() -> None:
        sync, _finished, release = await _entries()
        sync.is_async = True
        stop_watch.requested(sync, 0)
        assert stop_watch.unconfirmed([sync], 1_999, 1000) == []
        assert stop_watch.unconfirmed([sync], 2_000, 1000) == [sync]
        release.set()

    asyncio.run(scenario())


def test_a_joined_or_never_started_handler_is_a_confirmed_stop() -> None:
    assert receipts.cancelled(ACT, "w1", "before start: x")["confirmed"] is True
