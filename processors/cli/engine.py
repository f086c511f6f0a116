"""`runfold engine build|status`: the engine's hot modules compiled with mypyc (processors/native_engine.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from processors import native_engine
from processors.cli.common import EXIT_USAGE, JsonOpt, console, echo_json, err_console, fail

engine_app = typer.Typer(
    no_args_is_help=True,
    help="The compiled engine: build it for the sources as they are, or say which engine runs (docs/runtime.md).",
)


@engine_app.command("build")
def build(
    force: Annotated[
        bool, typer.Option("--force", help="Build again even when a build of these sources exists.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compile the engine's hot modules with mypyc for the sources as they are now (about 20 s; nothing when built).

    The build is keyed by the sha256 of every engine source: edit one and the engine runs
    interpreted until the next build. A build made by another mypy than the installed one is
    made again. Needs mypy (the `compiled` extra) and a C compiler.
    """
    try:
        before = native_engine.status()
        if not as_json and (force or not before["built"] or before["outdated"]):
            console.print("building the compiled engine (mypyc, about 20 s) ...", highlight=False)
        done = native_engine.build(force=force)
    except native_engine.NativeEngineError as e:
        raise fail(as_json, str(e)) from None
    if as_json:
        echo_json(
            {
                "ok": True,
                "key": done.key,
                "directory": str(done.directory),
                "built": done.built,
                "seconds": round(done.seconds, 1),
            }
        )
        return
    what = f"built in {done.seconds:.0f} s" if done.built else "already built"
    console.print(f"compiled engine {what}: {done.directory}", highlight=False)


@engine_app.command("status")
def status(as_json: JsonOpt = False) -> None:
    """Which engine a process started now would run, and whether a build of these sources exists (exit 2: RUNFOLD_ENGINE cannot be honoured)."""
    info = native_engine.status()
    problem = info["problem"]
    if as_json:
        echo_json({"ok": problem is None, **info})
    else:
        built = "built" if info["built"] else "not built (runfold engine build)"
        if info["outdated"]:
            built = (
                f"built by mypy {info['built_by_mypy'] or '(unknown)'}, {info['installed_mypy']} is installed "
                "(it runs; runfold engine build makes it again)"
            )
        console.print(
            f"engine: {info['runs']} (RUNFOLD_ENGINE={info['mode']}); build of these sources: {built}",
            highlight=False,
        )
        console.print(f"  sources {info['sources']}  key {str(info['key'])[:12]}", highlight=False)
        console.print(f"  build   {info['directory']}", highlight=False)
        if problem is not None:
            err_console.print(f"[bold red]error:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    if problem is not None:
        raise typer.Exit(EXIT_USAGE)
