"""One exit-code vocabulary for every long-running process (`ExitCode`, docs/runtime.md "Exit
codes"): the processor, a worker, the child executor, `runfold index run` and `runfold ui`. Each
test here pins a code that changed when the vocabulary was made one (no broker: the addresses
are closed ports), or a path newly split between 1 (restart) and 2 (configuration)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
