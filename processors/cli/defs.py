"""`runfold defs register|list|show`: workflow definitions on the definitions topic."""

from __future__ import annotations

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
    err_console,
    make_client,
)
from processors.client import DefinitionConflict, InvalidDefinition

defs_app = typer.Typer(
    no_args_is_help=True,
    help="Register, list and show workflow definitions (versioned, immutable once registered).",
)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


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

    Registering identical content again is a no-op; the same id@revision with different content is refused (publish a new revision). Invalid files are reported with the path inside the definition and the rule that failed; the exit code is 1 if any file failed.

    Example: `runfold defs register examples/definitions/`
    """
    files: list[Path] = []
    for p in paths:
        files += (
            sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml", ".json")) if p.is_dir() else [p]
        )
    failed = 0
    rows: list[dict[str, object]] = []
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        for f in files:
            try:
                before = client.definitions.all(refresh=False) if rows else {}
                rec = client.register(f)
                existed = rec["revision"] in before.get(rec["definition_id"], {})
                row = {
                    "file": str(f),
                    "ok": True,
                    "definition_id": rec["definition_id"],
                    "revision": rec["revision"],
                    "content_hash": rec["content_hash"],
                    "status": "unchanged" if existed else "registered",
                }
            except (InvalidDefinition, DefinitionConflict) as e:
                failed += 1
                row = {"file": str(f), "ok": False, "error": str(e), "error_type": type(e).__name__}
            rows.append(row)
            if as_json:
                echo_json(row)
            elif row["ok"]:
                console.print(
                    f"[green]✓[/] {row['definition_id']}@{row['revision']} "
                    f"[dim]{row['content_hash'][:12]} {escape(str(f))}[/]",
                    highlight=False,
                )
            else:
                err_console.print(f"[bold red]✗[/] {escape(row['error'])}", highlight=False)
    if failed:
        raise typer.Exit(EXIT_FAILED)


@defs_app.command("list")
def list_defs(
    as_json: JsonOpt = False, topic_prefix: PrefixOpt = None, bootstrap: BootstrapOpt = None
) -> None:
    """List registered definitions: id, revisions, latest registration time.

    Example: `runfold defs list --json`
    """
    with cli_errors(as_json), make_client(topic_prefix, bootstrap) as client:
        records = client.definitions.all()
    if as_json:
        for def_id in sorted(records):
            for rev in sorted(records[def_id]):
                r = records[def_id][rev]
                echo_json({k: r[k] for k in ("definition_id", "revision", "content_hash", "registered_ms")})
        return
    table = Table(title=f"definitions ({len(records)})")
    for col in ("id", "revisions", "latest", "content hash", "registered"):
        table.add_column(col)
    for def_id in sorted(records):
        revs = sorted(records[def_id])
        latest = records[def_id][revs[-1]]
        table.add_row(
            def_id,
            ", ".join(map(str, revs)),
            str(revs[-1]),
            latest["content_hash"][:12],
            _when(latest["registered_ms"]),
        )
    console.print(table)


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
