"""The child-run executor's pure mappings: child ids, commands, ChildRunFinished receipts."""

from __future__ import annotations

import threading
import time

import pytest

from processors.engine.ids import child_run_id, dispatch_id
from processors.executors.child_executor import (
    cancel_command,
    expired,
    finished_receipt,
    parent_step_from_id,
    parent_step_from_ref,
    start_command,
)
from processors.kafka.transactions import RENEW_AGAIN_AFTER_S
from schemas import Codec


def test_parent_step_round_trips_the_child_id_format() -> None:
    for parent, node, lineage, attempt in [
        ("r-1", "write", "", 1),
        ("root/a[2]", "sub", "3", 2),
        ("x", "n", "0", 7),
    ]:
        child = child_run_id(parent, node, lineage, attempt)
        step = parent_step_from_id(child)
        assert step == {
            "run_id": parent,
            "node": node,
            "lineage": lineage,
            "attempt": attempt,
            "dispatch_id": dispatch_id(parent, node, lineage, attempt),
        }
    assert parent_step_from_id("plain-root-run") is None


def test_parent_ref_wins_and_attempt_comes_from_the_id() -> None:
    ref = {
        "parent_run_id": "p",
        "parent_node": "w",
        "parent_lineage": "",
        "parent_dispatch_id": "abc",
        "root_run_id": "p",
        "depth": 1,
    }
    assert parent_step_from_ref("p/w#2", ref) == {
        "run_id": "p",
        "node": "w",
        "lineage": "",
        "attempt": 2,
        "dispatch_id": "abc",
    }


def _activation() -> dict:
    parent = {
        "parent_run_id": "p",
        "parent_node": "w",
        "parent_lineage": "1",
        "parent_dispatch_id": dispatch_id("p", "w", "1", 1),
        "root_run_id": "p",
        "depth": 1,
    }
    return {
        "type": "ChildRunActivation",
        "run_id": "p",
        "ts_ms": 1,
        "record_id": "a",
        "node": "w",
        "lineage": "1",
        "attempt": 1,
        "dispatch_id": parent["parent_dispatch_id"],
        "child_run_id": "p/w[1]",
        "definition_id": "child",
        "revision": 2,
        "input": {"q": 1},
        "bundle": {"root": "child@2"},
        "parent": parent,
        "deadline_ms": None,
    }


def test_commands_encode_with_the_codec() -> None:
    codec = Codec.default()
    start = codec.decode("commands", codec.encode("commands", start_command(_activation(), 5)))
    assert (start["type"], start["run_id"], start["revision"], start["input"]) == (
        "StartRun",
        "p/w[1]",
        2,
        {"q": 1},
    )
    assert start["parent"]["parent_run_id"] == "p" and start["bundle"] == {"root": "child@2"}
    cancel = {
        "type": "ChildRunCancel",
        "run_id": "p",
        "node": "w",
        "lineage": "1",
        "attempt": 1,
        "dispatch_id": "d",
        "child_run_id": "p/w[1]",
        "reason": "parent cancelled",
    }
    cmd = codec.decode("commands", codec.encode("commands", cancel_command(cancel, 5)))
    assert (cmd["type"], cmd["run_id"], cmd["reason"]) == ("CancelRun", "p/w[1]", "parent cancelled")


def test_finished_receipts_per_outcome() -> None:
    codec = Codec.default()
    step = parent_step_from_id("p/w[1]")
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "cost_micros": 5}
    events = [
        (
            {"type": "RunSucceeded", "run_id": "p/w[1]", "sequence": 9, "output": {"ok": 1}, "usage": usage},
            "succeeded",
        ),
        (
            {
                "type": "RunFailed",
                "run_id": "p/w[1]",
                "sequence": 9,
                "usage": usage,
                "failure": {
                    "code": "ExecutionFailed",
                    "message": "m",
                    "retryable": False,
                    "node": "a",
                    "lineage": "",
                },
            },
            "failed",
        ),
        (
            {"type": "RunCancelled", "run_id": "p/w[1]", "sequence": 9, "reason": "stop", "usage": usage},
            "cancelled",
        ),
        (
            {
                "type": "RunRejected",
                "run_id": "p/w[1]",
                "sequence": 0,
                "code": "BudgetExceeded",
                "reason": "depth",
                "command_type": "StartRun",
            },
            "failed",
        ),
        (  # the parent cancelled a child that was never started: stopped without work
            {
                "type": "RunRejected",
                "run_id": "p/w[1]",
                "sequence": 0,
                "code": "NotFound",
                "reason": "run p/w[1] does not exist",
                "command_type": "CancelRun",
            },
            "cancelled",
        ),
    ]
    for event, status in events:
        receipt = codec.decode(
            "receipts", codec.encode("receipts", finished_receipt(step, "p/w[1]", event, 7))
        )
        assert (
            receipt["type"] == "ChildRunFinished" and receipt["run_id"] == "p" and receipt["status"] == status
        )
        assert (receipt["node"], receipt["lineage"], receipt["attempt"]) == ("w", "1", 1)
        assert receipt["dispatch_id"] == dispatch_id("p", "w", "1", 1) and receipt["child_run_id"] == "p/w[1]"
    assert finished_receipt(step, "p/w[1]", events[0][0], 7)["output"] == {"ok": 1}
    assert finished_receipt(step, "p/w[1]", events[3][0], 7)["failure"]["code"] == "BudgetExceeded"


def test_an_activation_is_expired_from_its_deadline_on() -> None:
    act = _activation()
    assert not expired(act, 10**13)  # no deadline: never
    act["deadline_ms"] = 5_000
    assert not expired(act, 4_999) and expired(act, 5_000) and expired(act, 9_000)


class _StuckProducer:
    """send_offsets_to_transaction never returns (librdkafka#5456 after a broker restart)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.committed = False
        self.initialised = False

    def init_transactions(self, timeout: float) -> None:
        self.initialised = True

    def begin_transaction(self) -> None:
        pass

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:  # nothing was produced
        return 0

    def send_offsets_to_transaction(self, positions: object, group: object, timeout: float) -> None:
        self.release.wait(30)

    def commit_transaction(self, timeout: float) -> None:
        self.committed = True


def test_a_transaction_call_that_never_returns_is_left_behind_and_the_executor_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the processor does: the stuck producer is left alone, a new one takes over (its
    init_transactions aborts the stuck transaction), the input is rewound; only past
    MAX_STUCK_CALLS calls still stuck does the executor stop (exit 4), never for one."""
    from processors.executors import child_executor
    from processors.executors.child_executor import MAX_STUCK_CALLS, ChildExecutor, Stuck
    from topology.settings import KafkaSettings

    monkeypatch.setattr(child_executor, "CALL_TIMEOUT_S", 0.1)
    monkeypatch.setattr(child_executor, "ABANDON_AFTER_S", 0.2)
    executor = ChildExecutor(KafkaSettings(bootstrap_servers="127.0.0.1:9"), topic_prefix="t")
    made: list[_StuckProducer] = []

    def new_producer() -> _StuckProducer:
        made.append(_StuckProducer())
        return made[-1]

    rewinds: list[int] = []
    monkeypatch.setattr(executor, "_new_producer", new_producer)
    monkeypatch.setattr(executor, "_rewind", lambda: rewinds.append(1))
    first = executor.producer = new_producer()  # type: ignore[assignment]
    started = time.monotonic()
    executor._transact([])  # returns: recovered in-process
    assert time.monotonic() - started < 5 and not first.committed  # given up on, never committed
    assert executor.producer is made[1] and made[1].initialised  # a new producer, initialised
    assert executor.producers_replaced == 1 and rewinds == [1] and executor.counts["aborts"] == 1
    for _ in range(MAX_STUCK_CALLS - 1):
        executor._transact([])
    with pytest.raises(Stuck, match="never returned"):
        executor._transact([])
    first.release.set()  # a call that returns since lets its producer go: not counted any more
    for p in made:
        p.release.set()
    executor.consumer.close()


def test_a_producer_that_failed_fatally_while_idle_stops_the_executor_before_begin_transaction() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from processors.executors.child_executor import ChildExecutor
    from topology.settings import KafkaSettings

    executor = ChildExecutor(KafkaSettings(bootstrap_servers="127.0.0.1:9"), topic_prefix="t")
    calls: list[str] = []

    class _FailedWhileIdle:  # librdkafka serves the fatal error callback on the next poll
        def poll(self, timeout: float) -> int:
            calls.append("poll")
            executor._on_producer_error(KafkaError(KafkaError._FENCED, "fenced while idle", fatal=True))
            return 0

        def begin_transaction(self) -> None:  # would block for good (librdkafka#4420)
            calls.append("begin_transaction")

    executor.producer = _FailedWhileIdle()  # type: ignore[assignment]
    with pytest.raises(KafkaException) as stopped:
        executor._transact([])
    assert stopped.value.args[0].fatal() and stopped.value.args[0].code() == KafkaError._FENCED
    assert calls == ["poll"]  # never began a transaction
    executor.consumer.close()


def test_a_revoked_run_events_partition_takes_its_known_parents_with_it() -> None:
    from confluent_kafka import TopicPartition

    from processors.executors.child_executor import ChildExecutor
    from topology.settings import KafkaSettings

    executor = ChildExecutor(KafkaSettings(bootstrap_servers="127.0.0.1:9"), topic_prefix="t")
    step = {"run_id": "p", "node": "n", "lineage": "", "attempt": 1, "dispatch_id": "d"}
    executor._own(executor.consumer, [TopicPartition("t.run-events", 0), TopicPartition("t.run-events", 1)])
    executor.parents = {0: {"p/n": step, "q/n": step}, 1: {"r/n": step}}
    assert executor.known_parents() == 3 and set(executor.parents) == {0, 1}
    # a child-activations partition of the same number is not the run-events one
    executor._forget_parents(executor.consumer, [TopicPartition("t.child-activations", 1)])
    assert executor.known_parents() == 3
    executor._forget_parents(
        executor.consumer, [TopicPartition("t.run-events", 0), TopicPartition("t.run-events", 5)]
    )
    assert executor.parents == {1: {"r/n": step}} and executor.known_parents() == 1
    assert set(executor.parents) == {1}  # a record of partition 0 fetched before the revoke adds no entry
    executor.consumer.close()


def test_a_metrics_port_taken_is_a_configuration_exit_2_not_a_crash_to_restart() -> None:
    import socket

    from processors.executors.child_executor import ChildExecutor
    from processors.kafka.exits import ExitCode
    from topology.settings import KafkaSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        executor = ChildExecutor(
            KafkaSettings(bootstrap_servers="127.0.0.1:9"),
            topic_prefix="t",
            metrics_port=taken.getsockname()[1],
            metrics_host="127.0.0.1",
        )
        assert executor.run(install_signals=False) == ExitCode.CONFIG == 2


class _QuietProducer:
    """A transactional producer whose every call goes through (the fakes below fail one)."""

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, *args: object) -> None:
        pass


def test_a_fatal_error_that_is_not_a_fence_replaces_the_producer_once_between_commits() -> None:
    # Seen in the 3-node chaos scenario: the transaction coordinator killed, its successor
    # aborted the transaction, and commit failed INVALID_TXN_STATE (fatal). The executor stopped
    # (exit 1); the processor, with the same error, replaces its producer and goes on.
    from confluent_kafka import KafkaError, KafkaException

    from processors.executors.child_executor import ChildExecutor
    from topology.settings import KafkaSettings

    executor = ChildExecutor(KafkaSettings(bootstrap_servers="127.0.0.1:9"), topic_prefix="t")
    invalid = KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)

    class _Dying(_QuietProducer):  # everything goes through until the commit
        def commit_transaction(self, timeout: float = 0) -> None:
            raise KafkaException(invalid)

    class _Fresh(_Dying):
        initialised = False

        def init_transactions(self, timeout: float) -> None:
            self.initialised = True

    made: list[_Fresh] = []
    rewinds: list[int] = []
    executor._new_producer = lambda: made.append(_Fresh()) or made[-1]  # type: ignore[method-assign]
    executor._rewind = lambda: rewinds.append(1)  # type: ignore[method-assign]
    executor.producer = _Dying()  # type: ignore[assignment]
    executor._transact([])  # replaced, input rewound, not stopped
    assert len(made) == 1 and made[0].initialised and executor.producer is made[0]
    assert executor.producers_replaced == 1 and rewinds == [1]
    with pytest.raises(KafkaException) as stopped:  # again soon with no commit between: stop
        executor._transact([])
    assert stopped.value.args[0].code() == KafkaError.INVALID_TXN_STATE
    # a fault RENEW_AGAIN_AFTER_S later is a new one (an idle executor commits nothing between)
    assert executor._renewals.renewed_at is not None
    executor._renewals.renewed_at -= RENEW_AGAIN_AFTER_S + 1
    executor.producer = _Dying()  # type: ignore[assignment]
    executor._transact([])
    assert len(made) == 2 and executor.producer is made[1] and rewinds == [1, 1]
    executor.consumer.close()


def test_an_abort_that_fails_fatally_or_times_out_replaces_the_producer_instead_of_stopping() -> None:
    # CI's 3-node scenario (2026-12-05): send_offsets failed _TRANSPORT (the coordinator's broker
    # killed), and the abort that followed failed INVALID_TXN_STATE (fatal): the executor exited
    # 1, where the processor replaces its producer. A _CONFLICT (a commit that may still land)
    # still stops it: replaying would emit twice.
    from confluent_kafka import KafkaError, KafkaException

    from processors.executors.child_executor import ChildExecutor
    from topology.settings import KafkaSettings

    executor = ChildExecutor(KafkaSettings(bootstrap_servers="127.0.0.1:9"), topic_prefix="t")
    transport = KafkaError(KafkaError._TRANSPORT, "Failed to add offsets to transaction", retriable=True)

    def failing_abort(abort_error: KafkaError) -> object:
        class _Aborts(_QuietProducer):
            def send_offsets_to_transaction(self, *args: object) -> None:
                raise KafkaException(transport)

            def abort_transaction(self, timeout: float) -> None:
                raise KafkaException(abort_error)

        return _Aborts()

    class _Fresh:
        def init_transactions(self, timeout: float) -> None:
            pass

    made: list[_Fresh] = []
    rewinds: list[int] = []
    executor._new_producer = lambda: made.append(_Fresh()) or made[-1]  # type: ignore[method-assign]
    executor._rewind = lambda: rewinds.append(1)  # type: ignore[method-assign]
    executor.producer = failing_abort(  # type: ignore[assignment]
        KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
    )
    executor._transact([])  # replaced, rewound, not stopped
    assert len(made) == 1 and executor.producer is made[0] and rewinds == [1]
    executor.producer = failing_abort(  # type: ignore[assignment]
        KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True)
    )
    executor._transact([])  # a timed-out abort: a new producer aborts it at the coordinator
    assert len(made) == 2 and rewinds == [1, 1]
    executor.producer = failing_abort(  # type: ignore[assignment]
        KafkaError(KafkaError._CONFLICT, "Conflicting commit_transaction API call is already in progress")
    )
    with pytest.raises(KafkaException):
        executor._transact([])
    assert len(made) == 2 and rewinds == [1, 1]
    executor.consumer.close()
