"""faust-streaming peer: the same keyed fold (count, sum per key), exactly-once.

`faust.App(processing_guarantee="exactly_once")`, a `Table` in RocksDB (rocksdict) with its
changelog topic, one agent that updates the table and sends the aggregate to the output
topic. Commit interval: Faust's default (2.8 s) unless --commit-interval-s is given.

    python -m benchmarks.peers.faust_fold --prefix P --input T --output O --partitions N --state-dir D --first-file F
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import faust

from benchmarks.harness import bootstrap


def make_app(args: argparse.Namespace) -> faust.App:
    kw: dict[str, Any] = {}
    if args.commit_interval_s is not None:
        kw["broker_commit_interval"] = args.commit_interval_s
    app = faust.App(
        f"{args.prefix}-faust",
        broker=[f"kafka://{b}" for b in bootstrap().split(",")],
        store="rocksdb://",
        datadir=args.state_dir,
        processing_guarantee="exactly_once",
        topic_partitions=args.partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        **kw,
    )
    inp = app.topic(args.input, key_type=bytes, value_serializer="json", partitions=args.partitions)
    out = app.topic(args.output, key_type=bytes, value_serializer="json", partitions=args.partitions)
    table = app.Table("agg", default=None, partitions=args.partitions, key_type=str, value_type=None)
    first: list[Path | None] = [Path(args.first_file) if args.first_file else None]

    @app.agent(inp)
    async def fold(stream: Any) -> None:
        async for value in stream:
            if first[0] is not None:
                first[0].write_text(repr(time.time()))
                first[0] = None
            k = value["k"]
            agg = table.get(k)
            agg = (
                {"count": 1, "sum": value["v"]}
                if agg is None
                else {"count": agg["count"] + 1, "sum": agg["sum"] + value["v"]}
            )
            table[k] = agg
            await out.send(key=k.encode(), value={"key": k, **agg})

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--first-file", default=None)
    ap.add_argument("--commit-interval-s", type=float, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    app = make_app(args)
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    app.main()  # stops on SIGTERM


if __name__ == "__main__":
    main()
