"""A stop asked for while start-up still waits for a cluster that does not answer ends the
process at once and cleanly (exit 0), instead of after the 30 s call (the processor, the child
executor and the worker each waited it out, and the processor then said "cannot reach")."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.kafka.exits import StopRequested, until_stopped


def _failing(code: int, calls: list[float]) -> object:
    def call(timeout_s: float) -> None:
        calls.append(timeout_s)
        raise KafkaException(KafkaError(code))

    return call


def test_a_call_the_cluster_does_not_answer_yet_is_repeated_in_slices_until_its_timeout() -> None:
    calls: list[float] = []
    with pytest.raises(KafkaException) as e:
        until_stopped(_failing(KafkaError._TRANSPORT, calls), threading.Event(), 2.5)  # type: ignore[arg-type]
    assert e.value.args[0].code() == KafkaError._TRANSPORT
    assert 2 <= len(calls) <= 4 and max(calls) <= 1.0  # refused at once: not retried faster than a slice


def test_an_error_that_waiting_cannot_cure_is_raised_at_once() -> None:
    calls: list[float] = []
    with pytest.raises(KafkaException) as e:
        until_stopped(_failing(KafkaError.TOPIC_AUTHORIZATION_FAILED, calls), threading.Event(), 30)  # type: ignore[arg-type]
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED and len(calls) == 1


def test_a_stop_request_ends_the_wait_between_two_slices_and_a_result_is_returned() -> None:
    stop = threading.Event()
    calls: list[float] = []
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    with pytest.raises(StopRequested):
        until_stopped(_failing(KafkaError._TIMED_OUT, calls), stop, 30)  # type: ignore[arg-type]
    assert time.monotonic() - began < 2.0 and calls
    assert until_stopped(lambda t: ("answered", t), threading.Event(), 30) == ("answered", 1.0)


def test_at_the_deadline_the_error_that_says_why_wins_over_a_slice_timing_out() -> None:
    # a resumed init_transactions forgets why the previous attempt failed: its last slice says
    # only "timed out"; the error seen before it says what was wrong
    codes = iter([KafkaError._TRANSPORT] + [KafkaError._TIMED_OUT] * 100)
    calls: list[float] = []

    def call(timeout_s: float) -> None:
        calls.append(timeout_s)
        raise KafkaException(KafkaError(next(codes)))

    with pytest.raises(KafkaException) as e:
        until_stopped(call, threading.Event(), 1.5)
    assert e.value.args[0].code() == KafkaError._TRANSPORT
    assert min(calls) >= 0.05 and len(calls) <= 3


def test_a_worker_whose_receipts_topic_lookup_fails_unexpectedly_stops_with_that_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from processors.executors import runner
    from processors.executors.sdk import Worker
    from topology.settings import KafkaSettings

    def broken(*_: object) -> int:
        raise TypeError("a bug in the lookup")

    monkeypatch.setattr(runner, "topic_max_message_bytes", broken)
    monkeypatch.setattr(runner, "await_cluster", lambda *_: None)  # as if the cluster answered
    worker_runner = runner.WorkerRunner(
        Worker(), KafkaSettings(bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic_prefix="lookup")
    )
    with pytest.raises(TypeError, match="a bug in the lookup"):  # on the loop, as if called in place
        asyncio.run(worker_runner.run(install_signals=False))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigint_while_no_cluster_answers_stops_every_long_running_command_at_once(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))},
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
        "RUNFOLD_STATE_DIR": str(tmp_path),
    }
    commands = {  # command -> (the line that says its signal handlers are in place, the line it stops with)
        "processor": ('"processor starting"', '"stop requested while waiting for the cluster"'),
        "child-executor": ("child executor starting", "child executor stopped during start-up"),
        "worker": ("starting (cluster", "stop requested, draining"),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "processors.cli", name],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for name in commands
    }
    output: dict[str, list[str]] = {name: [] for name in commands}
    started = {name: threading.Event() for name in commands}

    def read(name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output[name].append(line)
            if commands[name][0] in line:
                started[name].set()

    readers = [threading.Thread(target=read, args=(name, proc), daemon=True) for name, proc in procs.items()]
    for reader in readers:
        reader.start()
    try:
        for name, proc in procs.items():
            assert started[name].wait(30), f"{name} never said it started: exit {proc.poll()}"
        time.sleep(1.5)  # well inside the first 30 s wait for the cluster
        began = time.monotonic()
        for proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            proc.wait(20)
        assert time.monotonic() - began < 15  # ~2 s here; the bug this guards against takes >= 28 s
        for reader in readers:
            reader.join(5)
        for name, proc in procs.items():
            rest = "".join(output[name])
            assert proc.returncode == 0, (name, rest[-2000:])
            assert commands[name][1] in rest and "cannot reach" not in rest and "Traceback" not in rest, (
                name,
                rest,
            )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
