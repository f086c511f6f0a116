"""Baseline: raw confluent-kafka transactional consume → produce passthrough.

Same client configs, batch size and commit rule as the processor loop (commit when
the input is drained, the batch is full or commit_interval_ms passed), no decoding,
no engine, no store: the ceiling the processor's fold throughput is compared with.

    .venv/bin/python benchmarks/passthrough_bench.py --records 40000 [--partitions 2]

Prints one JSON object (records/s, transactions, mean batch).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import orjson
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from processors.kafka.records import coordinates
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from topology.settings import admin_config, producer_config


def preload(settings: ProcessorSettings, topic: str, n: int) -> None:
    enc = Codec.default().encoder("commands")
    p = Producer(producer_config(settings))
    for i in range(n):
        run_id = f"pt-{i}"
        value = enc(
            {
                "type": "StartRun",
                "run_id": run_id,
                "ts_ms": 0,
                "record_id": uuid.uuid4().hex,
                "definition_id": "three",
                "revision": None,
                "input": {"i": i},
            }
        )
        while True:
            try:
                p.produce(topic, value, run_id.encode())
                break
            except BufferError:
                p.poll(0.1)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)


class LoopResult(NamedTuple):
    records: int  # input records consumed and committed
    transactions: int
    seconds: float  # from the first record consumed
    commit_s: float  # in send_offsets_to_transaction + commit_transaction


def transactional_loop(
    settings: ProcessorSettings,
    consumer: Consumer,
    producers: list[Producer],
    expected: int,
    on_record: Callable[[Message, str, int, int], None],
    before_commit: Callable[[], None] = lambda: None,
) -> LoopResult:
    """The processor's batch and commit rule without its fold: take what is buffered (blocking
    only with no transaction open), `on_record(msg, topic, partition, offset)` for each input,
    and commit (after `before_commit`) when the input is drained, the batch is full or
    `commit_interval_ms` has passed; until `expected` inputs are done. `producers[0]` is the
    transaction's; with two, they alternate after each commit as the processor's do
    (`alternate_producers`), so `on_record` must produce with `producers[0]`."""
    batch = settings.batch_size
    interval = settings.commit_interval_ms / 1000.0
    done = txns = in_txn = 0
    open_txn = False
    deadline = 0.0
    nxt: dict[tuple[str, int], int] = {}
    t0: float | None = None
    commit_s = 0.0
    while done < expected:
        if open_txn:
            msgs = consumer.consume(batch - in_txn, 0)
        else:
            first = consumer.poll(0.1)
            msgs = [first] if first is not None else []
            if first is not None:
                msgs.extend(consumer.consume(batch - 1, 0))
        if msgs:
            if t0 is None:
                t0 = time.perf_counter()
            if not open_txn:
                producer = producers[0]
                producer.begin_transaction()
                open_txn = True
                deadline = time.monotonic() + interval
            for m in msgs:
                if m.error() is not None:
                    continue
                topic, partition, offset = coordinates(m)
                on_record(m, topic, partition, offset)
                nxt[(topic, partition)] = offset + 1
                done += 1
            in_txn += len(msgs)
        if open_txn and (not msgs or in_txn >= batch or time.monotonic() >= deadline):
            before_commit()
            c0 = time.perf_counter()
            producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in nxt.items()], consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            commit_s += time.perf_counter() - c0
            txns += 1
            open_txn = False
            in_txn = 0
            nxt.clear()
            producers.append(producers.pop(0))
    return LoopResult(done, txns, time.perf_counter() - (t0 or time.perf_counter()), commit_s)


def passthrough(settings: ProcessorSettings, src: str, dst: str, expected: int) -> dict[str, float]:
    consumer = Consumer(settings.input_consumer_config())
    producer = Producer(settings.producer_config())
    producer.init_transactions(30)
    consumer.subscribe([src])

    def copy(m: Message, _topic: str, partition: int, _offset: int) -> None:
        producer.produce(dst, m.value(), m.key(), partition=partition)

    r = transactional_loop(settings, consumer, [producer], expected, copy)
    consumer.close()
    return {
        "records": r.records,
        "seconds": round(r.seconds, 3),
        "records_per_s": round(r.records / r.seconds, 1),
        "transactions": r.transactions,
        "mean_batch": round(r.records / max(r.transactions, 1), 1),
    }


def passthrough_case(settings: ProcessorSettings, records: int) -> dict[str, float]:
    """Create `<prefix>-pt.in/out` with the settings' partitions, preload `records`, pass them
    through with the settings' batch and commit interval, drop the topics."""
    settings = settings.model_copy(
        update={"instance_id": "passthrough", "group_id": f"{settings.topic_prefix}-passthrough"}
    )
    admin = AdminClient(admin_config(settings))
    src, dst = f"{settings.topic_prefix}-pt.in", f"{settings.topic_prefix}-pt.out"
    for f in admin.create_topics([NewTopic(t, settings.partitions, 1) for t in (src, dst)]).values():
        f.result()
    try:
        preload(settings, src, records)
        return passthrough(settings, src, dst, records)
    finally:
        for f in admin.delete_topics([src, dst]).values():
            try:
                f.result()
            except Exception as e:  # cleanup only
                print(f"cleanup: {e}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--commit-interval-ms", type=int, default=50)
    args = ap.parse_args()
    settings = ProcessorSettings(
        topic_prefix=f"bench{uuid.uuid4().hex[:6]}",
        partitions=args.partitions,
        batch_size=args.batch_size,
        commit_interval_ms=args.commit_interval_ms,
    )
    result = passthrough_case(settings, args.records)
    print(
        orjson.dumps(
            {
                "bench": "passthrough",
                "partitions": args.partitions,
                "batch_size": args.batch_size,
                "commit_interval_ms": args.commit_interval_ms,
                **result,
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    )


if __name__ == "__main__":
    main()
