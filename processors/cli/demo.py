"""`runfold demo`: the whole system end to end on this machine (see processors/demo/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from processors.cli.common import EXIT_FAILED, JsonOpt, cli_errors, console, echo_json, fail


def demo(
    topic_prefix: Annotated[
        str | None, typer.Option("--topic-prefix", help="Topic prefix (default: a fresh demo-xxxxxx).")
    ] = None,
    partitions: Annotated[int, typer.Option(help="Partitions per topic.")] = 4,
    keep_broker: Annotated[
        bool, typer.Option("--keep-broker", help="Leave a broker the demo started running.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds the whole demo may take.")] = 150.0,
    delete_topics: Annotated[
        bool, typer.Option("--delete-topics", help="Delete the demo's topics at the end.")
    ] = False,
    log_dir: Annotated[
        Path | None, typer.Option("--log-dir", help="Where process logs and state go (default: a temp dir).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run everything end to end: broker, topics, definitions, processor, worker, child executor, a batch of runs with live progress, the outcome table, replay verify, clean shutdown.

    The runs show an agent research workflow (map fan-out, a child workflow, an approval the demo signals), retries of a flaky action, a budget warning and plain runs. Every process the demo starts is stopped at the end, also on Ctrl-C; a local broker it started is stopped too unless --keep-broker. Exit code 1 if a run did not succeed or replay verify found a difference.

    Example: `runfold demo`
    """
    from processors.demo.run import DemoError, run_demo

    with cli_errors(as_json):
        try:
            result = run_demo(
                console,
                prefix=topic_prefix,
                partitions=partitions,
                keep_broker=keep_broker,
                timeout_s=timeout,
                quiet=as_json,
                log_dir=log_dir,
                delete_topics=delete_topics,
            )
        except DemoError as e:
            raise fail(as_json, f"demo failed: {e}", EXIT_FAILED) from None
    if as_json:
        echo_json(result.to_dict())
    else:
        verdict = "[green]demo OK[/]" if result.ok else "[red]demo FAILED[/]"
        console.print(
            f"{verdict} in {result.seconds:.1f}s — all processes stopped "
            f"({', '.join(f'{k}={v}' for k, v in result.stopped.items())}); "
            + (
                f"topics of prefix {result.prefix} deleted"
                if delete_topics
                else f"topics kept under prefix {result.prefix}"
            )
            + f"; logs in {result.log_dir}"
            + (f"; {result.broker}" if result.broker else ""),
            highlight=False,
        )
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)
