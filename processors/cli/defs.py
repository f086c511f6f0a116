"""`runfold defs validate|register|list|show|deprecate|promote|unpin`: workflow definitions on
the definitions topic (validate needs no broker)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from processors.cli.common import (
    EXIT_FAILED,
    BootstrapOpt,
    JsonOpt,
    PrefixOpt,
    cli_errors,
    console,
    echo_json,
    fail,
    make_client,
)
from processors.client import DefinitionConflict, InvalidDefinition
from processors.client.definitions import SourceCheck, check_sources, describe_issue
from processors.engine.errors import Issue
from processors.engine.registration import QUEUES_ENV
from topology.settings import load_settings

defs_app = typer.Typer(
    no_args_is_help=True,
    help="Validate, register, list, show, deprecate and promote workflow definitions "
    "(versioned, immutable once registered).",
)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        found = (
            sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml", ".json")) if p.is_dir() else [p]
        )
        if not found:  # else nothing is checked and the command says nothing, exit 0
            typer.echo(f"✗ {p}: no definition files (*.yaml, *.yml, *.json) in this folder", err=True)
            raise typer.Exit(EXIT_FAILED)
        files += found
    return files


def _where(path: str) -> tuple[str | None, str]:
    """(node, field) of an issue path: `nodes.search.queue` -> (search, queue),
    `routes.review[0].when` -> (review, routes[0].when)."""
    found = re.match(r"^nodes\.([^.\[]+)\.?(.*)$", path)
    if found:
        return found.group(1), found.group(2)
    found = re.match(r"^routes\.([^.\[]+)(.*)$", path)
    if found:
        return found.group(1), f"routes{found.group(2)}"
    return None, path


def _issue_json(issue: Issue) -> dict[str, object]:
    node, field_path = _where(issue.path)
    return {
        "path": issue.path,
        "node": node,
        "field": field_path,
        "rule": issue.rule,
        "message": issue.message,
    }


def _check_line(check: SourceCheck, issue: Issue) -> str:
    mark = "✗" if issue.severity == "error" else "!"
    return f"{mark} {check.source}: {check.key or '?'}: {issue.severity}: {describe_issue(issue)}"


@defs_app.command("validate")
def validate(
    paths: Annotated[
        list[Path], typer.Argument(help="YAML or JSON definition files (or directories of them).")
    ],
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            help=f"A queue the topology serves (repeat it). Default: {QUEUES_ENV}, else default,agents.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check definitions as registration would, offline (no broker): each file on its own, then
    against the others given (child workflows, nested budgets) and the queues the topology serves.

    One line per problem names the file, the definition, the path (node and field) and the rule;
    warnings (a child not among the files, an unreachable node) do not fail. Exit 0 when every
    file is valid, 1 otherwise.

    Example: `runfold defs validate examples/definitions/ --queue default --queue agents --queue tools`
    """
    served = frozenset(queues) if queues else frozenset(load_settings().activation_queues)
    checks = check_sources(list(_files(paths)), served)
    for check in checks:
        if as_json:
            echo_json(
                {
                    "file": check.source,
                    "ok": not check.errors,
                    "definition": check.key,
                    "errors": [_issue_json(i) for i in check.errors],
                    "warnings": [_issue_json(i) for i in check.warnings],
                }
            )
            continue
        for issue in check.issues:
            typer.echo(_check_line(check, issue), err=True)
        if not check.errors:
            console.print(f"[green]✓[/] {check.key} [dim]{escape(check.source)}[/]", highlight=False)
    if any(check.errors for check in checks):
        raise typer.Exit(EXIT_FAILED)


@defs_app.command("register")
def register(
    paths: Annotated[
        list[Path], typer.Argument(help="YAML or JSON definition files (or directories of them).")
    ],
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Validate definitions and publish them to <prefix>.definitions (keyed id@revision).

    Each file gets every check `defs validate` makes, against the definitions already registered and the queues RUNFOLD_ACTIVATION_QUEUES names (default,agents when unset). Registering identical content again is a no-op; the same id@revision with different content is refused (publish a new revision). Invalid files are reported with the path inside the definition and the rule that failed; the exit code is 1 if any file failed.

    Example: `runfold defs register examples/definitions/`
    """
    files = _files(paths)
    failed = 0
    rows: list[dict[str, object]] = []
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        for f in files:
            try:
                before = client.definitions.all(refresh=False) if rows else {}
                rec, warnings = client.definitions.register_checked(f)
                existed = rec["revision"] in before.get(rec["definition_id"], {})
                row = {
                    "file": str(f),
                    "ok": True,
                    "definition_id": rec["definition_id"],
                    "revision": rec["revision"],
                    "content_hash": rec["content_hash"],
                    "status": "unchanged" if existed else "registered",
                    "warnings": [describe_issue(w) for w in warnings],
                }
            except (InvalidDefinition, DefinitionConflict) as e:
                failed += 1
                named = e.definition if isinstance(e, InvalidDefinition) else None
                row = {
                    "file": str(f),
                    "ok": False,
                    "definition": named,
                    "error": str(e),
                    "error_type": type(e).__name__,
                }
                issues = e.issues if isinstance(e, InvalidDefinition) else []
            rows.append(row)
            if as_json:
                echo_json(row)
            elif row["ok"]:
                console.print(
                    f"[green]✓[/] {row['definition_id']}@{row['revision']} "
                    f"[dim]{row['content_hash'][:12]} {escape(str(f))}[/]",
                    highlight=False,
                )
                for warning in warnings:
                    typer.echo(
                        f"! {f}: {row['definition_id']}@{row['revision']}: warning: {describe_issue(warning)}",
                        err=True,
                    )
            elif issues:  # one line per problem, never wrapped
                for issue in issues:
                    typer.echo(f"✗ {f}: {named or '?'}: error: {describe_issue(issue)}", err=True)
            else:
                typer.echo(f"✗ {row['error']}", err=True)
    if failed:
        raise typer.Exit(EXIT_FAILED)


@defs_app.command("list")
def list_defs(
    as_json: JsonOpt = False, topic_prefix: PrefixOpt = None, bootstrap: BootstrapOpt = None
) -> None:
    """List registered definitions: id, revisions (deprecated ones marked), the revision an
    unpinned start starts (latest: promoted, else the highest not deprecated), registration time.

    Example: `runfold defs list --json`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        registry = client.definitions
        records = registry.all()
        lifecycle = registry.lifecycle
        latest = {def_id: registry.latest(def_id) for def_id in records}
    if as_json:
        for def_id in sorted(records):
            for rev in sorted(records[def_id]):
                r = records[def_id][rev]
                row = {k: r[k] for k in ("definition_id", "revision", "content_hash", "registered_ms")}
                row["deprecated"] = lifecycle.is_deprecated(def_id, rev)
                row["latest"] = latest[def_id] == rev
                row["promoted"] = lifecycle.promoted(def_id) == rev
                echo_json(row)
        return
    table = Table(title=f"definitions ({len(records)})")
    for col in ("id", "revisions", "latest", "content hash", "registered"):
        table.add_column(col)
    for def_id in sorted(records):
        revs = sorted(records[def_id])
        marked = [f"{rev} (deprecated)" if lifecycle.is_deprecated(def_id, rev) else str(rev) for rev in revs]
        current = latest[def_id]
        shown = records[def_id][current if current is not None else revs[-1]]
        pinned = " (promoted)" if current is not None and lifecycle.promoted(def_id) == current else ""
        table.add_row(
            def_id,
            ", ".join(marked),
            f"{current}{pinned}" if current is not None else "none (all deprecated)",
            shown["content_hash"][:12],
            _when(shown["registered_ms"]),
        )
    console.print(table)


def _key(value: str) -> tuple[str, int]:
    def_id, sep, rev = value.rpartition("@")
    if not sep or not rev.isdigit() or not def_id:
        raise typer.BadParameter(f"{value!r} is not ID@REVISION (e.g. triage@3)")
    return def_id, int(rev)


ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (kept on the definitions topic).")]


@defs_app.command("deprecate")
def deprecate(
    definition: Annotated[str, typer.Argument(help="id@revision")],
    undo: Annotated[bool, typer.Option("--undo", help="Reinstate the revision instead.")] = False,
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Stop new runs of a revision: a StartRun naming it is rejected (Conflict) and an unpinned
    start skips it; runs already started from it, and their child runs, go on. `--undo` reinstates it.

    Example: `runfold defs deprecate triage@3 --reason "drops the approval step"`
    """
    def_id, rev = _key(definition)
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        client.definitions.deprecate(def_id, rev, reason, undo=undo)
        latest = client.definitions.latest(def_id)
    _lifecycle_done(as_json, "reinstated" if undo else "deprecated", f"{def_id}@{rev}", def_id, latest)


@defs_app.command("promote")
def promote(
    definition: Annotated[str, typer.Argument(help="id@revision")],
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Make a revision "latest": what `runs start ID` (no revision) starts, on every processor,
    until another is promoted, it is deprecated, or `defs unpin ID`. A newer revision registered
    later does not replace it.

    Example: `runfold defs promote triage@2`
    """
    def_id, rev = _key(definition)
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        try:
            client.definitions.promote(def_id, rev, reason)
        except ValueError as e:
            raise fail(as_json, str(e)) from None
        latest = client.definitions.latest(def_id)
    _lifecycle_done(as_json, "promoted", f"{def_id}@{rev}", def_id, latest)


@defs_app.command("unpin")
def unpin(
    definition: Annotated[str, typer.Argument(help="Definition id.")],
    reason: ReasonOpt = "",
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Forget the promoted revision: latest is the highest revision not deprecated again.

    Example: `runfold defs unpin triage`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        client.definitions.unpin(definition, reason)
        latest = client.definitions.latest(definition)
    _lifecycle_done(as_json, "unpinned", definition, definition, latest)


def _lifecycle_done(as_json: bool, what: str, target: str, def_id: str, latest: int | None) -> None:
    if as_json:
        echo_json({"ok": True, "event": what, "target": target, "latest": latest})
        return
    now = f"{def_id}@{latest}" if latest is not None else "none: every revision is deprecated"
    console.print(f"[green]✓[/] {escape(target)} {what}; latest is {escape(now)}", highlight=False)


@defs_app.command("show")
def show(
    definition: Annotated[str, typer.Argument(help="Definition id, or id@revision.")],
    revision: Annotated[
        int | None, typer.Option("--revision", "-r", help="Revision (default: latest).")
    ] = None,
    as_json: JsonOpt = False,
    topic_prefix: PrefixOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Print a registered definition (YAML, or the DefinitionRecord as JSON).

    Example: `runfold defs show research-brief@1`
    """
    def_id, sep, rev = definition.rpartition("@")
    if sep and rev.isdigit():
        definition, revision = def_id, int(rev)
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        rec = client.definitions.get(definition, revision)
    if as_json:
        echo_json(rec)
        return
    console.print(
        f"[bold]{rec['definition_id']}@{rec['revision']}[/]  [dim]sha256 {rec['content_hash']} · "
        f"registered {_when(rec['registered_ms'])}[/]",
        highlight=False,
    )
    typer.echo(yaml.safe_dump(rec["definition"], sort_keys=False, allow_unicode=True).rstrip())
