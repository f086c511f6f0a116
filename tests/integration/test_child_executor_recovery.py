"""The child executor recovers from a send_offsets_to_transaction that never returns, in
process, as the processor does (real broker): the stuck producer is left behind, a new one
(whose init_transactions aborts the stuck transaction at the coordinator) carries on from the
committed offsets, and every child command is committed exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from executor_support import ReceiptReader, produce

from processors.engine.ids import dispatch_id
from processors.executors import child_executor
from processors.executors.child_executor import ChildExecutor
from topology.admin import create_topology
from topology.catalog import TopicNames
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def ks(kafka_settings: KafkaSettings) -> Iterator[KafkaSettings]:
    create_topology(kafka_settings)
    yield kafka_settings


class _FirstSendOffsetsNeverReturns:
    def __init__(self, real: Any, release: threading.Event) -> None:
        self._real = real
        self._release = release

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._release.wait()  # "never": until the test is over


def _cancel(parent: str) -> dict[str, Any]:
    return {
        "type": "ChildRunCancel",
        "run_id": parent,
        "ts_ms": int(time.time() * 1000),
        "record_id": uuid.uuid4().hex,
        "node": "n",
        "lineage": "",
        "attempt": 1,
        "dispatch_id": dispatch_id(parent, "n", "", 1),
        "child_run_id": f"{parent}/n",
        "reason": "x",
    }


def test_a_stuck_send_offsets_is_left_behind_and_the_executor_goes_on(
    ks: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(child_executor, "CALL_TIMEOUT_S", 1.0)
    monkeypatch.setattr(child_executor, "ABANDON_AFTER_S", 1.0)
    names = TopicNames(ks.topic_prefix)
    release = threading.Event()
    executor = ChildExecutor(ks)
    executor.producer = _FirstSendOffsetsNeverReturns(executor.producer, release)  # type: ignore[assignment]
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(executor.run(install_signals=False)), daemon=True)
    commands = ReceiptReader(ks, kind="commands", topic=names.commands)
    parents = [f"parent-{i}" for i in range(6)]
    try:
        thread.start()
        produce(ks, names.child_activations, "child_activations", [_cancel(p) for p in parents[:3]])
        deadline = time.monotonic() + 30
        while executor.producers_replaced == 0 and time.monotonic() < deadline:
            assert thread.is_alive(), f"the executor exited ({result})"
            time.sleep(0.1)
        assert executor.producers_replaced == 1
        produce(ks, names.child_activations, "child_activations", [_cancel(p) for p in parents[3:]])
        seen = commands.poll_until(lambda r: {x["run_id"] for x in r} >= {f"{p}/n" for p in parents}, 40)
        time.sleep(1.0)
        seen = commands.poll_until(lambda r: False, 1)
        alive = thread.is_alive()
    finally:
        executor.request_stop()
        thread.join(15)
        release.set()
        commands.close()
    assert alive, f"the executor stopped: exit {result}"
    assert result == [0]
    counts = Counter(x["run_id"] for x in seen if x["type"] == "CancelRun")
    assert counts == {f"{p}/n": 1 for p in parents}, counts  # the stuck batch's commands once, not twice
