"""Runtime peers on one workload: a keyed fold (per key: count and sum), exactly-once.

Per round (its own topic prefix): N records over K keys are pre-produced once to
`<p>.commands` (key = the fold key, JSON value `{"k", "v"}`); then each peer, as its own
process, folds that same stream and emits every new aggregate to its output topic:

    runfold      the processor's transaction loop + RocksDB stores (benchmarks/peers/runfold_fold.py)
    quix         Quix Streams, exactly-once, stateful apply    (benchmarks/peers/quix_fold.py)
    faust        faust-streaming, exactly_once, RocksDB Table  (benchmarks/peers/faust_fold.py)

Throughput = N / (time the N-th output record became visible to a read_committed reader
- time the peer folded its first record): start-up and group join are excluded, the final
commit is included (an exactly-once output does not exist before its commit). After a
peer is stopped its output is read again from the start and checked: exactly N outputs,
and the last aggregate of every key equals the expected count and sum (`correct` = 1).
A peer that crashes, times out or duplicates is recorded with its error text.

    runfold bench keyed-fold [--records 200000] [--keys 1000] [--rounds 3] [--peers runfold,quix,faust]
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.harness import Bench, RoundContext, delete_topics_containing, error_text, spawn_log
from processors.kafka.records import coordinates
from topology.admin import create_topology
from topology.settings import KafkaSettings, admin_config, consumer_config, producer_config

# name -> (peer program, its settings). The first three are the comparison the targets are
# about (each at its own defaults); the others show the commit-interval trade-off on both sides.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "runfold": ("runfold", {}),  # processor defaults: batch 500, commit interval 50 ms
    "quix": ("quix", {}),  # Quix default commit interval 5 s
    "faust": ("faust", {}),  # Faust default commit interval 2.8 s
    "runfold-batch2000": ("runfold", {"batch_size": 2000, "commit_interval_ms": 200}),
    "quix-commit50ms": ("quix", {"commit_interval_s": 0.05}),
    # the physical limit: raw transactional consume -> produce with the processor's batch/commit rule
    "passthrough": ("passthrough", {}),
}
PEERS = ("passthrough", "runfold", "quix", "faust", "runfold-batch2000")
Expected = dict[str, tuple[int, int]]


def preproduce(settings: KafkaSettings, topic: str, records: int, keys: int) -> Expected:
    """N records round-robin over K keys, values 0..96; returns the expected (count, sum) per key."""
    p = Producer(producer_config(settings, linger_ms=20))
    expected: dict[str, list[int]] = {}
    for i in range(records):
        k = f"k{i % keys:05d}"
        v = (i * 7919) % 97
        e = expected.setdefault(k, [0, 0])
        e[0] += 1
        e[1] += v
        value = orjson.dumps({"k": k, "v": v})
        while True:
            try:
                p.produce(topic, value, k.encode())
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("pre-produce: records still unsent after 60 s")
    return {k: (c, s) for k, (c, s) in expected.items()}


class OutputWatch:
    """A read_committed reader counting a peer's output while it runs."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.consumer = Consumer(
            consumer_config(settings, f"{settings.topic_prefix}-watch-{topic}", fetch_wait_max_ms=10)
        )
        self.consumer.subscribe([topic])
        self.count = 0
        self.last_at = 0.0

    def until(self, n: int, timeout: float, alive: Callable[[], str | None]) -> str | None:
        """Poll until `n` outputs were seen; an error text on timeout or a dead peer."""
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                return f"timeout: {self.count}/{n} outputs after {timeout:.0f} s"
            msgs = self.consumer.consume(2000, 0.2)
            ok = sum(1 for m in msgs if m.error() is None)
            if ok:
                self.count += ok
                self.last_at = time.time()
            elif (dead := alive()) is not None:
                return dead
        return None

    def close(self) -> None:
        self.consumer.close()


def check_output(settings: KafkaSettings, topic: str, expected: Expected) -> dict[str, Any]:
    """Read the whole output (read_committed) and compare the last aggregate per key."""
    c = Consumer(
        consumer_config(settings, f"{settings.topic_prefix}-check-{topic}", enable_partition_eof=True)
    )
    md = c.list_topics(topic, timeout=10).topics[topic]
    parts = len(md.partitions)
    c.subscribe([topic])
    last: dict[str, dict[str, int]] = {}
    n = 0
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    while len(eof) < parts and time.monotonic() < deadline:
        for m in c.consume(5000, 0.5):
            err = m.error()
            if err is not None:
                if err.code() == -191 and (p := m.partition()) is not None:  # _PARTITION_EOF
                    eof.add(p)
                continue
            eof.discard(coordinates(m)[1])
            value = m.value()
            if value is None:
                continue
            rec = orjson.loads(value)
            last[rec["key"]] = rec
            n += 1
    c.close()
    wrong = [
        k
        for k, (cnt, s) in expected.items()
        if k not in last or last[k]["count"] != cnt or last[k]["sum"] != s
    ]
    total = sum(cnt for cnt, _ in expected.values())
    return {
        "outputs": n,
        "duplicates": max(0, n - total),
        "missing_outputs": max(0, total - n),
        "keys_wrong": len(wrong),
        "correct": int(not wrong and n == total),
        "example_wrong": (
            {"key": wrong[0], "expected": expected[wrong[0]], "got": last.get(wrong[0])} if wrong else None
        ),
    }


def _peer_cmd(
    kind: str,
    opts: dict[str, Any],
    prefix: str,
    input_topic: str,
    output: str,
    state: Path,
    first: Path,
    partitions: int,
) -> list[str]:
    py = [sys.executable, "-m"]
    if kind == "runfold":
        cmd = [
            *py,
            "benchmarks.peers.runfold_fold",
            "--prefix",
            prefix,
            "--state-dir",
            str(state),
            "--first-file",
            str(first),
        ]
        for opt in ("batch_size", "commit_interval_ms"):
            if opts.get(opt):
                cmd += [f"--{opt.replace('_', '-')}", str(opts[opt])]
        return cmd
    common = [
        "--prefix",
        prefix,
        "--input",
        input_topic,
        "--output",
        output,
        "--state-dir",
        str(state),
        "--first-file",
        str(first),
    ]
    if opts.get("commit_interval_s") is not None:
        common += ["--commit-interval-s", str(opts["commit_interval_s"])]
    if kind == "quix":
        return [*py, "benchmarks.peers.quix_fold", *common]
    return [*py, "benchmarks.peers.faust_fold", *common, "--partitions", str(partitions)]


def run_passthrough(settings: KafkaSettings, records: int, input_topic: str) -> dict[str, Any]:
    """benchmarks/passthrough_bench.py's loop on this round's input (its own group and output)."""
    from benchmarks.passthrough_bench import passthrough
    from processors.runtime.settings import ProcessorSettings

    output = f"{settings.topic_prefix}.passthrough-out"
    ps = ProcessorSettings(
        bootstrap_servers=settings.bootstrap_servers,
        topic_prefix=settings.topic_prefix,
        group_id=f"{settings.topic_prefix}-passthrough",
        instance_id="passthrough",
    )
    r = passthrough(ps, input_topic, output, records)
    c = Consumer(consumer_config(settings, f"{settings.topic_prefix}-check-pt"))
    c.subscribe([output])
    n, quiet = 0, time.monotonic() + 5
    while time.monotonic() < quiet:
        got = sum(1 for m in c.consume(5000, 0.5) if m.error() is None)
        n += got
        if got:
            quiet = time.monotonic() + 2
    c.close()
    return {
        "seconds": r["seconds"],
        "records_per_s": r["records_per_s"],
        "transactions": r["transactions"],
        "outputs": n,
        "duplicates": max(0, n - records),
        "correct": int(n == records),
    }


def run_peer(
    name: str, settings: KafkaSettings, expected: Expected, records: int, timeout: float, input_topic: str
) -> dict[str, Any]:
    kind, opts = VARIANTS[name]
    if kind == "passthrough":
        return run_passthrough(settings, records, input_topic)
    t = settings.topic_prefix
    output = f"{t}.run-events" if kind == "runfold" else f"{t}.{name}-out"
    work = Path(tempfile.mkdtemp(prefix=f"kf-{name}-"))
    first = work / "first"
    log = spawn_log(f"keyed_fold-{name}")
    watch = OutputWatch(settings, output)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }
    with log.open("wb") as lf:
        proc = subprocess.Popen(
            _peer_cmd(kind, opts, t, input_topic, output, work / "state", first, settings.partitions),
            env=env,
            stdout=lf,
            stderr=subprocess.STDOUT,
        )

    def alive() -> str | None:
        if proc.poll() is None:
            return None
        return f"peer exited with code {proc.returncode}: {log.read_text(errors='replace')[-1500:]}"

    try:
        problem = watch.until(records, timeout, alive)
        end = watch.last_at
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        watch.close()
    result: dict[str, Any] = {}
    started = float(first.read_text()) if first.exists() else None
    if problem is None and started is not None:
        result["seconds"] = round(end - started, 3)
        result["records_per_s"] = round(records / max(end - started, 1e-6), 1)
    elif problem is None:
        problem = "peer produced outputs but never recorded its first fold"
    try:
        result.update(check_output(settings, output, expected))
    except Exception as e:
        result["check_error"] = error_text(e)
    if problem is not None:
        result["error"] = problem
        result["correct"] = 0
    shutil.rmtree(work, ignore_errors=True)
    return result


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    p = ctx.params
    records = max(1000, p["records"] // 10) if ctx.warmup else p["records"]
    base = KafkaSettings(topic_prefix=ctx.prefix, partitions=p["partitions"])
    # Each runfold variant needs its own topology (its input is <prefix>.commands, its output
    # <prefix>.run-events); the peers read the first variant's input topic.
    prefixes: dict[str, str] = {}
    for name in p["peers"]:
        if VARIANTS[name][0] == "runfold":
            prefixes[name] = (
                ctx.prefix if ctx.prefix not in prefixes.values() else f"{ctx.prefix}v{len(prefixes)}"
            )
    for pre in {ctx.prefix, *prefixes.values()}:
        create_topology(KafkaSettings(topic_prefix=pre, partitions=p["partitions"]))
    # A peer too slow for the full stream in a bounded round folds its first `limit` records
    # (the same generator, so the same prefix of the same stream), from its own input topic.
    limits = {
        name: min(records, n if not ctx.warmup else max(500, n // 10))
        for name, n in (p.get("peer_records") or {}).items()
        if name in p["peers"]
    }
    new_topics = [
        NewTopic(f"{ctx.prefix}.{name}-out", p["partitions"], 1)
        for name in p["peers"]
        if name not in prefixes
    ]
    new_topics += [NewTopic(f"{ctx.prefix}.{name}-in", p["partitions"], 1) for name in limits]
    admin = AdminClient(admin_config(base))  # kept referenced until the futures resolve
    if new_topics:
        for f in admin.create_topics(new_topics).values():
            f.result()
    out: dict[str, dict[str, Any]] = {}
    try:
        t0 = time.perf_counter()
        expected = preproduce(base, f"{ctx.prefix}.commands", records, p["keys"])
        ctx.log(f"pre-produced {records} records over {p['keys']} keys in {time.perf_counter() - t0:.1f} s")
        inputs = {name: (ctx.prefix, f"{ctx.prefix}.commands", records, expected) for name in p["peers"]}
        for name, pre in prefixes.items():
            if pre != ctx.prefix:
                inputs[name] = (
                    pre,
                    f"{pre}.commands",
                    records,
                    preproduce(base, f"{pre}.commands", records, p["keys"]),
                )
        for name, n in limits.items():
            topic = f"{ctx.prefix}.{name}-in"
            inputs[name] = (ctx.prefix, topic, n, preproduce(base, topic, n, p["keys"]))
        for name in p["peers"]:
            pre, topic, n, exp = inputs[name]
            try:
                settings = KafkaSettings(topic_prefix=pre, partitions=p["partitions"])
                out[name] = run_peer(name, settings, exp, n, p["timeout_s"], topic)
                out[name]["records"] = n
            except Exception as e:
                out[name] = {"error": error_text(e), "correct": 0}
            ctx.log(f"{name}: {out[name]}")
    finally:
        delete_topics_containing(ctx.prefix)
    return out


def run(
    records: int = 200_000,
    keys: int = 1000,
    partitions: int = 2,
    rounds: int = 3,
    warmup: int = 1,
    peers: tuple[str, ...] = PEERS,
    timeout_s: float = 300.0,
    peer_records: dict[str, int] | None = None,
) -> Bench:
    bad = [x for x in peers if x not in VARIANTS]
    if bad:
        raise ValueError(f"unknown peers {bad}; choose from {list(VARIANTS)}")
    bench = Bench(
        "keyed_fold",
        params={
            "records": records,
            "keys": keys,
            "partitions": partitions,
            "peers": list(peers),
            "timeout_s": timeout_s,
            "variants": {n: VARIANTS[n] for n in peers},
            "peer_records": peer_records or {},
        },
        rounds=rounds,
        warmup=warmup,
    )
    bench.notes.append(
        "runfold: processor defaults (batch 500, commit interval 50 ms); quix and faust: their "
        "own default commit intervals (5 s, 2.8 s); variants named after their settings"
    )
    for peer, n in (peer_records or {}).items():
        if n < records:
            bench.notes.append(
                f"{peer} folds the first {n:,} records of the same stream (it is too slow for "
                f"{records:,} in a bounded round); records/s compares rates, not totals"
            )
    bench.run(round_fn)
    if "runfold" in peers:
        for peer, target in (("passthrough", None), ("quix", 2.0), ("faust", 5.0), ("quix-commit50ms", None)):
            if peer in peers:
                bench.ratio(f"runfold_vs_{peer}", "runfold", peer, "records_per_s", target)
    if "runfold-batch2000" in peers:
        for peer, target in (("quix", 2.0), ("faust", 5.0)):
            if peer in peers:
                bench.ratio(
                    f"runfold-batch2000_vs_{peer}", "runfold-batch2000", peer, "records_per_s", target
                )
    bench.save(plot=[("keyed fold records/s (exactly-once)", "records_per_s")])
    return bench


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--faust-records", type=int, default=20_000)
    a = ap.parse_args()
    b = run(
        a.records,
        a.keys,
        rounds=a.rounds,
        warmup=a.warmup,
        peers=tuple(a.peers.split(",")),
        peer_records={"faust": a.faust_records},
    )
    print(b.table(["records_per_s", "correct", "duplicates"]))
    print(orjson.dumps(b.ratios, option=orjson.OPT_INDENT_2).decode())
