"""`runfold processor`: run one processor instance until SIGTERM/SIGINT.

Exit codes (`ExitCode`, processors/kafka/exits.py; docs/runtime.md "Exit codes"): 0 stopped by a
signal; 1 a fatal Kafka error, a store failure, a crash (restart: it restores from the log);
2 configuration (invalid settings, no cluster answering, missing or not co-partitioned topics, a
state directory or port it cannot use); 3 fenced (another processor started with the same
instance id); 4 the loop stalled for stall_timeout_ms (stuck in a Kafka client call; logged with
its stack).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from processors import native_engine, service_logs
from processors.kafka.exits import ExitCode
from processors.runtime import logs


def processor(
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers (else settings/env).")
    ] = None,
    topic_prefix: Annotated[str | None, typer.Option(help="Topic prefix (RUNFOLD_TOPIC_PREFIX).")] = None,
    instance_id: Annotated[
        str | None,
        typer.Option(help="Stable, unique id of this processor: names its transactional producer (fencing)."),
    ] = None,
    group_id: Annotated[str | None, typer.Option(help="Consumer group (default <prefix>-processor).")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Root of the RocksDB stores.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Max input records per transaction.")] = None,
    commit_interval_ms: Annotated[int | None, typer.Option(help="Max time a transaction stays open.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus /metrics port (0 = ephemeral).")
    ] = None,
    query_port: Annotated[int | None, typer.Option(help="Run query HTTP port (0 = ephemeral).")] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level (INFO, DEBUG, ...).")] = None,
    log_format: Annotated[
        str | None, typer.Option(help="json or human (default: RUNFOLD_LOG_FORMAT, else json).")
    ] = None,
    finished_retention_ms: Annotated[
        int | None,
        typer.Option(help="How long a finished run stays in the local store (0 = forever; default 7 days)."),
    ] = None,
) -> None:
    """Run the run processor: fold commands and receipts into run state, exactly once.

    Example: `runfold processor --instance-id p1 --state-dir .runfold/state --query-port 8080`
    """
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        logs.get_logger().info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    # First thing: a SIGTERM during start-up must also stop cleanly.
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    problem = native_engine.choice_problem()  # RUNFOLD_ENGINE=compiled with no build, or a typo
    if problem is not None:
        typer.echo(f"runfold processor: {problem}", err=True)
        raise typer.Exit(ExitCode.CONFIG)
    from processors.runtime.loop import Processor
    from processors.runtime.settings import load_processor_settings

    settings = load_processor_settings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=topic_prefix,
        instance_id=instance_id,
        group_id=group_id,
        state_dir=state_dir,
        batch_size=batch_size,
        commit_interval_ms=commit_interval_ms,
        metrics_port=metrics_port,
        query_port=query_port,
        log_level=log_level,
        finished_retention_ms=finished_retention_ms,
    )
    try:
        service_logs.configure(settings.log_level, log_format)  # one format for every service
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--log-format") from None
    tune_gc()
    processor = Processor(settings, stop=stop, exit_on_stall=True)
    code = processor.run()
    service_logs.kafka_log().flush()  # how many librdkafka repeats were held back
    if (
        processor.producers.stuck_calls()
    ):  # clients left inside calls that never returned: destroying them could hang
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def tune_gc() -> None:
    """The fold allocates many short-lived dicts; the default gen-0 threshold (700) runs a
    collection every few records and keeps promoting live run states into older generations
    that are then re-scanned (~9 % of the fold's CPU in benchmarks/fold_bench.py, ~3 % with
    these settings). Start-up objects (modules, schemas) are frozen out of every scan."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def main() -> None:
    from topology.settings import exit_on_settings_error

    exit_on_settings_error(lambda: typer.run(processor), "runfold processor")
