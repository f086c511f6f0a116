"""benchmarks/fold_stages.py splits the fold's CPU per input into stages by replaying growing
prefixes of its work: each prefix must do the fold's own work, or the split would flatter a
stage. Benchmarks measure, never assert figures: this checks the work, not the time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_staged_replay_encodes_every_record_the_fold_produces() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/fold_stages.py", "--runs", "60", "--batch", "25", "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["input_records"] == 60 * 4  # a StartRun and three receipts a run
    # 3 events + 0.75 activations + 1 snapshot per input (batches of 25 split no run's inputs)
    assert result["records_out"] == {"snapshot": 60 * 19, "fold": 60 * 19}, result
    stages = ["decode", "engine", "encode", "snapshot", "fold"]
    assert list(result["us_per_input_cumulative"]) == stages
    assert list(result["us_per_input_by_stage"]) == stages
