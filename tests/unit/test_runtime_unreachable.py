"""A processor started where no Kafka answers stops with a message that says so (no broker here:
the port is closed on purpose)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from processors.runtime import loop
from processors.runtime.exits import EXIT_FATAL
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
