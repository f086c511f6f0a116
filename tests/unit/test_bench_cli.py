"""`runfold bench peers` is reachable from the CLI and documents its options (it starts brokers,
servers and databases of its own, so the suite runs only its --help; the benchmark itself is
run by hand: docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the benchmarks run from the checkout, not from the installed package (as `runfold bench` does)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import peers_bench  # noqa: E402


def test_bench_peers_help_lists_its_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "processors.cli", "bench", "peers", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    for option in ("--quick", "--rounds", "--systems", "--port-base"):
        assert option in out.stdout


def test_the_peer_sdks_it_installs_are_the_bench_peers_extra() -> None:
    reqs = peers_bench.peer_requirements()
    assert any(r.startswith("temporalio") for r in reqs)
    assert any(r.startswith("psutil") for r in reqs)


def test_a_skipped_peer_keeps_its_reason_in_the_summary() -> None:
    rounds = [{"temporal": {"skipped": "Temporal: `go` is not on PATH"}, "dbos-sqlite": {"error": "boom"}}]
    summary = peers_bench.summarise(rounds)
    assert summary["temporal"] == {"skipped": "Temporal: `go` is not on PATH"}
    assert summary["dbos-sqlite"] == {"error": "boom"}
    assert "skipped" in peers_bench.table({"summary": summary})
