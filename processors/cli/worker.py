"""`runfold worker` and `runfold child-executor`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from processors import service_logs
from processors.executors.sdk import Worker
from processors.executors.settings import ChildExecutorSettings, WorkerSettings
from topology.settings import log_level_name


def load_module(spec: str) -> Any:
    """Import user actions: a dotted module name (cwd is importable) or a path to a .py file.

    The module registers its handlers with `@action("name")` decorators on the module-level
    registry (`from processors.executors import action`), or defines `register(worker)`."""
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec).resolve()
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        if mod_spec is None or mod_spec.loader is None:
            raise typer.BadParameter(f"cannot load actions from {spec}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[path.stem] = module
        mod_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(spec)


LogFormatOpt = Annotated[
    str | None,
    typer.Option("--log-format", help="json or human (default: RUNFOLD_LOG_FORMAT, else json)"),
]


def _logging(level: str, fmt: str | None) -> None:
    """The services' one log format (processors/service_logs.py), librdkafka's lines included."""
    try:
        name = log_level_name(level)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--log-level") from None
    try:
        service_logs.configure(name, fmt)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--log-format") from None


def worker_command(
    module: Annotated[
        list[str], typer.Option("--module", "-m", help="module (or .py file) with actions; repeatable")
    ] = [],  # noqa: B006
    queue: Annotated[
        list[str], typer.Option("--queue", "-q", help="activation queue to serve; repeatable")
    ] = [],  # noqa: B006
    name: Annotated[str | None, typer.Option(help="worker name (in worker ids)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="handlers running at once")] = None,
    allow_host: Annotated[
        list[str],
        typer.Option(
            "--allow-host",
            help="where http.request may call: [scheme://]host[:port], "
            "https and its port unless given; repeatable",
        ),
    ] = [],  # noqa: B006
    config: Annotated[
        str | None, typer.Option(help="YAML file with WorkerSettings (agents, hosts, ...)")
    ] = None,
    topic_prefix: Annotated[
        str | None, typer.Option(help="topic prefix (default: RUNFOLD_TOPIC_PREFIX)")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Prometheus /metrics port (0 = ephemeral; default: RUNFOLD_WORKER_METRICS_PORT, else off)"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
    log_format: LogFormatOpt = None,
) -> None:
    """Run an action worker: consume activations, run handlers, send receipts. SIGTERM drains.

    Exits 2 with one line when no broker answers within connect_timeout_ms
    (RUNFOLD_WORKER_CONNECT_TIMEOUT_MS, default 30000).

    Example: `runfold worker --module examples/my_actions.py --queue default --log-format human`
    """
    _logging(log_level, log_format)
    overrides: dict[str, Any] = {
        "name": name,
        "concurrency": concurrency,
        "queues": list(queue) or None,
        "http_allowed_hosts": list(allow_host) or None,
        "metrics_port": metrics_port,
    }
    settings = WorkerSettings.load(config, **overrides)
    modules = [load_module(m) for m in module]
    worker = Worker(settings=settings)
    for mod in modules:
        register = getattr(mod, "register", None)
        if callable(register):
            register(worker)
    code = worker.run(topic_prefix=topic_prefix)
    # A sync handler that ignored cancellation still owns a pool thread; do not wait for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def child_executor_command(
    instance_id: Annotated[
        str | None,
        typer.Option(
            help="stable id of this instance (transactional id suffix; default: RUNFOLD_CHILD_EXECUTOR_INSTANCE_ID, "
            "else 0)"
        ),
    ] = None,
    topic_prefix: Annotated[
        str | None, typer.Option(help="topic prefix (default: RUNFOLD_TOPIC_PREFIX)")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Prometheus /metrics port (0 = ephemeral; default: RUNFOLD_CHILD_EXECUTOR_METRICS_PORT, else off)"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="logging level")] = "INFO",
    log_format: LogFormatOpt = None,
) -> None:
    """Run the child-run executor: child activations -> StartRun/CancelRun, child outcomes -> receipts.

    Exits 2 with one line when no broker answers within connect_timeout_ms
    (RUNFOLD_CHILD_EXECUTOR_CONNECT_TIMEOUT_MS, default 30000).

    Example: `runfold child-executor --instance-id 0 --metrics-port 9311`
    """
    from processors.executors.child_executor import ChildExecutor

    _logging(log_level, log_format)
    overrides: dict[str, Any] = {"instance_id": instance_id, "metrics_port": metrics_port}
    s = ChildExecutorSettings.load(**overrides)
    code = ChildExecutor(
        topic_prefix=topic_prefix,
        instance_id=s.instance_id,
        batch=s.batch,
        metrics_port=s.metrics_port,
        metrics_host=s.metrics_host,
        connect_timeout_s=s.connect_timeout_ms / 1000,
    ).run()
    # A producer left inside a call that never returned must not be destroyed (that can block).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def mount(app: typer.Typer) -> None:
    """Add `worker` and `child-executor` to the root `runfold` app."""
    app.command("worker")(worker_command)
    app.command("child-executor")(child_executor_command)


if __name__ == "__main__":
    from topology.settings import exit_on_settings_error

    _app = typer.Typer(pretty_exceptions_enable=False)
    mount(_app)
    exit_on_settings_error(_app)
