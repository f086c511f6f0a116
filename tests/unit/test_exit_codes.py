"""One exit-code vocabulary for every long-running process (`ExitCode`, docs/runtime.md "Exit
codes"): the processor, a worker, the child executor, `runfold index run` and `runfold ui`. Each
test here pins a code that changed when the vocabulary was made one (no broker: the addresses
are closed ports), or a path newly split between 1 (restart) and 2 (configuration)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from processors.kafka.exits import ExitCode
from topology.settings import KafkaSettings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))},
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
    }


def _runfold(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processors.cli", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_vocabulary() -> None:
    assert [(c.name, int(c)) for c in ExitCode] == [
        ("OK", 0),
        ("FATAL", 1),
        ("CONFIG", 2),
        ("FENCED", 3),
        ("STUCK", 4),
    ]


# ---- the processor: 1 is a failure to restart from, 2 a configuration to fix ----------------------


def test_a_processor_that_crashes_exits_1_to_be_restarted(tmp_path: Path) -> None:
    from processors.runtime.loop import Processor
    from processors.runtime.settings import ProcessorSettings

    settings = ProcessorSettings(
        bootstrap_servers=f"127.0.0.1:{_closed_port()}",
        topic_prefix="t",
        instance_id="c1",
        state_dir=tmp_path,
    )
    processor = Processor(settings)

    def crash() -> None:
        raise RuntimeError("a bug")

    processor._start = crash  # type: ignore[method-assign]
    assert processor.run() == ExitCode.FATAL == 1  # was 2, the code of a configuration to fix
    assert processor.stopping.fatal is not None and processor.stopping.fatal.code == ExitCode.FATAL


def test_a_processor_whose_port_is_taken_exits_2_before_it_connects(tmp_path: Path) -> None:
    from processors.runtime.loop import Processor
    from processors.runtime.settings import ProcessorSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = ProcessorSettings(
            bootstrap_servers=f"127.0.0.1:{_closed_port()}",
            topic_prefix="t",
            instance_id="m1",
            state_dir=tmp_path,
            metrics_port=taken.getsockname()[1],
        )
        assert Processor(settings).run() == ExitCode.CONFIG


def test_an_assignment_that_does_not_co_locate_commands_and_receipts_is_configuration() -> None:
    from processors.runtime.loop import Processor
    from processors.runtime.settings import ProcessorSettings

    processor = Processor(ProcessorSettings(topic_prefix="t", instance_id="a1"))
    consumer = SimpleNamespace(assign=lambda _: None, pause=lambda _: None)
    membership = processor.membership
    membership.consumer = consumer  # type: ignore[assignment]
    membership.partitions = SimpleNamespace()  # type: ignore[assignment]  # never opened
    topics = processor.settings.topics
    membership._on_assign(
        consumer,  # type: ignore[arg-type]
        [TopicPartition(topics.commands, 0), TopicPartition(topics.receipts, 1)],
    )
    fatal = processor.stopping.fatal
    assert (
        fatal is not None and fatal.code == ExitCode.CONFIG and "partition.assignment.strategy" in str(fatal)
    )


# ---- the worker ------------------------------------------------------------------------------------


def test_a_worker_whose_metrics_port_is_taken_exits_2_not_1() -> None:
    from processors.executors import runner
    from processors.executors.sdk import Worker
    from processors.executors.settings import WorkerSettings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        worker = Worker(
            settings=WorkerSettings(metrics_port=taken.getsockname()[1], metrics_host="127.0.0.1")
        )
        worker_runner = runner.WorkerRunner(
            worker, KafkaSettings(bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic_prefix="t")
        )
        assert asyncio.run(worker_runner.run(install_signals=False)) == ExitCode.CONFIG == 2  # was 1


# ---- the index ingest, alone (`runfold index run`) or in the UI ----------------------------------


def _indexer(tmp_path: Path, **kw: Any) -> Any:
    from processors.index import Indexer, SQLiteIndex

    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic_prefix="ix")
    return Indexer(settings, SQLiteIndex(tmp_path / "index.sqlite"), **kw)


def test_an_ingest_where_no_cluster_answers_cannot_start_and_a_stop_ends_its_wait(tmp_path: Path) -> None:
    from processors.index.ingest import IngestCannotStart

    began = time.monotonic()
    with pytest.raises(IngestCannotStart, match=r"cannot reach the Kafka cluster at 127\.0\.0\.1:\d+ \("):
        _indexer(tmp_path, connect_timeout_s=1.0).run(stop=threading.Event())
    assert time.monotonic() - began < 10
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    began = time.monotonic()
    report = _indexer(tmp_path).run(stop=stop)  # waiting up to 30 s: the stop ends it
    assert time.monotonic() - began < 5 and report.events == 0


def test_the_ui_stops_with_its_ingest_and_the_ingest_s_code(tmp_path: Path) -> None:
    from processors.cli.ui import _ingest

    server = SimpleNamespace(should_exit=False)
    ended: list[tuple[ExitCode, str]] = []
    _ingest(_indexer(tmp_path, connect_timeout_s=0.5), threading.Event(), server, ended)  # type: ignore[arg-type]
    assert server.should_exit and ended[0][0] == ExitCode.CONFIG
    assert ended[0][1].startswith("index ingest cannot start: cannot reach the Kafka cluster")

    broken = _indexer(tmp_path)
    broken.run = lambda stop: (_ for _ in ()).throw(OSError("disk full"))
    server, ended = SimpleNamespace(should_exit=False), []
    _ingest(broken, threading.Event(), server, ended)  # type: ignore[arg-type]
    assert server.should_exit and ended == [
        (ExitCode.FATAL, "index ingest stopped: disk full; the UI stops too (restart it)")
    ]

    server, ended = SimpleNamespace(should_exit=False), []
    stopped = threading.Event()
    stopped.set()
    _ingest(_indexer(tmp_path), stopped, server, ended)  # type: ignore[arg-type]
    assert not server.should_exit and ended == []  # a stop on request: the UI's own


def test_index_run_exits_2_when_it_cannot_start_as_configured(tmp_path: Path) -> None:
    from processors.index import SQLiteIndex

    began = time.monotonic()
    done = _runfold("index", "run", "--db", str(tmp_path / "a.sqlite"), "--connect-timeout-ms", "1000")
    assert done.returncode == 2, done.stderr  # was 1 after 10 s, as for a crash
    assert "index ingest cannot start: cannot reach the Kafka cluster at 127.0.0.1:" in done.stderr
    assert time.monotonic() - began < 30
    other = SQLiteIndex(tmp_path / "b.sqlite")
    other.bind_prefix("another")
    other.close()
    done = _runfold("index", "run", "--db", str(tmp_path / "b.sqlite"))
    assert done.returncode == 2 and "indexes the topic prefix 'another'" in done.stderr, done.stderr  # was 1


def test_ui_exits_2_for_a_port_in_use_a_refused_address_or_no_cluster(tmp_path: Path) -> None:
    db = str(tmp_path / "ui.sqlite")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _runfold("ui", "--port", str(port), "--db", db)
    assert done.returncode == 2, done.stderr  # uvicorn exited 3 for it: "fenced" to a supervisor
    assert f"cannot serve the UI on 127.0.0.1:{port}: Address already in use (choose another --port" in (
        " ".join(done.stderr.split())
    )
    done = _runfold("ui", "--host", "0.0.0.0", "--port", "0", "--db", db)
    assert done.returncode == 2 and "without a token" in done.stderr, done.stderr  # was 1
    done = _runfold("ui", "--port", "0", "--db", db, "--connect-timeout-ms", "1000")
    assert done.returncode == 2, done.stderr  # was: served on with no ingest, the index never updated
    assert "index ingest cannot start: cannot reach the Kafka cluster" in done.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ui_stopped_on_request_exits_0(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "processors.cli", "ui", "--port", "0", "--db", str(tmp_path / "ui.sqlite")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()  # said once it listens; the ingest waits for the cluster
        assert "runfold UI on http://127.0.0.1:" in line, line
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err  # SIGTERM was -15: uvicorn raised it again after its shutdown
    assert "Traceback" not in err
