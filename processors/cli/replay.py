"""`runfold replay --verify | --rebuild`: fold run-events from the beginning."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from processors.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    BootstrapOpt,
    JsonOpt,
    PrefixOpt,
    cli_errors,
    console,
    echo_json,
    fail,
    settings_for,
)
from processors.replay import RebuildError, VerifyReport, rebuild, verify


def _progress(as_json: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
        transient=True,
    )


def _print_verify(report: VerifyReport) -> None:
    verdict = "[green]OK[/]" if report.ok else f"[red]{len(report.differences)} difference(s)[/]"
    console.print(
        f"replay verify: {verdict} — {report.runs} runs, {report.runs_checked} checked against "
        f"snapshots, {report.events} events ({report.rejected} rejections) in {report.seconds:.2f}s "
        f"({report.events_per_s:,.0f} events/s)",
        highlight=False,
    )
    if report.undecodable:
        console.print(f"[yellow]{report.undecodable} undecodable record(s) skipped[/]")
    if report.expired:
        console.print(
            f"{report.expired} finished run(s) not verifiable: run-events retention deleted their beginning",
            highlight=False,
        )
    if report.differences:
        table = Table(
            "run id", "kind", "snapshot seq", "folded seq", "expected digest", "actual digest", "detail"
        )
        for d in report.differences:
            table.add_row(
                Text(d.run_id),
                d.kind,
                str(d.snapshot_sequence or ""),
                str(d.folded_sequence or ""),
                (d.expected_digest or "")[:16],
                (d.actual_digest or "")[:16],
                Text(d.detail),
            )
        console.print(table)


def replay(
    do_verify: Annotated[
        bool, typer.Option("--verify", help="Compare every run's folded state with its latest snapshot.")
    ] = False,
    do_rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Rebuild a processor's RocksDB stores from run-events.")
    ] = False,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="With --rebuild: the processor's state dir.")
    ] = None,
    group_id: Annotated[
        str | None,
        typer.Option(
            "--group-id", help="With --rebuild: the processor's group (default <prefix>-processor)."
        ),
    ] = None,
    partition: Annotated[
        list[int], typer.Option("--partition", help="With --rebuild: only these partitions; repeatable.")
    ] = [],  # noqa: B006
    replace: Annotated[
        bool, typer.Option("--replace", help="With --rebuild: delete existing stores first.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a verify may take.")] = 600.0,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Fold <prefix>.run-events from the beginning (committed events only).

    --verify folds every run with the engine and compares its state digest with the run's latest <prefix>.run-state snapshot; every difference is listed (run id, expected vs actual digest, sequences) and the exit code is 1 if there is any. Safe while the processor runs.

    --rebuild restores a processor's stores (disaster recovery) into --state-dir, in the layout the processor reads, so it starts from the rebuilt state. Stop that processor first.

    Examples: `runfold replay --verify` · `runfold replay --rebuild --state-dir .runfold/state --replace`
    """
    if do_verify == do_rebuild:
        raise fail(as_json, "choose exactly one of --verify or --rebuild", EXIT_USAGE)
    with cli_errors(as_json):
        if do_verify:
            settings = settings_for(topic_prefix, bootstrap)
            with _progress(as_json) as bar:
                snaps = bar.add_task("reading snapshots", total=None)
                events = bar.add_task("folding run events", total=None)
                report = verify(
                    settings,
                    timeout_s=timeout,
                    snapshot_progress=lambda n, t: bar.update(snaps, completed=n, total=t),
                    progress=lambda n, t: bar.update(events, completed=n, total=t),
                )
            if as_json:
                echo_json(report.to_dict())
            else:
                _print_verify(report)
            if not report.ok:
                raise typer.Exit(EXIT_FAILED)
            return
        if state_dir is None:
            raise fail(as_json, "--rebuild needs --state-dir", EXIT_USAGE)
        from processors.runtime.settings import load_processor_settings

        psettings = load_processor_settings(
            bootstrap_servers=bootstrap, topic_prefix=topic_prefix, state_dir=state_dir, group_id=group_id
        )
        try:
            with _progress(as_json) as bar:
                task = bar.add_task(f"rebuilding {psettings.store_root()}", total=None)
                result = rebuild(
                    psettings,
                    replace=replace,
                    partitions=list(partition) or None,
                    progress=lambda n, t: bar.update(task, completed=n, total=t),
                )
        except RebuildError as e:
            raise fail(as_json, str(e), EXIT_FAILED) from None
        if as_json:
            echo_json(result.to_dict())
        else:
            console.print(
                f"[green]rebuilt[/] {result.store_root}: {result.events} events in "
                f"{result.seconds:.2f}s ({result.events_per_s:,.0f} events/s)",
                highlight=False,
            )
            for p, st in sorted(result.partitions.items()):
                console.print(
                    f"  p{p}: {st['events']} events, {st['runs']} runs, "
                    f"applied offset {st['applied_offset']}",
                    highlight=False,
                )
            lost = result.runs_before_log_start
            if lost:
                some = ", ".join(sorted(lost)[:5]) + (", ..." if len(lost) > 5 else "")
                console.print(
                    Text(
                        f"{len(lost)} run(s) not rebuilt: the log no longer holds their RunAccepted "
                        f"(run-events retention): {some}",
                        style="yellow",
                    )
                )
