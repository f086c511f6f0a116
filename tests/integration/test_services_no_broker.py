"""Quiet, clear failures: a worker, the child executor and the processor started with no broker
exit non-zero within their connect timeout, with one clear line and a handful of lines in all
(librdkafka's repeated connection errors collapsed into one with a count), in one log format."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from processors.kafka.exits import ExitCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
RUNFOLD = Path(sys.executable).parent / "runfold"
HUMAN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+ ")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


def _run(args: list[str], port: int, tmp_path: Path, **env: str) -> tuple[int, float, list[str]]:
    full_env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    full_env.pop("RUNFOLD_BOOTSTRAP_SERVERS", None)
    full_env.pop("RUNFOLD_LOG_FORMAT", None)
    full_env.update(env)
    t0 = time.monotonic()
    out = subprocess.run(
        [str(RUNFOLD), *args], env=full_env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    return out.returncode, time.monotonic() - t0, out.stderr.splitlines()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["worker", "--queue", "default"], {"RUNFOLD_WORKER_CONNECT_TIMEOUT_MS": "3000"}),
        (["child-executor"], {"RUNFOLD_CHILD_EXECUTOR_CONNECT_TIMEOUT_MS": "3000"}),
    ],
    ids=["worker", "child-executor"],
)
def test_no_broker_exits_2_quickly_with_one_clear_line(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    port = _closed_port()
    code, took, lines = _run(args, port, tmp_path, **env)
    assert code == ExitCode.CONFIG, lines
    assert took < 15, took  # 3 s connect timeout plus start-up
    assert len(lines) < 10, "\n".join(lines)
    records = [orjson.loads(line) for line in lines]  # every line is one JSON object (the default)
    stopped = [r for r in records if r["level"] == "error" and "stopped" in r["event"]]
    assert len(stopped) == 1 and f"cannot reach the Kafka cluster at 127.0.0.1:{port}" in stopped[0]["event"]
    assert "runfold kafka up" in stopped[0]["event"]
    kafka = [r for r in records if r["logger"] == "runfold.kafka"]
    assert kafka and all("Connection refused" in r["event"] for r in kafka)
    assert any(re.search(r"repeated \d+ more times|\d+ more like it", r["event"]) for r in kafka), kafka


def test_human_format_by_flag_or_env_and_a_bad_one_is_a_usage_error(tmp_path: Path) -> None:
    port = _closed_port()
    timeout = {"RUNFOLD_WORKER_CONNECT_TIMEOUT_MS": "1000"}
    code, _, lines = _run(["worker", "--log-format", "human"], port, tmp_path, **timeout)
    assert code == ExitCode.CONFIG and lines and all(HUMAN.match(line) for line in lines), lines
    code, _, lines = _run(["worker"], port, tmp_path, RUNFOLD_LOG_FORMAT="human", **timeout)
    assert code == ExitCode.CONFIG and all(HUMAN.match(line) for line in lines), lines
    code, _, lines = _run(["worker", "--log-format", "xml"], port, tmp_path)
    assert code == ExitCode.CONFIG and any(
        "--log-format must be one of json, human" in line for line in lines
    ), lines


def test_processor_no_broker_same_message_few_lines(tmp_path: Path) -> None:
    port = _closed_port()
    code, took, lines = _run(["processor", "--state-dir", str(tmp_path / "state")], port, tmp_path)
    assert code == ExitCode.CONFIG, lines
    assert took < 60, took  # the processor's fixed 30 s pre-flight wait
    assert len(lines) < 10, "\n".join(lines)
    records = [orjson.loads(line) for line in lines]
    stopped = [r for r in records if r["event"] == "processor stopped"]
    assert len(stopped) == 1 and f"cannot reach the Kafka cluster at 127.0.0.1:{port}" in stopped[0]["reason"]
    assert any("repeated" in r["event"] for r in records if r["logger"] == "runfold.kafka"), lines
