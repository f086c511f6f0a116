"""Where the fold's CPU per input goes, stage by stage, without Kafka and without a profiler.

`fold_bench.py` times the whole fold (decode → engine → encode → snapshots → store) as one
figure; cProfile's split of it is distorted (it slows the interpreted shell far more than the
compiled engine). This replays the same recorded input stream (`fold_bench.record`: N 3-step
runs, their receipts) through growing prefixes of the fold's work, each timed alone as CPU
time, the least of `--repeat` replays:

    decode     the input records' bytes → dicts (the codec's reader)
    engine     + decide() and effects() on every input, per-run states carried along: the
               workflow semantics, pure (processors/engine)
    encode     + every event, activation and child activation encoded as the fold does
    snapshot   + dump_state() of each run's state after each input, and one run-state snapshot
               encoded per run per transaction (the fold's rule)
    fold       the whole `Folder` into a real RocksDB store, as `fold_bench.py` times it (adds
               the overlay, timers, counters, the store write and the shell's checks)

Each stage's cost is the difference to the previous one. The figure issue 28's fair limit
turns on is `engine`: the raw consume → produce loop of `benchmarks/fair_limit.py` spends
~18-36 µs of wall time per input on the fold's own records, so the fold stays within twice its time
(fold / limit ≥ 0.5) only if everything here together stays within about that.

    .venv/bin/python benchmarks/fold_stages.py [--runs 2000] [--batch 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fold_bench  # the sibling benchmark (run as a script, its folder is on sys.path)
import orjson

from processors import native_engine
from processors.cli.processor import tune_gc
from processors.engine import decide, dump_state, effects, run_status
from processors.engine.effects import NONE as NO_EFFECTS
from processors.runtime.store import PartitionStore
from schemas import Codec
from topology.catalog import TopicNames

CHILD_TYPES = frozenset(
    {"ChildRunActivation", "ChildRunCancel"}
)  # the fold routes these to child-activations
STAGES = ("decode", "engine", "encode", "snapshot", "fold")


def _decoders(codec: Codec, topics: TopicNames) -> dict[str, Callable[[bytes | None], dict[str, Any]]]:
    return {topics.commands: codec.decoder("commands"), topics.receipts: codec.decoder("receipts")}


def staged(
    stage: str, stream: list[tuple[str, bytes, bytes]], codec: Codec, topics: TopicNames, batch: int
) -> int:
    """One replay of `stream` doing the work of `stage` and every stage before it; returns how
    many records it encoded (at `snapshot`, every record the fold writes)."""
    decoders = _decoders(codec, topics)
    ctx = fold_bench.make_folder(codec, topics, fold_bench.Sink()).ctx
    enc_event, enc_activation = codec.encoder("run_events"), codec.encoder("activations")
    enc_child, enc_snapshot = codec.encoder("child_activations"), codec.encoder("run_state")
    states: dict[str, Any] = {}
    encoded = 0
    for start in range(0, len(stream), batch):
        dumped: dict[str, bytes] = {}  # run id -> its state's bytes after its last input of this transaction
        for topic, value, _key in stream[start : start + batch]:
            msg = decoders[topic](value)
            if stage == "decode":
                continue
            run_id = msg["run_id"]
            decision = decide(states.get(run_id), msg, ctx)
            state = None
            for event, state in zip(decision.events, decision.states, strict=True):
                fx = NO_EFFECTS if state is None else effects(state, event)
                if stage == "engine":
                    continue
                enc_event(event)
                for m in fx.messages:
                    (enc_child if m["type"] in CHILD_TYPES else enc_activation)(m)
                encoded += 1 + len(fx.messages)
            if state is None:
                continue
            states[run_id] = state
            if stage == "snapshot":
                dumped[run_id] = dump_state(state)  # per input, as the fold's store value
        for run_id, raw in dumped.items():  # one snapshot per run per transaction, the fold's fields
            state = states[run_id]
            enc_snapshot(
                {
                    "run_id": run_id,
                    "sequence": state["sequence"],
                    "ts_ms": fold_bench.TS,
                    "status": run_status(state),
                    "definition_id": state["definition_id"],
                    "revision": state["revision"],
                    "state_digest": hashlib.sha256(raw).hexdigest(),
                    "state": orjson.Fragment(raw),
                }
            )
            encoded += 1
    return encoded


def full_fold(
    stream: list[tuple[str, bytes, bytes]], codec: Codec, topics: TopicNames, batch: int, root: Path
) -> int:
    """The whole fold, as `fold_bench.py` times it; returns how many records it produced."""
    sink = fold_bench.Sink()
    folder = fold_bench.make_folder(codec, topics, sink)
    store = PartitionStore(root, 0)
    try:
        for i in range(0, len(stream), batch):
            fold_bench.transaction(folder, store, stream[i : i + batch])
    finally:
        store.close()
    return len(sink.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3, help="replays per stage; the least CPU counts")
    args = ap.parse_args()
    codec, topics = Codec.default(), TopicNames("bench")
    root = Path(tempfile.mkdtemp(prefix="runfold-foldstages-"))
    try:
        stream = fold_bench.record(args.runs, args.batch, codec, topics, root)
        tune_gc()  # as the processor runs
        cpu = dict.fromkeys(STAGES, float("inf"))
        records: dict[str, int] = {}
        for n in range(args.repeat):  # stages interleaved, so a slow phase of the host hits each alike
            for stage in STAGES:
                gc.collect()
                c0 = time.process_time()
                if stage == "fold":
                    records[stage] = full_fold(stream, codec, topics, args.batch, root / f"fold{n}")
                else:
                    records[stage] = staged(stage, stream, codec, topics, args.batch)
                cpu[stage] = min(cpu[stage], time.process_time() - c0)
        per_input = {stage: 1e6 * cpu[stage] / len(stream) for stage in STAGES}
        cost, previous = {}, 0.0
        for stage in STAGES:
            cost[stage] = round(per_input[stage] - previous, 1)
            previous = per_input[stage]
        print(
            orjson.dumps(
                {
                    "bench": "fold_stages",
                    "engine": native_engine.running(),
                    "runs": args.runs,
                    "repeat": args.repeat,
                    "input_records": len(stream),
                    # the same records encoded by the staged replay and produced by the fold: the
                    # stages do the fold's work, not a lighter version of it
                    "records_out": {"snapshot": records["snapshot"], "fold": records["fold"]},
                    "us_per_input_cumulative": {s: round(v, 1) for s, v in per_input.items()},
                    "us_per_input_by_stage": cost,
                }
            ).decode()
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
