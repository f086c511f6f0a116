"""`runfold demo` end to end through the real entry point: every run succeeds, replay verify
finds no difference, and no process the demo started survives it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
RUNFOLD = Path(sys.executable).parent / "runfold"


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def test_demo_runs_everything_and_leaves_no_process(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    prefix = f"{topic_prefix}-demo"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    out = subprocess.run(
        [
            str(RUNFOLD),
            "demo",
            "--json",
            "--partitions",
            "2",
            "--topic-prefix",
            prefix,
            "--delete-topics",
            "--log-dir",
            str(tmp_path / "demo"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["verify"]["ok"] and result["verify"]["differences"] == []
    runs = {r["run_id"]: r for r in result["runs"]}
    roots = [r for r in runs.values() if not r["child"]]
    assert len(roots) == 18 and all(r["status"] == "succeeded" for r in runs.values())
    # what the demo is meant to show actually happened
    assert {f"research-{i}/write" for i in range(3)} <= set(runs)  # child workflows
    assert all(runs[f"flaky-{i}"]["retries"] >= 1 for i in range(4))  # retries of a flaky action
    assert all(runs[f"budget-{i}"]["budget_warnings"] == 1 for i in range(2))  # budget warnings
    assert all(runs[f"research-{i}"]["tokens"] > 0 for i in range(3))  # agent usage
    assert result["processes"] == {"processor": 0, "worker": 0, "child-executor": 0}
    assert _processes_mentioning(f"{prefix}-0") == []
