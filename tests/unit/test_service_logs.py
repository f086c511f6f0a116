"""The services' shared logging: the format choice, the human lines, librdkafka's repeats collapsed."""

from __future__ import annotations

import logging

import orjson
import pytest

from processors import service_logs
from processors.service_logs import HumanFormatter, KafkaLog, log_format

LINE = "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"


def test_format_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNFOLD_LOG_FORMAT", raising=False)
    assert log_format() == "json" and log_format("HUMAN") == "human"
    monkeypatch.setenv("RUNFOLD_LOG_FORMAT", "human")
    assert log_format() == "human" and log_format("json") == "json"
    monkeypatch.setenv("RUNFOLD_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="RUNFOLD_LOG_FORMAT must be one of json, human, got 'yaml'"):
        log_format()
    with pytest.raises(ValueError, match="--log-format must be one of"):
        log_format("xml")


def test_repeats_collapse_into_one_line_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    kafka = KafkaLog(window_s=60)
    with caplog.at_level(logging.DEBUG, "runfold.kafka"):
        for i in range(100):  # what varies between repeats: client, timing, librdkafka's own count
            suffix = f" (after {i}ms in state CONNECT" + (
                f", {i} identical error(s) suppressed)" if i % 2 else ")"
            )
            kafka.log(40, "%s [%s] %s", "FAIL", f"rdkafka#consumer-{i % 3}", LINE + suffix)
        kafka.log(30, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", "another line")
        kafka.flush()
        kafka.flush()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "kafka FAIL: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        "kafka REQTMOUT: another line",
        "kafka FAIL: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
        "(repeated 99 more times)",
    ]
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING, logging.ERROR]


def test_a_repeat_after_the_window_says_how_many_were_held(caplog: pytest.LogCaptureFixture) -> None:
    kafka = KafkaLog(window_s=0.0)
    with caplog.at_level(logging.DEBUG, "runfold.kafka"):
        kafka.log(40, "%s [%s] %s", "FAIL", "c", LINE)
        kafka.log(40, "%s [%s] %s", "FAIL", "c", LINE)
    assert len(caplog.records) == 2  # a zero window holds nothing back


def test_human_and_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    record = logging.LogRecord("runfold.worker", logging.INFO, __file__, 1, "serving %s", ("q",), None)
    record.group = "g"
    line = HumanFormatter().format(record)
    assert line.endswith(" INFO runfold.worker serving q group=g") and line[:4].isdigit()
    record.exc_text, record.exc_info = "Traceback ...\nValueError: x", None  # formatted by redaction
    assert service_logs._JsonLines().format(record).startswith("{")
    assert orjson.loads(service_logs._JsonLines().format(record))["exception"].endswith("ValueError: x")
