"""Quix Streams peer: the same keyed fold (count, sum per key), exactly-once.

`Application(processing_guarantee="exactly-once")`, a stateful `sdf.apply(..., stateful=True)`
(RocksDB state with its changelog topic), output to a topic. Commit interval: Quix's default
(5 s) unless --commit-interval-s is given.

    python -m benchmarks.peers.quix_fold --prefix P --input T --output O --state-dir D --first-file F
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from quixstreams import Application, State

from benchmarks.harness import bootstrap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--first-file", default=None)
    ap.add_argument("--commit-interval-s", type=float, default=None)
    args = ap.parse_args()
    kw: dict[str, Any] = {}
    if args.commit_interval_s is not None:
        kw["commit_interval"] = args.commit_interval_s
    app = Application(
        broker_address=bootstrap(),
        consumer_group=f"{args.prefix}-quix",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=args.state_dir,
        loglevel="WARNING",
        **kw,
    )
    inp = app.topic(args.input, key_deserializer="str", value_deserializer="json")
    out = app.topic(args.output, key_serializer="str", value_serializer="json")
    first: list[Path | None] = [Path(args.first_file) if args.first_file else None]

    def fold(value: dict[str, Any], state: State) -> dict[str, Any]:
        if first[0] is not None:
            first[0].write_text(repr(time.time()))
            first[0] = None
        agg = state.get("agg")
        agg = (
            {"count": 1, "sum": value["v"]}
            if agg is None
            else {"count": agg["count"] + 1, "sum": agg["sum"] + value["v"]}
        )
        state.set("agg", agg)
        return {"key": value["k"], **agg}

    sdf = app.dataframe(inp)
    sdf = sdf.apply(fold, stateful=True)
    sdf.to_topic(out)
    app.run()  # stops on SIGTERM (Quix handles it and closes cleanly)


if __name__ == "__main__":
    main()
