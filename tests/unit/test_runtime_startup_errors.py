"""A processor that cannot start says why and what to do, without a traceback: no Kafka answering
(no broker here: the port is closed on purpose), an unusable state directory, invalid settings."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from processors.runtime import loop
from processors.runtime.exits import EXIT_FATAL
from processors.runtime.settings import ProcessorSettings
from topology.settings import settings_problems


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_cluster_that_does_not_answer_stops_the_processor_with_where_it_looked_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loop, "KAFKA_TIMEOUT_S", 2.0)
    bootstrap = f"127.0.0.1:{_closed_port()}"
    settings = ProcessorSettings(bootstrap_servers=bootstrap, topic_prefix="unreachable", state_dir=tmp_path,
                                 instance_id="u1")  # fmt: skip
    processor = loop.Processor(settings)
    processor.log.propagate = True  # to caplog (runfold's JSON handler is not configured here)
    with caplog.at_level(logging.WARNING, logger="runfold"):
        assert processor.run() == EXIT_FATAL
    [stopped] = [r for r in caplog.records if r.getMessage() == "processor stopped"]
    reason = stopped.__dict__["reason"]
    assert reason.startswith(f"cannot reach the Kafka cluster at {bootstrap} (")
    assert "after 2 s" in reason and "runfold kafka up" in reason
    assert not [r for r in caplog.records if r.getMessage() == "processor crashed"]


def test_a_state_directory_that_cannot_be_made_stops_the_processor_before_it_connects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_text("")
    settings = ProcessorSettings(bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic_prefix="sd",
                                 state_dir=tmp_path / "a-file" / "state", instance_id="s1")  # fmt: skip
    processor = loop.Processor(settings)
    processor.log.propagate = True
    with caplog.at_level(logging.WARNING, logger="runfold"):
        assert processor.run() == EXIT_FATAL  # at once: the closed port is never tried
    [stopped] = [r for r in caplog.records if r.getMessage() == "processor stopped"]
    reason = stopped.__dict__["reason"]
    assert reason.startswith(f"state directory {tmp_path / 'a-file' / 'state' / 'sd'}") and "Not a directory" in reason
    assert "RUNFOLD_STATE_DIR" in reason


def test_invalid_settings_are_named_with_the_value_refused_and_exit_2() -> None:
    env = {**os.environ, "RUNFOLD_COMMIT_INTERVAL_MS": "-5"}
    for argv in (["-m", "processors.runtime"], ["-m", "processors.cli", "processor"]):
        done = subprocess.run([sys.executable, *argv, "--batch-size", "0"], env=env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "invalid settings: batch_size: Input should be greater than or equal to 1 (got 0)" in done.stderr
        assert "commit_interval_ms: Input should be greater than or equal to 1 (got '-5')" in done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
    done = subprocess.run([sys.executable, "-m", "processors.cli", "runs", "list"], env={**env, "RUNFOLD_PARTITIONS": "x"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("runfold: invalid settings: partitions: "), done.stderr


def test_settings_problems_leave_secret_values_out() -> None:
    from pydantic import BaseModel, Field, ValidationError

    class Client(BaseModel):
        sasl_password: str = Field(min_length=8)
        port: int

    with pytest.raises(ValidationError) as caught:
        Client(sasl_password="hunter2", port="x")
    text = settings_problems(caught.value)
    assert "hunter2" not in text and text.startswith("sasl_password: String should have at least 8 characters;")
    assert "port: Input should be a valid integer, unable to parse string as an integer (got 'x')" in text


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
    assert str(metrics_error.value) == (f"cannot serve /metrics on 127.0.0.1:{port}: Address already in use "
                                        "(choose another metrics port; 0 picks a free one)")  # fmt: skip
    assert str(query_error.value).startswith(f"cannot serve run queries on 127.0.0.1:{port}: Address already in use")
