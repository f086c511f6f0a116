"""DBOS Transact peer for `runfold bench peers`: workflows of 1 or 3 no-op steps.

DBOS is a library: the process that starts a workflow runs it, checkpointing the workflow and
each step's result in its system database (SQLite file or PostgreSQL). So this one process is
the driver, the worker and the client; the database server (PostgreSQL) is the only other.

    <peers venv>/bin/python benchmarks/peers/dbos_workflow.py --db sqlite:///path.sqlite
    <peers venv>/bin/python benchmarks/peers/dbos_workflow.py --db postgresql://...

Ops on stdin, answers on stdout (benchmarks/peers/_drive.py). Runs in a venv of its own:
dbos 3.4 needs croniter >= 6.2.4, faust-streaming (a runfold dependency) needs < 6.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent))
import _drive  # a sibling file: this venv has no runfold installed
from dbos import DBOS, DBOSConfig

F = TypeVar("F", bound=Callable[..., Any])
step: Callable[[F], F] = DBOS.step()
durable: Callable[[F], F] = DBOS.workflow()


@step
def noop() -> None:
    return None


@durable
def noop1() -> None:
    noop()


@durable
def noop3() -> None:
    noop()
    noop()
    noop()


def run_one(steps: int) -> None:
    (noop3 if steps == 3 else noop1)()


def handle(op: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any]
    if op["op"] == "throughput":
        out = _drive.throughput_threads(
            run_one, op["concurrency"], op["seconds"], op.get("warmup_s", 1.0), op.get("steps", 3)
        )
        return out
    if op["op"] == "latency":
        out = _drive.latency_threads(run_one, op["rate"], op["seconds"], op.get("steps", 1))
        return out
    raise ValueError(f"unknown op {op['op']!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="system database URL")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    config: DBOSConfig = {"name": "runfold-bench", "system_database_url": args.db}
    DBOS(config=config)
    DBOS.launch()
    try:
        _drive.serve(handle)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
