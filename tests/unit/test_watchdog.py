"""The loop watchdog: a stall is reported once, with the stuck thread's stack; a loop that
moves on re-arms it. The call thread: a call that does not return in time is left behind."""

from __future__ import annotations

import threading
import time

import pytest

from processors.kafka.watchdog import CALL_GRACE_S, CallAbandoned, CallThread, Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reports_a_stall_once_then_again_only_after_the_loop_moved_on() -> None:
    clock, reports = Clock(), []
    dog = Watchdog(30.0, lambda s, stack: reports.append(s), clock=clock)
    dog.beat()
    clock.now += 29.9
    assert not dog.check() and reports == []
    clock.now += 0.2
    assert dog.check() and [round(s, 3) for s in reports] == [30.1]
    clock.now += 60
    assert not dog.check() and len(reports) == 1  # the same stall: reported once
    dog.beat()
    clock.now += 31
    assert dog.check() and round(reports[-1], 3) == 31


def stuck_in_a_client_call(release: threading.Event, entered: threading.Event, dog: Watchdog) -> None:
    dog.start()  # watches this thread
    entered.set()
    release.wait(10)


def test_the_report_names_where_the_loop_thread_is_stuck() -> None:
    stacks: list[str] = []
    release, entered = threading.Event(), threading.Event()
    dog = Watchdog(0.05, lambda s, stack: stacks.append(stack), interval_s=0.01)
    loop = threading.Thread(target=stuck_in_a_client_call, args=(release, entered, dog))
    loop.start()
    try:
        assert entered.wait(5)
        deadline = threading.Event()
        while not stacks and not deadline.wait(0.01):
            pass
    finally:
        release.set()
        loop.join(5)
        dog.stop()
    assert len(stacks) == 1
    assert "stuck_in_a_client_call" in stacks[0] and "release.wait(10)" in stacks[0]


def test_a_call_past_its_timeout_is_a_stall_long_before_the_loop_limit() -> None:
    clock, reports = Clock(), []
    dog = Watchdog(180.0, lambda s, stack: reports.append(stack), clock=clock)
    dog.beat()
    with dog.call("send_offsets_to_transaction", 30.0):
        clock.now += 30.0 + CALL_GRACE_S - 0.1
        assert not dog.check()  # within its timeout and the grace
        clock.now += 0.2
        assert dog.check()
    assert reports[0].startswith("send_offsets_to_transaction did not return within its timeout\n")
    dog.beat()  # the loop moved on
    clock.now += 60
    assert not dog.check()  # no call in progress, and the loop limit is far off


def test_call_thread_returns_results_and_raises_the_calls_errors() -> None:
    calls = CallThread("test-calls")
    assert calls.run(lambda: 41 + 1, 5.0) == 42
    with pytest.raises(KeyError, match="missing"):
        calls.run(lambda: {}["missing"], 5.0)
    assert calls.run(threading.get_ident, 5.0) != threading.get_ident()  # on its helper thread
    calls.close()


def test_call_thread_runs_meanwhile_on_the_caller_while_the_call_runs_and_counts_it_in_the_wait() -> None:
    calls = CallThread("test-calls")
    started, release = threading.Event(), threading.Event()
    seen: list[tuple[int, bool]] = []

    def call() -> str:
        started.set()
        release.wait(5)
        return "done"

    def meanwhile() -> None:  # the call is running on its thread while this runs here
        seen.append((threading.get_ident(), started.wait(5)))
        release.set()

    assert calls.run(call, 5.0, meanwhile=meanwhile) == "done"
    assert seen == [(threading.get_ident(), True)]
    t0 = time.monotonic()
    with pytest.raises(CallAbandoned):  # 2 s spent in meanwhile leaves 0.2 s of the 2.2 s wait
        calls.run(lambda: time.sleep(5.0), 2.2, meanwhile=lambda: time.sleep(2.0))
    assert time.monotonic() - t0 < 3.5  # not 2 s + the whole 2.2 s
    calls.close()


def test_a_call_that_does_not_return_is_abandoned_and_the_next_gets_a_new_thread() -> None:
    calls = CallThread("test-calls")
    release = threading.Event()
    first = calls.run(threading.get_ident, 5.0)
    t0 = time.monotonic()
    with pytest.raises(CallAbandoned) as abandoned:
        calls.run(release.wait, 0.2)
    assert time.monotonic() - t0 < 2.0 and not abandoned.value.done.is_set()
    second = calls.run(threading.get_ident, 5.0)
    assert second != first  # the stuck thread is the abandoned call's
    release.set()  # the abandoned call returns: its thread ends
    assert abandoned.value.done.wait(5)
    deadline = time.monotonic() + 5
    while any(t.ident == first for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.ident == first for t in threading.enumerate())
    calls.close()


def test_health_answers_503_while_the_loop_is_stalled_and_200_once_it_moves_on() -> None:
    from types import SimpleNamespace

    import orjson

    from processors.runtime.query import QueryServer
    from schemas import Codec

    clock = Clock()
    dog = Watchdog(30.0, lambda s, stack: None, clock=clock)
    dog.beat()
    ready = threading.Event()
    ready.set()
    processor = SimpleNamespace(
        codec=Codec.default(),
        partitions=None,
        watchdog=dog,
        ready=ready,
        settings=SimpleNamespace(instance_id="p-1"),
    )
    server = QueryServer(processor, "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        status, body = server.answer("/health", {})
        assert status == 200 and orjson.loads(body)["stalled_s"] == 0
        clock.now += 31.0
        status, body = server.answer("/health", {})
        assert status == 503 and orjson.loads(body) == {
            "ready": True,
            "stalled_s": 31.0,
            "instance_id": "p-1",
            "owned": [],
            "restoring": [],
        }
        dog.beat()
        with dog.call("commit_transaction", 10.0):  # a call past its timeout is a stall too
            clock.now += 10.0 + CALL_GRACE_S
            assert server.answer("/health", {})[0] == 503
        assert server.answer("/health", {})[0] == 200 and dog.stalled_s() == 0.0
    finally:
        server.close()


def test_a_frozen_process_is_not_a_stalled_loop() -> None:
    """SIGSTOP (or a paused VM) freezes the watchdog too: when it wakes up that much late, the
    time lost is forgiven, for the loop and for the call it was in (the 3-node chaos suite's
    processor frozen 20 s inside send_offsets_to_transaction was reported stuck and exited 4)."""
    clock, reports = Clock(), []
    dog = Watchdog(30.0, lambda s, stack: reports.append(s), clock=clock, interval_s=1.0)
    dog.beat()
    with dog.call("send_offsets_to_transaction", 10.0):
        clock.now += 1.0
        assert not dog.tick()
        clock.now += 40.0  # frozen: the watchdog's next wake-up is 39 s late
        assert not dog.tick() and reports == []
        clock.now += 1.0
        assert not dog.tick()
        clock.now += 1.0
        for _ in range(int(10.0 + CALL_GRACE_S)):  # the call itself then overruns its deadline
            clock.now += 1.0
            dog.tick()
        assert reports, "a call stuck after the freeze is still a stall"


def test_a_loop_stuck_while_the_watchdog_runs_on_time_is_reported() -> None:
    clock, reports = Clock(), []
    dog = Watchdog(5.0, lambda s, stack: reports.append(s), clock=clock, interval_s=1.0)
    dog.beat()
    for _ in range(6):
        clock.now += 1.0
        dog.tick()
    assert reports and round(reports[0], 3) == 5.0  # at the first wake-up past the limit
