"""Run processor benchmark on a real broker, with an instant executor (real Kafka traffic).

    passthrough: first, in the same run and with the same partitions, batch size, commit
                interval and client settings, a raw confluent-kafka transactional
                consume → produce loop over max(4N, 40000) records (`passthrough_bench.py`): the
                ceiling the fold is compared with (`fold_vs_passthrough`).
    throughput: N StartRun for a 3-step no-op workflow are preloaded; `--processors` processor
                subprocesses (`python -m processors.runtime`) fold them while a responder
                subprocess answers every activation at once. Reports completed runs/s, input
                records/s (1 command + 3 receipts per run), output records/s and the
                processors' CPU per input record, from the processors' metrics.
    latency:    a 1-step workflow started at a fixed rate (default: 25% of the throughput
                just measured, in runs/s); start → RunSucceeded latency per run, measured
                from the StartRun send time to the committed terminal event reaching a
                read_committed reader. Reports p50/p90/p99.

    .venv/bin/python benchmarks/processor_bench.py [--runs 3000] [--processors 1] [--latency-seconds 15] [--rate R]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

from processors.engine import Catalog
from processors.engine.catalog import content_hash
from processors.runtime.settings import ProcessorSettings
from schemas import Codec
from topology.admin import create_topology, delete_topology
from topology.settings import consumer_config, producer_config

sys.path.insert(0, str(Path(__file__).parent))
from passthrough_bench import passthrough_case  # a sibling script, not a package

CODEC = Codec.default()
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}


def _action(name: str) -> dict[str, Any]:
    return {"kind": "action", "action": name, "writes": {name: {"from": "output"}}}


DEFINITIONS = [
    {
        "schema": "runfold.workflow/v1",
        "id": "bench3",
        "revision": 1,
        "entry": ["a"],
        "nodes": {"a": _action("a"), "b": _action("b"), "c": _action("c")},
        "routes": {"a": ["b"], "b": ["c"]},
        "state": {"a": None, "b": None, "c": None},
    },
    {
        "schema": "runfold.workflow/v1",
        "id": "bench1",
        "revision": 1,
        "entry": ["a"],
        "nodes": {"a": _action("a")},
        "routes": {},
        "state": {"a": None},
    },
    {
        "schema": "runfold.workflow/v1",
        "id": "benchsleep",
        "revision": 1,
        "entry": ["s"],
        "nodes": {"s": {"kind": "sleep", "duration_ms": 500}},
        "routes": {},
        "state": {},
    },
]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def register(settings: ProcessorSettings) -> None:
    p = Producer(producer_config(settings))
    cat = Catalog()
    for raw in DEFINITIONS:
        d = cat.register(raw)
        rec = {
            "definition_id": d.id,
            "revision": d.revision,
            "content_hash": content_hash(d),
            "definition": raw,
            "registered_ms": now_ms(),
        }
        p.produce(
            settings.topics.definitions, CODEC.encode("definitions", rec), f"{d.id}@{d.revision}".encode()
        )
    p.flush(10)


def start_command(run_id: str, definition: str) -> bytes:
    return CODEC.encode(
        "commands",
        {
            "type": "StartRun",
            "run_id": run_id,
            "ts_ms": now_ms(),
            "record_id": uuid.uuid4().hex,
            "definition_id": definition,
            "revision": None,
            "input": {},
        },
    )


def _produce(p: Producer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            p.produce(topic, value, key)
            return
        except BufferError:
            p.poll(0.05)


# ---- roles run as subprocesses -------------------------------------------------------------
def responder(settings: ProcessorSettings) -> None:
    """Answer every ActionActivation immediately with ActivationCompleted."""
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    dec = CODEC.decoder("activations")
    enc = CODEC.encoder("receipts")
    c = Consumer(consumer_config(settings, f"{settings.topic_prefix}-bench-responder"))
    c.subscribe([settings.topics.activations("default")])
    p = Producer(producer_config(settings, linger_ms=1))
    receipts = settings.topics.receipts
    while not stop:
        # poll blocks only until the first record; consume(n, timeout) would wait for n records
        first = c.poll(0.05)
        for m in [first, *c.consume(499, 0)] if first is not None else []:
            if m.error() is not None:
                continue
            a = dec(m.value())
            if a["type"] != "ActionActivation":
                continue
            r = {
                "type": "ActivationCompleted",
                "run_id": a["run_id"],
                "ts_ms": now_ms(),
                "record_id": a["dispatch_id"],
                "node": a["node"],
                "lineage": a["lineage"],
                "attempt": a["attempt"],
                "dispatch_id": a["dispatch_id"],
                "worker_id": "bench",
                "output": {"ok": True},
                "usage": ZERO,
            }
            key = m.key()
            assert key is not None  # run events are keyed by run id
            _produce(p, receipts, enc(r), key)
        p.poll(0)
    p.flush(10)
    c.close()


def spawn(
    settings: ProcessorSettings, role: str, log: Any, metrics_port: int = 0, instance: int = 0
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "RUNFOLD_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
    }
    if role == "processor":
        # one state directory per instance: two processes must never open the same RocksDB
        state_dir = settings.state_dir if instance == 0 else settings.state_dir / f"i{instance}"
        args = [
            sys.executable,
            "-m",
            "processors.runtime",
            "--instance-id",
            f"bench-{instance}" if instance else "bench",
            "--state-dir",
            str(state_dir),
            "--metrics-port",
            str(metrics_port),
            "--batch-size",
            str(settings.batch_size),
            "--commit-interval-ms",
            str(settings.commit_interval_ms),
        ]
    else:
        args = [sys.executable, __file__, "--role", role]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)


# ---- measurements --------------------------------------------------------------------------
def stop_rig(procs: list[subprocess.Popen[bytes]], settings: ProcessorSettings, state: str) -> None:
    """SIGTERM the rig's subprocesses (kill what is still up after 30 s), drop its topics and state."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    delete_topology(settings)
    subprocess.run(["rm", "-rf", state], check=False)


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(
            r"^(runfold_processor_records_in_total|runfold_processor_runs|"
            r"runfold_processor_transactions_total|runfold_processor_commit_seconds_sum|"
            r"runfold_processor_commit_seconds_count|runfold_processor_batch_records_sum|"
            r"runfold_processor_batch_records_count|runfold_processor_records_out_total|process_cpu_seconds_total|"
            r"runfold_processor_partitions_assigned|runfold_processor_partitions_restoring)(\{[^}]*\})? (\S+)$",
            line,
        )
        if m:
            out[m.group(1) + (m.group(2) or "")] = out.get(m.group(1) + (m.group(2) or ""), 0.0) + float(
                m.group(3)
            )
    return out


def scrape_all(ports: list[int]) -> dict[str, float]:
    """The processors' metrics, summed over instances."""
    out: dict[str, float] = {}
    for port in ports:
        for k, v in scrape(port).items():
            out[k] = out.get(k, 0.0) + v
    return out


def records_in(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("runfold_processor_records_in_total"))


def records_out(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("runfold_processor_records_out_total"))


def ready(settings: ProcessorSettings, ports: list[int], timeout: float = 60) -> dict[str, float]:
    """Wait until the processors own every partition and none is restoring; their metrics."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = scrape_all(ports)
        except OSError:
            m = {}
        if (
            m.get("runfold_processor_partitions_assigned", 0) >= settings.partitions
            and m.get("runfold_processor_partitions_restoring", 1) == 0
        ):
            return m
        time.sleep(0.25)
    raise SystemExit(f"processors not ready (all {settings.partitions} partitions assigned) in {timeout}s")


def throughput(settings: ProcessorSettings, runs: int, ports: list[int], timeout: float) -> dict[str, Any]:
    """Timed from the first StartRun sent (the processors are up and idle) to the last run
    counted succeeded. Scrapes every 0.25 s: each scrape costs the processor CPU too."""
    m0 = ready(settings, ports)
    t0, cpu0 = time.perf_counter(), m0.get("process_cpu_seconds_total", 0.0)
    p = Producer(producer_config(settings))
    for i in range(runs):
        _produce(p, settings.topics.commands, start_command(f"tp-{i}", "bench3"), f"tp-{i}".encode())
    p.flush(60)
    deadline = time.monotonic() + timeout
    succeeded = 0.0
    while time.monotonic() < deadline:
        try:
            m = scrape_all(ports)
        except OSError:
            time.sleep(0.25)
            continue
        succeeded = m.get('runfold_processor_runs{status="succeeded"}', 0.0)
        if succeeded >= runs:
            elapsed = time.perf_counter() - t0
            rin = records_in(m) - records_in(m0)
            txns = m.get('runfold_processor_transactions_total{outcome="committed"}', 0.0)
            cpu = m.get("process_cpu_seconds_total", 0.0) - cpu0
            rout = records_out(m) - records_out(m0)
            return {
                "processors": len(ports),
                "processor_cpu_s": round(cpu, 2),
                "processor_cpu_us_per_input": round(1e6 * cpu / max(rin, 1), 1),
                "output_records": int(rout),
                "output_records_per_s": round(rout / elapsed, 1),
                "runs": runs,
                "seconds": round(elapsed, 3),
                "runs_per_s": round(runs / elapsed, 1),
                "input_records": int(rin),
                "input_records_per_s": round(rin / elapsed, 1),
                "transactions": int(txns),
                "mean_batch": round(rin / max(txns, 1), 1),
            }
        time.sleep(0.25)
    raise SystemExit(f"throughput: only {succeeded}/{runs} runs succeeded in {timeout}s")


def commit_stats(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    def d(k: str) -> float:
        return after.get(k, 0.0) - before.get(k, 0.0)

    n = d("runfold_processor_commit_seconds_count")
    return {
        "transactions": int(n),
        "mean_commit_ms": round(1000 * d("runfold_processor_commit_seconds_sum") / max(n, 1), 1),
        "mean_batch": round(d("runfold_processor_batch_records_sum") / max(n, 1), 1),
    }


def latency(settings: ProcessorSettings, rate: float, seconds: float) -> dict[str, Any]:
    reader = Consumer(
        consumer_config(settings, f"{settings.topic_prefix}-bench-reader", auto_offset_reset="latest")
    )
    reader.subscribe([settings.topics.run_events])
    dec = CODEC.decoder("run_events")
    # join and get an assignment before the first start, so no terminal event is missed
    end = time.monotonic() + 15
    while not reader.assignment() and time.monotonic() < end:
        reader.poll(0.1)
    p = Producer(producer_config(settings, linger_ms=0))
    # Warm-up, not measured: the new producer's id and metadata, and the reader's first fetch
    # position, cost ~0.5 s on this machine, which would otherwise be the first runs' latency.
    warm = {f"lw-{k}" for k in range(5)}
    for rid in warm:
        _produce(p, settings.topics.commands, start_command(rid, "bench1"), rid.encode())
    p.flush(10)
    end = time.monotonic() + 15
    while warm and time.monotonic() < end:
        for m in reader.consume(200, 0.01):
            if m.error() is None and m.key() is not None:
                ev = dec(m.value())
                if ev["type"] == "RunSucceeded":
                    warm.discard(ev["run_id"])
    sent: dict[str, float] = {}
    done: dict[str, float] = {}
    n = int(rate * seconds)
    t_start = time.perf_counter()
    i = 0
    while i < n or (len(done) < n and time.perf_counter() - t_start < seconds + 20):
        now = time.perf_counter()
        while i < n and now - t_start >= i / rate:
            rid = f"lt-{i}"
            sent[rid] = time.time()
            _produce(p, settings.topics.commands, start_command(rid, "bench1"), rid.encode())
            i += 1
        p.poll(0)
        for m in reader.consume(200, 0.002):
            if m.error() is None:
                ev = dec(m.value())
                if ev["type"] == "RunSucceeded" and ev["run_id"] in sent:
                    done[ev["run_id"]] = time.time()
    reader.close()
    lat = sorted((done[r] - sent[r]) * 1000 for r in done)
    if not lat:
        raise SystemExit("latency: no run finished")

    def pct(q: float) -> float:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1)

    return {
        "rate_runs_per_s": round(rate, 1),
        "runs": n,
        "finished": len(lat),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(lat[-1], 1),
    }


def timer_lateness(settings: ProcessorSettings, runs: int, metrics_port: int) -> dict[str, Any]:
    """`runs` sleep-only runs (500 ms) started over ~2 s; lateness = fire time - due time."""
    before = scrape_lateness(metrics_port)
    p = Producer(producer_config(settings, linger_ms=0))
    for i in range(runs):
        _produce(p, settings.topics.commands, start_command(f"tm-{i}", "benchsleep"), f"tm-{i}".encode())
        p.poll(0)
        time.sleep(2.0 / runs)
    p.flush(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = scrape_lateness(metrics_port)
        if after["count"] - before["count"] >= runs:
            break
        time.sleep(0.2)
    n = after["count"] - before["count"]
    buckets = {le: after["buckets"][le] - before["buckets"].get(le, 0.0) for le in after["buckets"]}

    def pct(q: float) -> str:
        for le, c in sorted(buckets.items(), key=lambda kv: float(kv[0])):
            if c >= q * n:
                return f"<= {float(le) * 1000:g} ms"
        return "> max bucket"

    return {
        "timers_fired": int(n),
        "mean_ms": round(1000 * (after["sum"] - before["sum"]) / max(n, 1), 1),
        "p50": pct(0.5),
        "p99": pct(0.99),
    }


def scrape_lateness(port: int) -> dict[str, Any]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, Any] = {"sum": 0.0, "count": 0.0, "buckets": {}}
    for line in text.splitlines():
        if line.startswith("runfold_processor_timer_lateness_seconds_sum"):
            out["sum"] = float(line.split()[-1])
        elif line.startswith("runfold_processor_timer_lateness_seconds_count"):
            out["count"] = float(line.split()[-1])
        elif line.startswith("runfold_processor_timer_lateness_seconds_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le and le.group(1) != "+Inf":
                out["buckets"][le.group(1)] = float(line.split()[-1])
    return out


def _ratios(tp: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, float] | None:
    """Fold records/s over passthrough records/s: input records (the issue's figure) and
    output records (the fold writes ~5 records per input; the passthrough writes 1)."""
    if baseline is None:
        return None
    base = baseline["records_per_s"]
    return {
        "input_records": round(tp["input_records_per_s"] / base, 3),
        "output_records": round(tp["output_records_per_s"] / base, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["bench", "responder"], default="bench")
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--processors", type=int, default=1, help="processor instances in the group")
    ap.add_argument("--no-passthrough", action="store_true", help="skip the passthrough baseline")
    ap.add_argument("--passthrough-records", type=int, default=None, help="default max(4 x runs, 40000)")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--commit-interval-ms", type=int, default=50)
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument(
        "--rate", type=float, default=None, help="runs/s for the latency phase (default 25%% of max)"
    )
    ap.add_argument("--metrics-port", type=int, default=19310)
    ap.add_argument("--timer-runs", type=int, default=300, help="sleep runs for the timer lateness phase")
    args = ap.parse_args()
    if args.role == "responder":
        responder(ProcessorSettings())
        return
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    state = f"/tmp/runfold-bench-{prefix}"
    settings = ProcessorSettings(
        topic_prefix=prefix,
        partitions=args.partitions,
        state_dir=Path(state),
        batch_size=args.batch_size,
        commit_interval_ms=args.commit_interval_ms,
    )
    baseline = (
        None
        if args.no_passthrough
        else passthrough_case(settings, args.passthrough_records or max(4 * args.runs, 40_000))
    )
    create_topology(settings)
    register(settings)
    log = open(f"{state}.log", "wb")  # noqa: SIM115 - lives as long as the subprocesses
    ports = [args.metrics_port + i for i in range(args.processors)]
    procs = [spawn(settings, "processor", log, port, i) for i, port in enumerate(ports)]
    procs.append(spawn(settings, "responder", log))
    try:
        tp = throughput(settings, args.runs, ports, timeout=300)
        tp["commits"] = commit_stats({}, scrape_all(ports))
        rate = args.rate or max(1.0, tp["runs_per_s"] * 0.25)
        before = scrape(args.metrics_port)
        lt = latency(settings, rate, args.latency_seconds)
        lt["commits"] = commit_stats(before, scrape(args.metrics_port))
        tm = timer_lateness(settings, args.timer_runs, args.metrics_port)
    finally:
        stop_rig(procs, settings, state)
    print(
        orjson.dumps(
            {
                "bench": "processor",
                "partitions": args.partitions,
                "batch_size": args.batch_size,
                "commit_interval_ms": args.commit_interval_ms,
                "passthrough": baseline,
                "fold_vs_passthrough": _ratios(tp, baseline),
                "throughput_3_step": tp,
                "latency_1_step": lt,
                "timer_lateness": tm,
                "log": f"{state}.log",
            },
            option=orjson.OPT_INDENT_2,
        ).decode()
    )


if __name__ == "__main__":
    main()
