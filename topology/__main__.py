"""`python -m topology kafka|topology ...`: the broker and topic commands without the rest of the CLI.

The scripts use this entry so that starting a broker never depends on other areas' imports;
users call the same commands as `runfold kafka ...` and `runfold topology ...`.
"""

from __future__ import annotations

import typer

from topology.cli import kafka_app, topology_app

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="runfold's broker and topic commands (also mounted as `runfold kafka|topology`).",
)
app.add_typer(kafka_app, name="kafka")
app.add_typer(topology_app, name="topology")

if __name__ == "__main__":
    app()
