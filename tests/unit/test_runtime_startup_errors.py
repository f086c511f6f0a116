"""A processor that cannot start says why and what to do, without a traceback: no Kafka answering
(no broker here: the port is closed on purpose), an unusable state directory, invalid settings."""

from __future__ import annotations

import gc
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from processors.kafka.exits import ExitCode
from processors.runtime import loop
from processors.runtime.settings import ProcessorSettings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_cluster_that_does_not_answer_stops_the_processor_with_where_it_looked_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loop, "KAFKA_TIMEOUT_S", 2.0)
    bootstrap = f"127.0.0.1:{_closed_port()}"
    settings = ProcessorSettings(
        bootstrap_servers=bootstrap, topic_prefix="unreachable", state_dir=tmp_path, instance_id="u1"
    )
    processor = loop.Processor(settings)
    processor.log.propagate = True  # to caplog (runfold's JSON handler is not configured here)
    with caplog.at_level(logging.WARNING, logger="runfold"):
        assert processor.run() == ExitCode.CONFIG == 2  # configuration: the address, the cluster
    [stopped] = [r for r in caplog.records if r.getMessage() == "processor stopped"]
    reason = stopped.__dict__["reason"]
    assert reason.startswith(f"cannot reach the Kafka cluster at {bootstrap} (")
    assert "after 2 s" in reason and "runfold kafka up" in reason
    assert not [r for r in caplog.records if r.getMessage() == "processor crashed"]


def test_a_state_directory_that_cannot_be_made_stops_the_processor_before_it_connects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_text("")
    settings = ProcessorSettings(
        bootstrap_servers=f"127.0.0.1:{_closed_port()}",
        topic_prefix="sd",
        state_dir=tmp_path / "a-file" / "state",
        instance_id="s1",
    )
    processor = loop.Processor(settings)
    processor.log.propagate = True
    with caplog.at_level(logging.WARNING, logger="runfold"):
        assert processor.run() == ExitCode.CONFIG  # at once: the closed port is never tried
    [stopped] = [r for r in caplog.records if r.getMessage() == "processor stopped"]
    reason = stopped.__dict__["reason"]
    assert (
        reason.startswith(f"state directory {tmp_path / 'a-file' / 'state' / 'sd'}")
        and "Not a directory" in reason
    )
    assert "RUNFOLD_STATE_DIR" in reason


def test_invalid_settings_are_named_with_the_value_refused_and_exit_2() -> None:
    env = {**os.environ, "RUNFOLD_COMMIT_INTERVAL_MS": "-5"}
    for argv in (["-m", "processors.runtime"], ["-m", "processors.cli", "processor"]):
        done = subprocess.run(
            [sys.executable, *argv, "--batch-size", "0"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert (
            "invalid settings: batch_size: Input should be greater than or equal to 1 (got 0)" in done.stderr
        )
        assert "commit_interval_ms: Input should be greater than or equal to 1 (got '-5')" in done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    done = subprocess.run(
        [sys.executable, "-m", "processors.cli", "runs", "list"],
        env={**env, "RUNFOLD_PARTITIONS": "x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.startswith("runfold: invalid settings: partitions: "), (
        done.stderr
    )


def test_invalid_settings_never_show_a_secret_value(tmp_path: Path) -> None:
    config = tmp_path / "runfold.yaml"
    config.write_text('kafka:\n  client_overrides: "sasl.password=hunter2"\n  partitions: 0\n')
    broken = tmp_path / "broken.yaml"
    broken.write_text("kafka:\n  sasl.password: hunter2: x\n")
    runs = {
        "config file": ({"RUNFOLD_CONFIG": str(config)}, ["processor"]),
        "bad YAML": ({"RUNFOLD_CONFIG": str(broken)}, ["processor"]),
        "env not JSON": ({"RUNFOLD_CLIENT_OVERRIDES": "sasl.password=hunter2"}, ["runs", "list"]),
        "worker list not JSON": ({"RUNFOLD_WORKER_QUEUES": "hunter2"}, ["worker"]),
    }
    for what, (extra, argv) in runs.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
        done = subprocess.run(
            [sys.executable, "-m", "processors.cli", *argv],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and done.stderr.startswith("runfold: invalid settings: "), (
            what,
            done.stderr,
        )
        assert "hunter2" not in done.stderr and "Traceback" not in done.stderr, (what, done.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "processors.cli", "processor"],
        env={**env, "RUNFOLD_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "client_overrides: Input should be a valid dictionary (set by" in done.stderr
    assert "partitions: Input should be greater than or equal to 1 (got 0)" in done.stderr


def test_a_refused_value_is_shown_short_and_only_when_it_is_a_plain_scalar() -> None:
    from topology.settings import KAFKA_SOURCES, KafkaSettings, SettingsInvalid, build_settings

    with pytest.raises(SettingsInvalid) as caught:
        build_settings(
            KafkaSettings,
            KAFKA_SOURCES,
            partitions="x" * 500,
            topic_prefix=["a"],
            replication_factor="token=abc",
        )
    text = str(caught.value)
    assert (
        f"partitions: Input should be a valid integer, unable to parse string as an integer (got '{'x' * 79}…)"
        in text
    )
    assert "topic_prefix: Input should be a valid string (got a list)" in text
    assert "token=abc" not in text and text.endswith(f"({KAFKA_SOURCES})")


def test_a_port_in_use_is_named_with_the_endpoint_and_what_to_do() -> None:
    from types import SimpleNamespace

    from processors.metrics_endpoint import CannotServe
    from processors.runtime.metrics import ProcessorMetrics
    from processors.runtime.query import QueryServer
    from schemas import Codec

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(CannotServe) as metrics_error:
            ProcessorMetrics().serve(port, "127.0.0.1")
        with pytest.raises(CannotServe) as query_error:
            QueryServer(SimpleNamespace(codec=Codec.default()), "127.0.0.1", port)  # type: ignore[arg-type]
    assert str(metrics_error.value) == (
        f"cannot serve /metrics on 127.0.0.1:{port}: Address already in use "
        "(choose another metrics port; 0 picks a free one)"
    )
    assert str(query_error.value).startswith(
        f"cannot serve run queries on 127.0.0.1:{port}: Address already in use"
    )


def test_a_child_executor_where_no_cluster_answers_exits_2_saying_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from processors.executors import child_executor
    from topology.settings import KafkaSettings

    bootstrap = f"127.0.0.1:{_closed_port()}"
    executor = child_executor.ChildExecutor(
        KafkaSettings(bootstrap_servers=bootstrap, topic_prefix="gone"), connect_timeout_s=2.0
    )
    with caplog.at_level(logging.ERROR, logger="runfold"):
        assert executor.run(install_signals=False) == ExitCode.CONFIG == 2  # the processor's code for it
    # Its producer would go on trying the closed port through later tests: the error callback
    # (a bound method) ties it to the executor in a cycle the collector cannot see through.
    executor.producer = None  # type: ignore[assignment]
    del executor
    gc.collect()
    [stopped] = [r.getMessage() for r in caplog.records if "child executor stopped" in r.getMessage()]
    assert f"cannot reach the Kafka cluster at {bootstrap} (Failed to get metadata: " in stopped
    assert ", after 2 s): is it running" in stopped


def test_more_refusals_end_in_one_line_and_no_secret(tmp_path: Path) -> None:
    """Log levels, config files that are not UTF-8 or not a mapping of names, a URL with
    credentials, a validator's own message: each a line on stderr, exit 2, nothing secret."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"kafka:\n  topic_prefix: caf\xe9\n")
    worker_keys = tmp_path / "worker.yaml"
    worker_keys.write_text("1: x\n")
    worker_url = tmp_path / "worker-url.yaml"
    worker_url.write_text("http_allowed_hosts: [1]\nhttp_timeout_s: 'https://u:sk-live-123@h'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    cases = {
        "log level": (
            {"RUNFOLD_LOG_LEVEL": "loud"},
            ["processor"],
            "log_level: Value error, a log level is one of",
        ),
        "not UTF-8": ({"RUNFOLD_CONFIG": str(latin)}, ["processor"], "is not UTF-8 text (byte 26)"),
        "prefix": (
            {"RUNFOLD_TOPIC_PREFIX": "sasl.password=hunter2"},
            ["runs", "list"],
            "topic_prefix: Value error, a topic prefix may use letters",
        ),
        "worker keys": ({}, ["worker", "--config", str(worker_keys)], "must hold a mapping of setting names"),
        "worker url": (
            {},
            ["worker", "--config", str(worker_url)],
            "http_timeout_s: Input should be a valid number",
        ),
        "worker log level": ({}, ["worker", "--log-level", "loud"], "a log level is one of"),
        "bench": (
            {"RUNFOLD_PARTITIONS": "x"},
            ["bench", "latency", "--seconds", "1"],
            "partitions: Input should be a valid integer",
        ),
    }
    for what, (extra, argv, expected) in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "processors.cli", *argv],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (what, done.stderr)
        assert expected in done.stderr and "Traceback" not in done.stderr, (what, done.stderr)
        assert "hunter2" not in done.stderr and "sk-live" not in done.stderr, (what, done.stderr)
