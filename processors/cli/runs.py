"""`runfold runs start|cancel|signal|resume|get|list|watch|events`: runs through the client SDK."""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from processors.cli import index as index_cli
from processors.cli.common import (
    EXIT_FAILED,
    EXIT_REJECTED,
    EXIT_USAGE,
    AnswerTimeoutOpt,
    BootstrapOpt,
    JsonOpt,
    KeyOpt,
    NoWaitOpt,
    PrefixOpt,
    TimeoutOpt,
    cli_errors,
    console,
    dumps,
    echo_json,
    err_console,
    fail,
    make_client,
    parse_json_arg,
    parse_pairs,
)
from processors.client import RunClient, RunView
from processors.client.answers import CommandAnswer
from processors.client.consumers import scheduled_queues
from processors.client.errors import RunNotFound
from processors.client.progress import StepBoard
from processors.index import settings as index_settings  # index hook
from topology.consumers import unconsumed_queues

runs_app = typer.Typer(no_args_is_help=True, help="Start, control and inspect workflow runs.")

_STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "rejected": "red",
    "waiting": "cyan",
    "paused": "magenta",
    "running": "blue",
    "retry_wait": "magenta",
    "skipped": "dim",
}


def _styled(status: str) -> Text:
    return Text(status, style=_STATUS_STYLE.get(status, ""))


def _print_view(view: RunView, show_state: bool) -> None:
    console.print(
        f"[bold]{escape(view.run_id)}[/]  ",
        _styled(view.status),
        f"  {view.definition_id}@{view.revision}  seq {view.sequence}  [dim](from {view.source})[/]",
        highlight=False,
    )
    if view.output is not None:
        console.print(Text(f"output: {dumps(view.output)}"))
    if view.failure:
        console.print(
            Text.assemble(("failure: ", "red"), f"{view.failure.get('code')}: {view.failure.get('message')}")
        )
    if view.usage:
        console.print("usage: " + ", ".join(f"{k}={v}" for k, v in view.usage.items()), highlight=False)
    steps = view.steps()
    if steps:
        table = Table("step", "status", "attempt")
        for key in sorted(steps):
            step = steps[key]
            table.add_row(Text(key), _styled(str(step.get("status", "?"))), str(step.get("attempt", "")))
        console.print(table)
    if show_state and view.state is not None:
        console.print_json(dumps(view.state))


@runs_app.command("start")
def start(
    definition: Annotated[str, typer.Argument(help="Definition id (or id@revision).")],
    input: Annotated[
        str | None, typer.Option("--input", "-i", help="Run input as JSON, or @file.json.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Your run id (idempotent); default: generated.")
    ] = None,
    revision: Annotated[
        int | None, typer.Option("--revision", "-r", help="Revision (default: latest).")
    ] = None,
    label: Annotated[list[str], typer.Option("--label", "-l", help="key=value label; repeatable.")] = [],  # noqa: B006
    budget: Annotated[
        list[str], typer.Option("--budget", help="Lower a budget: max_steps=50; repeatable.")
    ] = [],  # noqa: B006
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the outcome; exit 1 unless it succeeded.")
    ] = False,
    timeout: TimeoutOpt = 120.0,
    no_wait: NoWaitOpt = False,
    answer_timeout: AnswerTimeoutOpt = None,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Start a run of a registered definition, wait for the processor's answer, print the run id.

    A rejected start (input failing the schema, a conflicting restart) prints its code and
    reason on stderr and exits 6; no answer within --answer-timeout exits 5.

    Example: `runfold runs start one-step --input '{"text": "hi"}' --wait`
    """
    def_id, sep, rev = definition.rpartition("@")
    if sep and rev.isdigit():
        definition, revision = def_id, int(rev)
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        payload = parse_json_arg(input, "--input")
        rid = client.start(
            definition,
            payload,
            run_id=run_id,
            revision=revision,
            labels=parse_pairs(label, "--label"),
            budgets=parse_pairs(budget, "--budget", as_int=True),
            answer_timeout=0 if no_wait else answer_timeout,
        )
        if not wait:
            _answered(as_json, client.last_answer, "StartRun", rid, client.last_record_id)
            return
        view = client.wait(rid, timeout=timeout)
    if as_json:
        echo_json({"ok": view.status == "succeeded", **view.to_dict()})
    else:
        _print_view(view, show_state=False)
    if view.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


_DONE = {
    "StartRun": "started",
    "CancelRun": "cancelled",
    "SignalRun": "signal taken by",
    "ResumeRun": "resumed",
}


def _answered(
    as_json: bool, answer: CommandAnswer | None, what: str, run_id: str, record_id: str | None
) -> None:
    """The processor's answer to a command (None: sent with --no-wait, not waited for)."""
    if as_json:
        sent = {
            "ok": True,
            "run_id": run_id,
            "command": what,
            "record_id": record_id,
            "answer": "sent",
            "event": None,
            "sequence": None,
            "detail": "",
        }
        echo_json(answer.to_dict() if answer else sent)
    elif answer is None:
        console.print(
            f"{what} sent to [bold]{escape(run_id)}[/] (not waiting for the answer)", highlight=False
        )
    elif answer.outcome == "unchanged":
        console.print(
            f"{what} to [bold]{escape(run_id)}[/]: nothing to do, {escape(answer.detail)}", highlight=False
        )
    else:
        console.print(
            f"{_DONE[what]} [bold]{escape(run_id)}[/] [dim]({answer.event_type}, seq {answer.sequence})[/]",
            highlight=False,
        )


@runs_app.command("cancel")
def cancel(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    reason: Annotated[str, typer.Option(help="Why (recorded in RunCancelled).")] = "",
    no_wait: NoWaitOpt = False,
    answer_timeout: AnswerTimeoutOpt = None,
    idempotency_key: KeyOpt = None,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Cancel a run (idempotent; cascades to in-flight steps and child runs) and wait for the answer.

    A finished run (Conflict) or an unknown one (NotFound) exits 6 with the reason.

    Example: `runfold runs cancel run-1 --reason "no longer needed"`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        answer = client.cancel(
            run_id, reason, answer_timeout=0 if no_wait else answer_timeout, idempotency_key=idempotency_key
        )
    _answered(as_json, answer, "CancelRun", run_id, client.last_record_id)


@runs_app.command("signal")
def signal(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    name: Annotated[str, typer.Argument(help="Signal name (the wait node's `signal`).")],
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="JSON payload, or @file.json.")
    ] = None,
    no_wait: NoWaitOpt = False,
    answer_timeout: AnswerTimeoutOpt = None,
    idempotency_key: KeyOpt = None,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Send a named signal to a run (e.g. a human approval) and wait for the answer.

    A finished or unknown run, or a signal no wait node takes, exits 6 with the reason.

    Example: `runfold runs signal run-1 approval --payload '{"approved": true}'`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        value = parse_json_arg(payload, "--payload")
        answer = client.signal(
            run_id,
            name,
            value,
            answer_timeout=0 if no_wait else answer_timeout,
            idempotency_key=idempotency_key,
        )
    _answered(as_json, answer, "SignalRun", run_id, client.last_record_id)


@runs_app.command("resume")
def resume(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    budget: Annotated[
        list[str], typer.Option("--budget", help="New limit: max_tokens=400000; repeatable.")
    ] = [],  # noqa: B006
    reason: Annotated[str, typer.Option(help="Why (recorded in RunResumed).")] = "",
    no_wait: NoWaitOpt = False,
    answer_timeout: AnswerTimeoutOpt = None,
    idempotency_key: KeyOpt = None,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Resume a failed, paused or budget-blocked run, optionally with new budgets, and wait for the answer.

    A run that is running or finished well (Conflict) exits 6 with the reason.

    Example: `runfold runs resume run-1 --budget max_cost_micros=9000000`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        budgets = parse_pairs(budget, "--budget", as_int=True) or None
        answer = client.resume(
            run_id,
            budgets,
            reason,
            answer_timeout=0 if no_wait else answer_timeout,
            idempotency_key=idempotency_key,
        )
    _answered(as_json, answer, "ResumeRun", run_id, client.last_record_id)


@runs_app.command("get")
def get(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    state: Annotated[bool, typer.Option("--state", help="Also print the full run state.")] = False,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Show a run: status, output or failure, usage, steps (from the owning processor or the run-state topic).

    Example: `runfold runs get run-1 --json`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        view = client.get(run_id)
        if as_json:
            echo_json(view.to_dict(with_state=state))
        else:
            _print_view(view, show_state=state)
        _warn_unconsumed(client, view)


def _warn_unconsumed(client: RunClient, view: RunView) -> None:
    """On stderr: the steps scheduled on a queue that no worker consumes (they wait until one does)."""
    waiting = scheduled_queues(view.steps())
    if not waiting:
        return
    try:
        idle = unconsumed_queues(client.settings, waiting)
    except Exception as e:  # a hint only: the answer above stands without it
        err_console.print(f"[yellow]warning:[/] could not check the queues' consumers: {escape(str(e))}")
        return
    for queue in idle:
        err_console.print(
            f"[yellow]warning:[/] {escape(', '.join(waiting[queue]))} scheduled on queue {escape(queue)!r}, "
            f"which no worker consumes ({escape(client.topics.activations(queue))} has no consumer group "
            f"member): start `runfold worker --queue {escape(queue)} --module ...`",
            highlight=False,
            soft_wrap=True,
        )


@runs_app.command("list")
def list_runs(
    status: Annotated[str | None, typer.Option(help="Only runs with this status.")] = None,
    definition: Annotated[str | None, typer.Option(help="Only runs of this definition id.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (most recent first).")] = 50,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
    # ---- index hook (processors/index): these filters need the run index
    label: Annotated[
        list[str], typer.Option("--label", "-l", help="key=value (or key=); repeatable. Index only.")
    ] = [],  # noqa: B006
    since: Annotated[
        str | None, typer.Option(help="Created at or after: ISO time, 15m/2h/7d ago, epoch ms. Index only.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Created before (as --since). Index only.")] = None,
    parent: Annotated[str | None, typer.Option(help="Only child runs of this run. Index only.")] = None,
    failure_code: Annotated[
        str | None, typer.Option(help="Only runs failed with this code. Index only.")
    ] = None,
    cursor: Annotated[
        str | None, typer.Option(help="The next page (printed by the previous one). Index only.")
    ] = None,
) -> None:
    """List runs, most recent first, with counts by status: from the run index when RUNFOLD_INDEX_DB
    names one (docs/index.md), else from the compacted run-state topic (a full scan).

    Example: `runfold runs list --status failed`
    """
    index = index_settings.configured_index()
    if index is not None:
        return index_cli.list_from_index(
            index,
            status=[status] if status else [],
            definition=definition,
            labels=parse_pairs(label, "--label"),
            since=since,
            until=until,
            parent=parent,
            failure_code=failure_code,
            limit=limit,
            cursor=cursor,
            as_json=as_json,
        )
    if label or since or until or parent or failure_code or cursor:
        raise fail(
            as_json,
            f"--label/--since/--until/--parent/--failure-code/--cursor search the run index: set {index_settings.INDEX_ENV} (docs/index.md)",
            EXIT_USAGE,
        )
    # ---- end of the index hook
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        views = client.runs()
    err_console.print(  # index hook: say it scanned (after the settings and the scan succeeded)
        f"(no run index: scanned the run-state topic; set {index_settings.INDEX_ENV} to use one)",
        highlight=False,
    )
    counts: dict[str, int] = {}
    for v in views:
        counts[v.status] = counts.get(v.status, 0) + 1
    views = [
        v
        for v in views
        if (status is None or v.status == status) and (definition is None or v.definition_id == definition)
    ]
    views.sort(key=lambda v: v.ts_ms or 0, reverse=True)
    if as_json:
        for v in views[:limit]:
            echo_json(v.to_dict())
        return
    shown = min(limit, len(views))
    matching = f", {len(views)} matching" if len(views) != sum(counts.values()) else ""
    table = Table(
        title=f"runs ({shown} shown of {sum(counts.values())}{matching}: "
        + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
        + ")"
    )
    for col in ("run id", "definition", "status", "seq", "updated"):
        table.add_column(col)
    for v in views[:limit]:
        when = time.strftime("%H:%M:%S", time.localtime((v.ts_ms or 0) / 1000))
        table.add_row(
            Text(v.run_id), f"{v.definition_id}@{v.revision}", _styled(v.status), str(v.sequence), when
        )
    console.print(table)


def _board_table(board: StepBoard) -> Group:
    head = Text.assemble(
        (board.run_id, "bold"),
        "  ",
        _styled(board.status),
        f"  {board.definition}  seq {board.sequence}  superstep {board.superstep}",
    )
    table = Table("step", "kind", "status", "attempt", "worker", "ms", "detail")
    for row in board.rows():
        table.add_row(
            Text(row.label),
            row.kind,
            _styled(row.status),
            str(row.attempt),
            Text(row.worker[-24:]),
            "" if row.duration_ms is None else str(row.duration_ms),
            Text(row.detail),
        )
    notes = Text("\n".join(board.notes[-6:]), style="dim")
    if board.status == "succeeded":  # what the run gave, as `runs get` shows it
        return Group(head, table, notes, Text(f"output: {dumps(board.output)}"))
    return Group(head, table, notes)


@runs_app.command("watch")
def watch(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Follow a run live: a table of its steps, updated from committed run events, until it ends.

    With --json, prints each event as one JSON line instead; not on a terminal, one line per
    event and the table at the end. Exit 1 unless the run succeeded; a run whose start was
    rejected is shown at once and exits 6.

    Example: `runfold runs watch run-1`
    """
    board = StepBoard(run_id)
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        with contextlib.suppress(RunNotFound):  # a run not started yet has nothing scheduled
            _warn_unconsumed(client, client.get(run_id))
        events = client.events(run_id, follow=True, timeout=timeout)
        if as_json:
            for ev in events:
                board.apply(ev)
                echo_json(ev)
        elif not console.is_terminal:  # a pipe or a log: one line per event as it comes, then the table
            for ev in events:
                board.apply(ev)
                console.print(_event_line(ev), highlight=False)
            console.print(_board_table(board))
        else:
            with Live(_board_table(board), console=console, refresh_per_second=8) as live:
                for ev in events:
                    board.apply(ev)
                    live.update(_board_table(board))
    if board.status == "rejected":
        raise typer.Exit(EXIT_REJECTED)
    if board.status != "succeeded":
        raise typer.Exit(EXIT_FAILED)


@runs_app.command("events")
def events(
    run_id: Annotated[str, typer.Argument(help="Run id.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep following until the run ends.")
    ] = False,
    since: Annotated[int, typer.Option(help="Only events with a sequence above this.")] = 0,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Print a run's committed events in order (the system of record).

    Example: `runfold runs events run-1 --json`
    """
    shown = 0
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        for ev in client.events(
            run_id, follow=follow, after_sequence=since, timeout=timeout if follow else None
        ):
            shown += 1
            if as_json:
                echo_json(ev)
            else:
                console.print(_event_line(ev), highlight=False)
                failure = ev.get("failure")
                if isinstance(failure, dict) and "\n" in str(failure.get("message")):
                    # a traceback a worker sent: whole, below its event (the line keeps 200 chars)
                    console.print(Text(str(failure["message"]), style="red"), highlight=False)
        if not shown and since <= 0:  # no event at all, not even a rejection: no such run (exit 4)
            raise RunNotFound(f"run {run_id!r} has no events under prefix {client.settings.topic_prefix!r}")


def _event_line(ev: dict[str, Any]) -> Text:
    skip = {"type", "run_id", "record_id", "ts_ms", "sequence", "bundle"}
    fields = " ".join(
        f"{k}={dumps(v)}" for k, v in ev.items() if k not in skip and v not in (None, "", {}, [])
    )
    return Text.assemble(f"{ev['sequence']:>4} ", (ev["type"], "bold"), " ", (fields[:200], "dim"))
