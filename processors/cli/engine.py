"""`runfold engine build|status`: the engine's hot modules compiled with mypyc (processors/native_engine.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from processors import native_engine
from processors.cli.common import EXIT_USAGE, JsonOpt, console, echo_json, fail

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
    interpreted until the next build. Needs mypy (the `compiled` extra) and a C compiler.
    """
    try:
        if not as_json and (force or not native_engine.status()["built"]):
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
    """Which engine a processor started now would run, and whether a build of these sources exists."""
    try:
        info = native_engine.status()
    except native_engine.NativeEngineError as e:  # RUNFOLD_ENGINE has a value it does not know
        raise fail(as_json, str(e), EXIT_USAGE) from None
    runs = "interpreted"
    if info["mode"] != "interpreted" and info["built"]:
        runs = "compiled"
    info["runs"] = runs
    if as_json:
        echo_json({"ok": True, **info})
        return
    built = "built" if info["built"] else "not built (runfold engine build)"
    console.print(
        f"engine: {runs} (RUNFOLD_ENGINE={info['mode']}); build of these sources: {built}", highlight=False
    )
    console.print(f"  key {str(info['key'])[:12]}  {info['directory']}", highlight=False)
