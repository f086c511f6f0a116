"""A processor whose topology is incomplete or not co-partitioned stops before it joins its group
(exit 2, configuration), saying what is wrong and what to do; nothing is consumed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from processor_support import make_settings

from processors.kafka.exits import ExitCode
from processors.runtime.loop import Processor
from topology.admin import create_topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _stop_reason(processor: Processor, caplog: pytest.LogCaptureFixture) -> str:
    processor.log.propagate = True
    with caplog.at_level(logging.INFO, logger="runfold"):
        assert processor.run() == ExitCode.CONFIG
    [stopped] = [r for r in caplog.records if r.getMessage() == "processor stopped"]
    assert not [r for r in caplog.records if r.getMessage() in ("processor started", "partitions assigned")]
    return str(stopped.__dict__["reason"])


def test_missing_topics_are_named_with_the_command_that_creates_them(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    reason = _stop_reason(Processor(settings), caplog)
    assert reason.startswith(f"missing topics ['{topic_prefix}.commands', '{topic_prefix}.receipts', ")
    assert f"run `runfold topology create` with topic prefix {topic_prefix!r}" in reason


def test_input_topics_that_are_not_co_partitioned_stop_it(
    kafka_bootstrap: str,
    topic_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    kafka_settings: object,
) -> None:
    # kafka_settings is requested for its cleanup: it deletes the prefix's topics afterwards.
    settings = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(settings.topics.receipts, 3, 1)]).values():
        future.result(30)
    create_topology(settings)  # the rest, with 2 partitions; receipts is left as it is
    reason = _stop_reason(Processor(settings), caplog)
    assert reason.startswith("topics are not co-partitioned (partition counts {")
    assert f"'{settings.topics.receipts}': 3" in reason and f"'{settings.topics.commands}': 2" in reason
