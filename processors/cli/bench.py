"""`runfold bench <name>`: one command per benchmark (benchmarks/*.py, the shared harness).

Every command writes benchmarks/results/<name>.json + .png (median of --rounds after
--warmup rounds, with min/max spread) and prints a table of medians. Against the broker in
KAFKA_BOOTSTRAP_SERVERS (else the local broker); each round uses its own topic prefix and
deletes its topics afterwards. Benchmarks are not tests: they measure, they never assert.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated

import orjson
import typer

from processors.cli.common import console

# The benchmarks live in the source checkout, beside the results they write; the installed
# package is the product alone (pyproject.toml packages processors, schemas and topology).
CHECKOUT = Path(__file__).resolve().parents[2]


def _benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py of the checkout this runfold was installed from (editable)."""
    if not (CHECKOUT / "benchmarks" / f"{name}.py").is_file():
        console.print(
            f"runfold bench runs from a source checkout: benchmarks/{name}.py is not under {CHECKOUT} "
            "(the benchmarks are not part of the installed package; clone the repository and "
            "`pip install -e .` there)",
            highlight=False,
        )
        raise typer.Exit(2)
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    return importlib.import_module(f"benchmarks.{name}")


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: results in benchmarks/results/ (JSON + PNG).")
Rounds = Annotated[int, typer.Option(help="Measured rounds (median and spread over these).")]
Warmup = Annotated[int, typer.Option(help="Warm-up rounds (reduced size, discarded).")]


@bench_app.callback()
def _check_settings() -> None:
    """The benchmarks build their settings from the environment as they go: a bad value there is
    refused here, one line per field (exit 2), before anything runs, not as a traceback mid-way."""
    if {"--help", "-h"} & set(sys.argv[1:]):  # click runs this before a subcommand's --help
        return
    from processors.runtime.settings import load_processor_settings

    load_processor_settings()


def _show(bench: object, metrics: list[str]) -> None:
    console.print(bench.table(metrics), highlight=False)  # type: ignore[attr-defined]
    ratios = bench.ratios  # type: ignore[attr-defined]
    if ratios:
        console.print(orjson.dumps(ratios, option=orjson.OPT_INDENT_2).decode(), highlight=False)


@bench_app.command("keyed-fold")
def keyed_fold(
    records: Annotated[int, typer.Option(help="Records in the input stream.")] = 200_000,
    keys: Annotated[int, typer.Option(help="Distinct keys.")] = 1000,
    peers: Annotated[
        str,
        typer.Option(
            help="Comma-separated: passthrough, runfold, quix, faust, runfold-batch2000, quix-commit50ms."
        ),
    ] = "passthrough,runfold,quix,faust,runfold-batch2000",
    faust_records: Annotated[
        int, typer.Option(help="Faust folds this prefix of the stream (it is slow).")
    ] = 20_000,
    rounds: Rounds = 3,
    warmup: Warmup = 1,
) -> None:
    """Keyed fold (count + sum per key), exactly-once: runfold's runtime vs Quix Streams vs Faust,
    with the raw transactional passthrough as the physical limit."""
    kf = _benchmark("keyed_fold")

    b = kf.run(
        records,
        keys,
        rounds=rounds,
        warmup=warmup,
        peers=tuple(p.strip() for p in peers.split(",")),
        peer_records={"faust": faust_records},
    )
    _show(b, ["records_per_s", "correct", "duplicates"])


@bench_app.command("workflow-throughput")
def workflow_throughput(
    runs: Annotated[int, typer.Option(help="Runs of the 3-step noop workflow per case.")] = 5000,
    processors: Annotated[str, typer.Option(help="Processor counts to measure, comma-separated.")] = "1,2",
    rounds: Rounds = 3,
    warmup: Warmup = 1,
) -> None:
    """Completed runs/s and run events/s: processor(s) + noop worker + load generator processes."""
    wt = _benchmark("workflow_throughput")

    b = wt.run(runs, tuple(int(x) for x in processors.split(",")), rounds=rounds, warmup=warmup)
    _show(b, ["runs_per_s", "events_per_s"])


@bench_app.command("latency")
def latency(
    seconds: Annotated[float, typer.Option(help="Seconds of load per case.")] = 10.0,
    max_runs_per_s: Annotated[
        float | None, typer.Option(help="Max load (default: last workflow-throughput).")
    ] = None,
    rounds: Rounds = 3,
    warmup: Warmup = 1,
) -> None:
    """p50/p95/p99 start -> terminal at 25/50/80% of max load; commit interval 10/50/200 ms."""
    lt = _benchmark("latency")

    b = lt.run(seconds, max_runs_per_s, rounds=rounds, warmup=warmup)
    _show(b, ["rate_runs_per_s", "p50_ms", "p95_ms", "p99_ms"])


@bench_app.command("fair-limit")
def fair_limit(
    runs: Annotated[int, typer.Option(help="Runs of the 3-step workflow folded per round.")] = 3000,
    partitions: Annotated[int, typer.Option(help="Partitions of every topic.")] = 2,
    rounds: Rounds = 3,
    warmup: Warmup = 1,
) -> None:
    """The 3-step fold vs a raw transactional consume -> produce writing the fold's records (same
    topics, counts and sizes per input, one snapshot per run per transaction), paired per round."""
    fl = _benchmark("fair_limit")

    b = fl.run(runs, partitions, rounds=rounds, warmup=warmup)
    _show(b, ["input_records_per_s", "output_records_per_s", "snapshots_per_input", "fold_vs_limit"])


@bench_app.command("txn-floor")
def txn_floor(
    rates: Annotated[str, typer.Option(help="Comma-separated runs/s, open loop.")] = "2.5,60,150",
    seconds: Annotated[float, typer.Option(help="Seconds of load per rate and system.")] = 12.0,
    rounds: Annotated[int, typer.Option(help="Rounds (runfold then the floor, per rate).")] = 2,
    partitions: Annotated[int, typer.Option(help="Partitions of every topic.")] = 2,
) -> None:
    """A 1-step run's start -> terminal latency, runfold beside a raw transactional loop doing its
    I/O (the floor Kafka's transactions set), same minutes: results/txn_floor.json."""
    tf = _benchmark("txn_floor")

    out = tf.run([float(r) for r in rates.split(",")], seconds, rounds, partitions)
    typer.echo(tf.table(out))


@bench_app.command("txn-cost")
def txn_cost(
    rates: Annotated[str, typer.Option(help="Comma-separated transactions/s.")] = "50,150,300",
    seconds: Annotated[float, typer.Option(help="Seconds per shape and rate.")] = 8.0,
    broker_pid: Annotated[
        int | None, typer.Option(help="The broker's pid (default: the local broker's, when it runs).")
    ] = None,
) -> None:
    """The broker's CPU per transaction of a raw transactional producer (no runfold): the
    cheapest transaction and a one-input processor transaction's shape: results/txn_cost.json."""
    tc = _benchmark("txn_cost")
    try:
        rate_list = tc.parse_rates(rates)
    except ValueError as e:
        console.print(f"--{e}", highlight=False)
        raise typer.Exit(2) from e
    try:
        out = tc.run(rate_list, seconds, pid=broker_pid)
    except ValueError as e:
        console.print(str(e), highlight=False)
        raise typer.Exit(2) from e
    typer.echo(tc.table(out))


@bench_app.command("peers")
def peers(
    quick: Annotated[
        bool, typer.Option("--quick", help="1 round, 4 s windows, 2 points per curve: a few minutes.")
    ] = False,
    rounds: Annotated[int | None, typer.Option(help="Rounds (default 3; --quick: 1).")] = None,
    systems: Annotated[
        str,
        typer.Option(
            "--systems", help="Comma-separated: runfold, runfold-fsync, temporal, dbos-sqlite, dbos-postgres."
        ),
    ] = "runfold,runfold-fsync,temporal,dbos-sqlite,dbos-postgres",
    port_base: Annotated[
        int, typer.Option(help="Its own brokers and servers listen on this port and the next 7.")
    ] = 19300,
) -> None:
    """runfold vs Temporal vs DBOS Transact on no-op workflows, each system started fresh in turn:
    3-step throughput over a concurrency curve, CPU per workflow over all its processes, 1-step
    latency at 25 % of its own max and at 2.5 runs/s, peak RSS/PSS, and what each guarantees.
    Installs the bench-peers extra, builds Temporal's dev server and a DBOS venv when missing."""
    pb = _benchmark("peers_bench")

    pb.ensure_peer_packages()
    result = pb.run(quick, rounds, tuple(s.strip() for s in systems.split(",")), port_base)
    typer.echo(pb.table(result))


@bench_app.command("replay")
def replay(
    runs: Annotated[int, typer.Option(help="3-step runs in the run-events topic (15 events each).")] = 4000,
    rounds: Rounds = 3,
    warmup: Warmup = 1,
) -> None:
    """Events/s folded by `runfold replay --rebuild` (and `--verify`)."""
    rb = _benchmark("replay_bench")

    b = rb.run(runs, rounds=rounds, warmup=warmup)
    _show(b, ["events", "events_per_s", "complete"])


@bench_app.command("restore")
def restore(
    live: Annotated[int, typer.Option(help="Runs left open (the live set, the same in every case).")] = 200,
    finished: Annotated[int, typer.Option(help="Finished, purged 3-step runs at multiplier 1.")] = 1000,
    multipliers: Annotated[str, typer.Option(help="Comma-separated history multipliers.")] = "1,8,64",
    log_cases: Annotated[
        str, typer.Option(help="Multipliers also restored from the whole log (restore_from_state false).")
    ] = "1,8",
    uncompacted_cases: Annotated[
        str, typer.Option(help="Multipliers whose run-state still holds each purged run's last snapshot.")
    ] = "",
    rounds: Rounds = 1,
) -> None:
    """Seconds until a fresh instance (empty state dir) is ready, by history size, same live set."""
    rb = _benchmark("restore_bench")

    b = rb.run(
        live,
        finished,
        tuple(int(x) for x in multipliers.split(",")),
        tuple(int(x) for x in log_cases.split(",") if x),
        rounds,
        tuple(int(x) for x in uncompacted_cases.split(",") if x),
    )
    _show(b, ["ready_s", "restore_s", "events", "state_records"])


@bench_app.command("memory")
def memory(
    runs: Annotated[int, typer.Option(help="Completed runs in the processor's store.")] = 100_000,
    timers: Annotated[int, typer.Option(help="Runs then left waiting on long sleep timers.")] = 10_000,
    rounds: Rounds = 1,
) -> None:
    """Processor RSS with N completed runs in its store, then with W runs waiting on timers."""
    mem = _benchmark("memory")

    b = mem.run(runs, timers, rounds=rounds)
    _show(b, ["rss_mib", "store_mib"])


@bench_app.command("all")
def all_benchmarks(
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke sizes: 1 round, no warm-up, small loads.")
    ] = False,
    rounds: Annotated[int | None, typer.Option(help="Override the rounds of every benchmark.")] = None,
    only: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated subset (keyed_fold, workflow_throughput, latency, replay_bench, memory)."
        ),
    ] = None,
) -> None:
    """Every benchmark in order; benchmarks/results/summary.json holds the headline table."""
    run_all = _benchmark("run_all")

    summary = run_all.run(quick, rounds, only.split(",") if only else None)
    console.print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode(), highlight=False)
