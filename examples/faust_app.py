"""A Faust app keeping a live table of runs per (definition, status) from runfold's run events.

Run it (settings from the environment, like every runfold component):

    KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 RUNFOLD_TOPIC_PREFIX=runfold \\
        .venv/bin/python examples/faust_app.py worker --web-port 6066
    curl -s localhost:6066/runs/counts/     # {"one-step|succeeded": 12, "research-brief|waiting": 1, ...}

How it works: the agent `track_runs` reads `<prefix>.run-events` (keyed by run id) into
the table `runs` (run id -> definition, status, last sequence). The table is keyed like
the events, so it is co-partitioned with them: each worker holds the runs of the
partitions it owns, restored from the table's changelog topic on restart. Events at or
below a run's stored sequence are skipped, so redelivered events change nothing.
`counts()` groups the table by (definition, status); the `/runs/counts/` page serves it.
With several workers, each page shows its own partitions' runs: add the pages up (or
run one worker per dashboard).

Why not a second table keyed by (definition, status)? It would need a repartition
topic between two agents, and Faust's exactly-once mode commits a send with the
transaction of the *destination* partition, which only commits when that partition
is consumed again — deltas stall until unrelated traffic arrives. One co-partitioned
table keeps every write in the source partition's transaction.

`processing_guarantee="exactly_once"` makes Faust read run events `read_committed` (it
would otherwise also see events of aborted processor transactions) and commit the
table's changelog with the consumer offsets in one Kafka transaction.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import faust

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from processors.downstream.faust_codec import RunEvent, run_events_topic
from topology.settings import KafkaSettings, load_settings


def make_app(settings: KafkaSettings, app_id: str | None = None, **conf: Any) -> faust.App:
    partitions = settings.partitions
    app_id = app_id or os.environ.get("RUNFOLD_FAUST_APP_ID") or f"{settings.topic_prefix}-faust-run-counts"
    app = faust.App(
        app_id,
        # beside runfold's other local state (Faust's default is "<app id>-data" in the working directory)
        datadir=os.environ.get("RUNFOLD_FAUST_DATADIR") or f".runfold/faust/{app_id}",
        broker=[f"kafka://{b}" for b in settings.bootstrap_servers.split(",")],
        store="memory://",  # tables are rebuilt from their changelog topics on start
        processing_guarantee="exactly_once",
        # None leaves runfold's own topics to the cluster (topology.replication); Faust needs a number
        topic_replication_factor=settings.replication_factor or 1,
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        web_port=int(os.environ.get("RUNFOLD_FAUST_WEB_PORT", "6066")),
        **conf,
    )
    events = run_events_topic(app, settings.topic_prefix)
    runs = app.Table("runs", default=None, partitions=partitions)

    @app.agent(events)
    async def track_runs(stream: Any) -> None:
        async for ev in stream:
            ev: RunEvent
            status = ev.status
            if status is None or ev.sequence == 0:  # RunRejected (sequence 0) never made a run
                continue
            current = runs.get(ev.run_id)
            if current is not None and ev.sequence <= current["sequence"]:
                continue  # already applied (a redelivery)
            definition = ev.definition_id or (current or {}).get("definition_id") or "?"
            runs[ev.run_id] = {"definition_id": definition, "status": status, "sequence": ev.sequence}

    def counts() -> dict[str, int]:
        """Runs per "definition|status" among this worker's partitions."""
        out: dict[str, int] = {}
        for run in runs.values():
            key = f"{run['definition_id']}|{run['status']}"
            out[key] = out.get(key, 0) + 1
        return out

    @app.page("/runs/counts/")
    async def counts_view(web: Any, request: Any) -> Any:
        return web.json(counts())

    app.runfold_runs, app.runfold_counts = runs, counts  # type: ignore[attr-defined]
    return app


app = make_app(load_settings())

if __name__ == "__main__":
    app.main()
