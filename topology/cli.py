"""`runfold kafka ...` and `runfold topology ...`: the broker and topic commands.

Both sub-apps are mounted on the root app in `processors/cli/main.py`. Every command
prints a human summary (rich) or, with `--json`, one JSON object on stdout, and
exits non-zero when it failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from topology import broker, local_cluster, local_kafka

EXIT_BROKER = 3  # docs/client.md's exit codes: the broker is unavailable (as in every one-shot command)

console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]

kafka_app = typer.Typer(
    no_args_is_help=True,
    help="Run a Kafka broker for runfold (an existing cluster, Docker, or Apache Kafka jars from Maven).",
)


def emit(as_json: bool, data: dict[str, Any], human: Callable[[], None]) -> None:
    if as_json:
        typer.echo(orjson.dumps(data, default=str).decode())
    else:
        human()


def fail(as_json: bool, message: str, code: int = 1, **data: Any) -> typer.Exit:
    if as_json:
        typer.echo(orjson.dumps({"ok": False, "error": message, **data}, default=str).decode())
    else:  # the message is text, not markup: a path or name with brackets must print as it is
        err_console.print(
            f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True
        )
    return typer.Exit(code)


def _choice(as_json: bool) -> broker.BrokerChoice:
    try:
        return broker.choose_broker()
    except broker.BrokerError as e:
        raise fail(as_json, str(e)) from e


@kafka_app.command("up")
def kafka_up(
    as_json: JsonOpt = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker to answer.")] = 90.0,
    brokers: Annotated[
        int, typer.Option("--brokers", min=1, max=9, help="Nodes of a local KRaft cluster (1: one broker).")
    ] = 1,
    base_port: Annotated[
        int | None,
        typer.Option(help="First broker port of a local cluster (default RUNFOLD_KAFKA_PORT or 9092)."),
    ] = None,
) -> None:
    """Start a broker (or check the configured one) and wait until it answers.

    Example: `runfold kafka up` (local broker on 127.0.0.1:9092; RUNFOLD_KAFKA_PORT=19092 for another port);
    `runfold kafka up --brokers 3` (a local 3-node cluster on 9092-9094, controllers 9192-9194).
    """
    if brokers > 1:
        _cluster_up(as_json, brokers, base_port, max(timeout, 180.0))
        return
    choice = _choice(as_json)
    try:
        if choice.kind == "local":
            st = local_kafka.up(local_kafka.LocalKafkaConfig.from_env(), timeout=timeout)
            bootstrap, extra = st.bootstrap, st.to_dict()
        else:
            bootstrap, extra = broker.start_broker(choice, timeout=timeout), {}
    except (broker.BrokerError, local_kafka.LocalKafkaError) as e:
        raise fail(
            as_json, f"{choice.kind} broker (chosen because {choice.reason}): {e}", broker=choice.kind
        ) from e
    data = {"ok": True, "broker": choice.kind, "reason": choice.reason, "bootstrap": bootstrap, **extra}

    def human() -> None:
        if extra.get("already_running"):
            what = f"already running (pid {extra['pid']})"
        elif choice.kind == "local":
            what = f"started in {extra['startup_seconds']}s (pid {extra['pid']}, log {extra['log_file']})"
        else:
            what = "answers"
        console.print(f"[green]Kafka[/] [bold]{bootstrap}[/] {what} — {choice.kind}: {choice.reason}")
        console.print(f"export KAFKA_BOOTSTRAP_SERVERS={bootstrap}", highlight=False)

    emit(as_json, data, human)


@kafka_app.command("down")
def kafka_down(as_json: JsonOpt = False) -> None:
    """Stop the broker runfold started (an external cluster is left alone), and the local cluster
    of `kafka up --brokers N` when one runs.

    Example: `runfold kafka down`
    """
    cluster = _cluster_down()
    choice = _choice(as_json)
    try:
        message = broker.stop_broker(choice)
    except broker.BrokerError as e:
        raise fail(as_json, str(e), broker=choice.kind) from e
    if cluster is not None:
        message = f"{cluster}; {message}"
    emit(as_json, {"ok": True, "broker": choice.kind, "message": message}, lambda: console.print(message))


@kafka_app.command("status")
def kafka_status(as_json: JsonOpt = False) -> None:
    """Say which broker runfold would use and whether it answers (exit 1 when it does not).

    Example: `runfold kafka status --json`
    """
    choice = _choice(as_json)
    data: dict[str, Any] = {"broker": choice.kind, "reason": choice.reason}
    if choice.kind == "local":
        try:
            cfg = local_kafka.LocalKafkaConfig.from_env()
        except local_kafka.LocalKafkaError as e:
            raise fail(as_json, str(e), broker=choice.kind) from e
        st = local_kafka.get_status(cfg)
        data |= st.to_dict()
        answers = st.running and local_kafka.broker_answers(st.bootstrap)
    else:
        bootstrap = choice.bootstrap or broker.DOCKER_BOOTSTRAP
        data["bootstrap"] = bootstrap
        answers = local_kafka.broker_answers(bootstrap)
    data["answers"] = answers
    data["ok"] = answers

    def human() -> None:
        state = "[green]running[/]" if answers else "[red]not running[/]"
        pid = f" (pid {data['pid']})" if data.get("pid") else ""
        console.print(f"Kafka {data['bootstrap']}: {state}{pid} — {choice.kind}: {choice.reason}")

    emit(as_json, data, human)
    if not answers:
        raise typer.Exit(1)


def _cluster_up(as_json: bool, brokers: int, base_port: int | None, timeout: float) -> None:
    try:
        cfg = local_cluster.LocalClusterConfig.from_env(brokers=brokers, base_port=base_port)
        st = local_cluster.up(cfg, timeout=timeout)
    except local_kafka.LocalKafkaError as e:
        raise fail(as_json, f"local {brokers}-node cluster: {e}", broker="local-cluster") from e
    data = {"ok": True, "broker": "local-cluster", **st.to_dict()}

    def human() -> None:
        what = "already running" if st.already_running else f"started in {st.startup_seconds}s"
        console.print(f"[green]Kafka cluster[/] of {brokers} [bold]{st.bootstrap}[/] {what} ({st.data_dir})")
        console.print(f"export KAFKA_BOOTSTRAP_SERVERS={st.bootstrap}", highlight=False)

    emit(as_json, data, human)


def _cluster_down() -> str | None:
    """Stop the local cluster recorded in its data dir; None when none runs there."""
    cfg = local_cluster.config_from_state()
    if cfg is None or not any(n["pid"] for n in local_cluster.get_status(cfg).nodes):
        return None
    local_cluster.down(cfg)
    return f"local Kafka cluster of {cfg.size} ({cfg.bootstrap}) stopped"


# --------------------------------------------------------------------------- topology

topology_app = typer.Typer(
    no_args_is_help=True,
    help="Create and verify runfold's topics (names, partitions, cleanup policies, co-partitioning).",
)

PrefixOpt = Annotated[
    str | None, typer.Option("--prefix", help="Topic prefix (default: RUNFOLD_TOPIC_PREFIX or 'runfold').")
]


def _settings(as_json: bool, prefix: str | None) -> Any:
    from topology.settings import ConfigFileError, SettingsInvalid, load_settings

    try:
        return load_settings(**({"topic_prefix": prefix} if prefix else {}))
    except (SettingsInvalid, ConfigFileError) as e:
        raise fail(as_json, f"invalid settings: {e}", code=2) from e


@topology_app.command("create")
def topology_create(prefix: PrefixOpt = None, as_json: JsonOpt = False) -> None:
    """Create the missing topics; existing ones are left alone (safe to run again).

    Example: `runfold topology create --prefix dev`
    """
    from topology.admin import ClusterUnreachable, TopologyError, create_topology

    s = _settings(as_json, prefix)
    try:
        report = create_topology(s)
    except ClusterUnreachable as e:
        raise fail(as_json, str(e), EXIT_BROKER, error_type="BrokerUnavailable") from e
    except TopologyError as e:
        raise fail(as_json, str(e), error_type=type(e).__name__) from e

    def human() -> None:
        for name in report.created:
            console.print(f"[green]created[/]  {name}", highlight=False)
        for name in report.existing:
            console.print(f"[dim]exists[/]   {name}", highlight=False)
        console.print(
            f"{len(report.created)} created, {len(report.existing)} already there on {report.bootstrap}",
            highlight=False,
        )
        _print_replication(report.replication, report.warnings)

    emit(as_json, report.to_dict(), human)


@topology_app.command("verify")
def topology_verify(prefix: PrefixOpt = None, as_json: JsonOpt = False) -> None:
    """Check topics exist with the right partitions, cleanup policy and co-partitioning (exit 1 if not).

    Example: `runfold topology verify --json`
    """
    from topology.admin import ClusterUnreachable, TopologyError, verify_topology

    s = _settings(as_json, prefix)
    try:
        report = verify_topology(s)
    except ClusterUnreachable as e:
        raise fail(as_json, str(e), EXIT_BROKER, error_type="BrokerUnavailable") from e
    except TopologyError as e:
        raise fail(as_json, str(e), error_type=type(e).__name__) from e

    def human() -> None:
        _print_replication(report.replication, report.warnings)
        if report.ok:
            console.print(
                f"[green]ok[/]: {len(report.checked)} topics under '{report.prefix}' on "
                f"{report.bootstrap} match the catalogue",
                highlight=False,
            )
            return
        for p in report.problems:
            console.print(f"[red]{p.kind}[/] {p.message}", highlight=False)
        console.print(
            f"[red]{len(report.problems)} problem(s)[/] under '{report.prefix}' on {report.bootstrap}",
            highlight=False,
        )

    emit(as_json, report.to_dict(), human)
    if not report.ok:
        raise typer.Exit(1)


def _print_replication(replication: dict[str, object], warnings: list[str]) -> None:
    """The replication factor and min ISR wanted (and why), then the brokers' weak settings."""
    if replication:
        console.print(
            f"replication factor {replication['replication_factor']} ({replication['replication_factor_from']}), "
            f"min.insync.replicas {replication['min_insync_replicas']} ({replication['min_insync_replicas_from']})",
            highlight=False,
        )
    for w in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
