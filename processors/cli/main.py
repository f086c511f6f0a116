"""The `runfold` command: the root typer app; each area mounts its sub-app here with one line."""

from __future__ import annotations

import typer

from processors.cli import bench as cli_bench
from processors.cli import defs as cli_defs
from processors.cli import demo as cli_demo
from processors.cli import dev as cli_dev
from processors.cli import engine as cli_engine
from processors.cli import index as index_cli
from processors.cli import processor as runtime_cli
from processors.cli import replay as cli_replay
from processors.cli import runs as cli_runs
from processors.cli import ui as ui_cli
from processors.cli import worker as executors_cli
from topology.cli import kafka_app, topology_app
from topology.settings import exit_on_settings_error

app = typer.Typer(
    name="runfold",
    no_args_is_help=True,
    help="runfold: durable AI-agent and tool workflows as an exactly-once stream processor on Kafka.",
    pretty_exceptions_enable=False,
)

# ---- sub-apps: one line per area -------------------------------------------------------------
app.add_typer(kafka_app, name="kafka")
app.add_typer(topology_app, name="topology")
executors_cli.mount(app)  # `runfold worker`, `runfold child-executor`
app.command("processor")(runtime_cli.processor)  # `runfold processor`
app.add_typer(cli_defs.defs_app, name="defs")  # `runfold defs register|list|show`
app.add_typer(cli_runs.runs_app, name="runs")  # `runfold runs start|cancel|...|watch|events`
app.command("replay")(cli_replay.replay)  # `runfold replay --verify | --rebuild`
app.add_typer(cli_bench.bench_app, name="bench")  # `runfold bench keyed-fold|workflow-throughput|...|all`
app.command("demo")(cli_demo.demo)  # `runfold demo`
app.command("dev")(cli_dev.dev)  # `runfold dev DEFS_DIR --module your.module`
app.add_typer(cli_engine.engine_app, name="engine")  # `runfold engine build|status`
app.add_typer(index_cli.index_app, name="index")  # `runfold index run|status`
app.command("ui")(ui_cli.ui)  # `runfold ui`
# (other areas: add `app.add_typer(<their_app>, name="<name>")` lines here)
# ----------------------------------------------------------------------------------------------


def main() -> None:
    exit_on_settings_error(app)


if __name__ == "__main__":
    main()
