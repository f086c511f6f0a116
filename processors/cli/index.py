"""`runfold index run|status`, and the index-backed `runfold runs list` (`list_from_index`)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from processors.cli.common import (
    EXIT_USAGE,
    BootstrapOpt,
    JsonOpt,
    PrefixOpt,
    console,
    echo_json,
    err_console,
    fail,
    settings_for,
)
from processors.index.ingest import Indexer, IngestCannotStart
from processors.index.settings import INDEX_ENV, index_path, open_index, open_reader, parse_time
from processors.index.store import CursorError, IndexError_, RunFilter, describe
from processors.kafka.exits import ExitCode

index_app = typer.Typer(
    no_args_is_help=True,
    help="The searchable run index: run events materialized into SQLite (docs/index.md).",
)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Index: an SQLite file or a postgresql:// URL (default: {INDEX_ENV}, else .runfold/index.sqlite).",
    ),
]
ConnectTimeoutOpt = Annotated[
    int,
    typer.Option(
        min=100, help="How long the ingest waits at start for a cluster that does not answer, then exits 2."
    ),
]


@index_app.command("run")
def run(
    db: DbOpt = None,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Forget every row and re-read the topic from its beginning.")
    ] = False,
    once: Annotated[
        bool, typer.Option("--once", help="Stop once every partition is read to its end (else follow).")
    ] = False,
    events: Annotated[
        bool, typer.Option("--events/--no-events", help="Also keep each run's events (the UI shows them).")
    ] = True,
    batch_max: Annotated[int, typer.Option(min=1, help="Records per database transaction, at most.")] = 5_000,
    commit_interval_ms: Annotated[
        int, typer.Option(min=1, help="Write a partial batch after this many ms.")
    ] = 200,
    connect_timeout_ms: ConnectTimeoutOpt = 30_000,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Keep the index up to date with the committed run events (exactly once into the database).

    A long-running process: its exit codes are the services' (docs/runtime.md, "Exit codes"):
    0 stopped by SIGTERM/SIGINT (or --once at the end), 1 a broker or database error (restart it),
    2 it cannot start as configured (the index, no cluster answering, the topic missing).

    Example: `runfold index run --db .runfold/index.sqlite`
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_for(topic_prefix, bootstrap)
    path = index_path(db)
    try:
        index = open_index(path)
        if rebuild:
            index.reset()
        indexer = Indexer(
            settings,
            index,
            store_events=events,
            batch_max=batch_max,
            commit_interval_ms=commit_interval_ms,
            connect_timeout_s=connect_timeout_ms / 1000,
        )
    except IndexError_ as e:  # another prefix's index, a newer schema, a database that does not answer
        raise fail(as_json, str(e), ExitCode.CONFIG) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if not as_json:
        err_console.print(
            f"indexing {settings.topic_prefix}.run-events into {describe(path)}"
            + (" (to the end)" if once else " (following; Ctrl-C stops)"),
            highlight=False,
        )
    try:
        report = indexer.run(follow=not once, stop=stop)
    except IngestCannotStart as e:
        raise fail(as_json, f"index ingest cannot start: {e}", ExitCode.CONFIG) from None
    except Exception as e:  # a broker or database error: say which; a restart reloads from the database
        raise fail(as_json, f"index ingest stopped: {e}", ExitCode.FATAL) from None
    if as_json:
        echo_json({"ok": True, "db": describe(path), **report.to_dict()})
    else:
        d = report.to_dict()
        console.print(
            f"indexed {d['events']} events ({d['new_runs']} new runs, {d['rejected']} rejections) "
            f"in {d['seconds']} s: {d['events_per_s']} events/s",
            highlight=False,
        )


@index_app.command("status")
def status(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """What the index holds: its topic prefix, runs, events and consumed offsets."""
    path = index_path(db)
    try:
        stats = open_reader(path).stats()
    except IndexError_ as e:
        raise fail(as_json, str(e)) from None
    if as_json:
        echo_json({"ok": True, **stats})
        return
    for key, value in stats.items():
        console.print(f"{key}: {value}", highlight=False)


def list_from_index(
    path: str,
    *,
    status: list[str],
    definition: str | None,
    labels: dict[str, str],
    since: str | None,
    until: str | None,
    parent: str | None,
    failure_code: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """`runfold runs list` when an index is configured: one indexed query, no topic scan."""
    try:
        f = RunFilter(
            status=tuple(status),
            definition_id=definition,
            labels=tuple((k, v or None) for k, v in labels.items()),
            since_ms=parse_time(since) if since else None,
            until_ms=parse_time(until) if until else None,
            parent_run_id=parent,
            failure_code=failure_code,
        )
    except ValueError as e:
        raise fail(as_json, str(e), EXIT_USAGE) from None
    try:
        index = open_reader(path)
        page = index.search(f, limit=limit, cursor=cursor)
        counts = index.counts(f)
    except (IndexError_, CursorError, ValueError) as e:
        raise fail(as_json, str(e), EXIT_USAGE if isinstance(e, CursorError | ValueError) else 1) from None
    if as_json:
        for row in page.runs:
            echo_json(row)
        if page.next_cursor:
            echo_json({"next_cursor": page.next_cursor})
        return
    total = sum(counts.values())
    table = Table(
        title=f"runs ({len(page.runs)} shown of {total}: "
        + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
        + f") from the index {describe(path)}"
    )
    for col in ("run id", "definition", "status", "steps", "created", "updated", "labels"):
        table.add_column(col)
    for r in page.runs:
        table.add_row(
            Text(r["run_id"]),
            f"{r['definition_id']}@{r['revision']}",
            Text(r["status"]),
            str(r["instances"]),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_ms"] / 1000)),
            time.strftime("%H:%M:%S", time.localtime(r["updated_ms"] / 1000)),
            Text(", ".join(f"{k}={v}" for k, v in sorted(r["labels"].items()))),
        )
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}", highlight=False)
