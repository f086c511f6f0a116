"""The local Maven-jar broker's lifecycle through the real CLI: up, up again, status, down, twice."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from topology import local_kafka

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial(
        "starts and stops brokers of its own: a JVM start beside loaded workers misses its timeout"
    ),
]


def _env(port: int, cport: int, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env |= {
        "RUNFOLD_BROKER": "local",
        "RUNFOLD_KAFKA_PORT": str(port),
        "RUNFOLD_KAFKA_CONTROLLER_PORT": str(cport),
        "RUNFOLD_KAFKA_DATA_DIR": str(data_dir),
    }
    return env


def runfold(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "processors.cli", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.stdout.strip(), f"no JSON from runfold {args}: {proc.stderr}"
    return proc.returncode, orjson.loads(proc.stdout.strip().splitlines()[-1])


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_up_status_down_twice_on_a_non_default_port(tmp_path: Path) -> None:
    port, cport = local_kafka.free_port_pair()
    env = _env(port, cport, tmp_path / "kafka")
    for round_ in (1, 2):
        rc, up = runfold(env, "kafka", "up")
        assert rc == 0, up
        assert up["bootstrap"] == f"127.0.0.1:{port}"
        assert up["already_running"] is False, f"round {round_}: a broker was left over"
        pid = up["pid"]

        rc, again = runfold(env, "kafka", "up")
        assert rc == 0 and again["already_running"] is True and again["pid"] == pid

        rc, status = runfold(env, "kafka", "status")
        assert rc == 0 and status["running"] is True and status["answers"] is True and status["pid"] == pid
        assert local_kafka.broker_answers(f"127.0.0.1:{port}")

        rc, down = runfold(env, "kafka", "down")
        assert rc == 0, down
        assert _pid_gone(pid), f"broker pid {pid} still alive after down"
        assert not local_kafka.broker_answers(f"127.0.0.1:{port}", timeout=1.0)

        rc, status = runfold(env, "kafka", "status")
        assert rc == 1 and status["running"] is False

    rc, down = runfold(env, "kafka", "down")  # nothing running: still fine
    assert rc == 0


def test_port_taken_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        cfg = local_kafka.LocalKafkaConfig.from_env(
            port=port, controller_port=local_kafka.free_port_pair()[0], data_dir=tmp_path / "kafka"
        )
        with pytest.raises(local_kafka.LocalKafkaError, match=f"port {port} .* is taken by another process"):
            local_kafka.up(cfg)
        assert not cfg.state_file.exists()


def test_missing_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither java nor mvn on PATH
    port, cport = local_kafka.free_port_pair()
    cfg = local_kafka.LocalKafkaConfig.from_env(
        port=port, controller_port=cport, data_dir=tmp_path / "k", cache_dir=tmp_path / "cache"
    )
    with pytest.raises(local_kafka.LocalKafkaError, match="`java` was not found"):
        local_kafka.up(cfg)
    with pytest.raises(local_kafka.LocalKafkaError, match="`mvn` was not found"):
        local_kafka.ensure_jars(cfg)


def test_down_stops_the_broker_runfold_started_when_kafka_bootstrap_servers_points_at_it(
    tmp_path: Path,
) -> None:
    """`kafka up` says `export KAFKA_BOOTSTRAP_SERVERS=...`; a `kafka down` in that shell used to
    leave the broker running and exit 0 ("external cluster left running")."""
    port, cport = local_kafka.free_port_pair()
    env = _env(port, cport, tmp_path / "kafka")
    rc, up = runfold(env, "kafka", "up")
    assert rc == 0, up
    exported = {k: v for k, v in env.items() if k != "RUNFOLD_BROKER"}
    try:
        # another cluster named: not ours, left alone
        rc, down = runfold({**exported, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}, "kafka", "down")
        assert rc == 0 and "left running" in down["message"] and not _pid_gone(up["pid"])
        rc, down = runfold({**exported, "KAFKA_BOOTSTRAP_SERVERS": up["bootstrap"]}, "kafka", "down")
        assert rc == 0, down
        assert _pid_gone(up["pid"]), f"broker pid {up['pid']} still alive after down: {down}"
        assert "stopped" in down["message"] and str(up["pid"]) in down["message"]
    finally:
        runfold(env, "kafka", "down")
