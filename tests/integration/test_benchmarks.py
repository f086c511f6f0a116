"""The benchmarks run, briefly, against the real broker. Benchmarks measure and never assert
figures: these tests check the commands start and the output's shape, never a number's size."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]
# the benchmarks run from the checkout, not from the installed package (as `runfold bench` does)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_fair_limit_replays_the_folds_shape(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("RUNFOLD_BENCH_RESULTS", str(tmp_path))
    from benchmarks import fair_limit

    bench = fair_limit.run(runs=200, rounds=1, warmup=0, metrics_port=_free_port())
    saved = orjson.loads((tmp_path / "fair_limit.json").read_bytes())
    assert saved["errors"] == {}
    fold, limit = saved["summary"]["fold"], saved["summary"]["limit"]
    # the limit writes what the fold wrote per input: same inputs, same events and activations
    assert limit["input_records"]["median"] == fold["input_records"]["median"] == 4 * 200
    for role in ("events_per_input", "activations_per_input"):
        assert limit[role]["median"] == pytest.approx(fold[role]["median"], abs=0.002)
    assert 0 < limit["snapshots_per_input"]["median"] <= 1.0
    assert bench.ratios["fold_vs_limit"]["value"] is not None


def test_the_transaction_floor_replays_a_one_step_runs_io(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("RUNFOLD_BENCH_RESULTS", str(tmp_path))
    from benchmarks import txn_floor

    out = txn_floor.run([10.0], seconds=2, rounds=1, metrics_port=_free_port())
    assert orjson.loads((tmp_path / "txn_floor.json").read_bytes())["summary"] == out["summary"]
    shape = out["shape"]
    # what the floor replays per run is what runfold wrote for its runs: 3 events per start
    # (RunAccepted, RunStarted, StepScheduled), 3 per receipt, a snapshot per transaction
    assert (shape["events_per_start"], shape["events_per_receipt"]) == (3, 3)
    assert shape["event_types"].keys() >= {"RunStarted", "StepScheduled", "StepSucceeded", "RunSucceeded"}
    case = out["cases"]["10.0"]
    for system in ("runfold", "floor"):
        (measured,) = case[system]
        assert measured["complete"] == measured["runs"] == 20, system
        assert 0 < measured["end_to_end"]["p50"] <= measured["end_to_end"]["p99"], system


def test_the_transaction_cost_commits_both_shapes_at_the_planned_rate(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("RUNFOLD_BENCH_RESULTS", str(tmp_path))
    from benchmarks import txn_cost

    out = txn_cost.run([20.0], seconds=1.5, pid=os.getpid())  # a pid we know: its CPU is read
    assert orjson.loads((tmp_path / "txn_cost.json").read_bytes()) == out
    assert [c["shape"] for c in out["cases"]] == ["one-partition", "processor"]
    for case in out["cases"]:
        # paced, not back to back: ~30 in 1.5 s, and every one committed (commit_transaction raises)
        assert 20 <= case["transactions"] <= 32
        assert case["transaction_ms"]["p50"] > 0
        assert case["broker_cpu_pct"] >= 0 and case["broker_cpu_ms_per_transaction"] >= 0
    with pytest.raises(ValueError, match="no such process"):
        txn_cost.run([20.0], seconds=0.1, pid=2**22 + 7)
    with pytest.raises(ValueError, match="positive"):
        txn_cost.parse_rates("0,abc")
