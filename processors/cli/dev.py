"""`runfold dev`: the local edit-run loop in one terminal (processors/dev/session.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from processors.cli.common import EXIT_BROKER, EXIT_FAILED, console, fail
from processors.dev.session import DevBrokerUnavailable, DevError, DevOptions, run_dev
from processors.service_logs import log_format as checked_log_format
from topology.settings import log_level_name


def dev(
    definitions: Annotated[
        Path, typer.Argument(help="Folder of definitions (*.yaml, *.yml, *.json) to register and watch.")
    ] = Path("definitions"),
    module: Annotated[
        list[str],
        typer.Option("--module", "-m", help="Module (or .py file) with your actions; repeatable; watched."),
    ] = [],  # noqa: B006
    topic_prefix: Annotated[
        str | None,
        typer.Option("--topic-prefix", help="Topic prefix (default: RUNFOLD_TOPIC_PREFIX, else runfold)."),
    ] = None,
    state_dir: Annotated[Path, typer.Option("--state-dir", help="Where the processor's store goes.")] = Path(
        ".runfold/dev"
    ),
    log_format: Annotated[
        str, typer.Option("--log-format", help="json or human, for every service.")
    ] = "human",
    log_level: Annotated[str, typer.Option("--log-level", help="Log level of every service.")] = "INFO",
    reload: Annotated[
        bool, typer.Option("--reload/--no-reload", help="Restart the worker when a module's files change.")
    ] = True,
) -> None:
    """Develop your own workflows with one command: the broker (started if none runs, and left running), the topics, your definitions registered, then the processor, a worker for your modules and the child executor in this terminal, in one log format.

    Every queue your definitions name is created and served. A change to a module's files restarts the worker; a change in the folder registers the changed definitions (new content needs a new revision). Ctrl-C stops every process it started and exits 0; exit 1 if the processor or the child executor ended by itself (or the session could not start), 3 if no broker answers at KAFKA_BOOTSTRAP_SERVERS.

    Example: `runfold dev definitions/ --module myapp.actions`
    """
    try:
        fmt = checked_log_format(log_format)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--log-format") from None
    try:  # before anything starts: each service would refuse it only once running
        log_level = log_level_name(log_level)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--log-level") from None
    options = DevOptions(
        definitions=definitions,
        modules=list(module),
        topic_prefix=topic_prefix,
        state_dir=state_dir,
        log_format=fmt,
        log_level=log_level,
        reload=reload,
    )
    try:
        code = run_dev(options, console)
    except DevError as e:
        code = EXIT_BROKER if isinstance(e, DevBrokerUnavailable) else EXIT_FAILED
        raise fail(False, f"runfold dev: {e}", code) from None
    raise typer.Exit(code)
