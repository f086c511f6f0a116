"""Workflow throughput: completed runs/s and run events/s, 3 no-op steps, 1 and 2 processors.

Separate processes, as in production: the processor(s) (`python -m processors.runtime`), one
action worker serving the built-in `noop` action (`python -m processors.cli.worker worker`),
and a load generator (this module, `--role loadgen`) that produces the StartRun commands.
The harness process only reads `<p>.run-events` read_committed and times it:

    runs/s   = runs / (last terminal event seen - first run event seen)
    events/s = run events in that window / its length

`Rig` (topology, definitions, processes, readiness, teardown) is shared with latency.py.

    runfold bench workflow-throughput [--runs 5000] [--processors 1,2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from benchmarks.harness import Bench, RoundContext, delete_topics_containing, error_text, spawn_log
from schemas import Codec
from topology.admin import create_topology
from topology.settings import KafkaSettings, admin_config, consumer_config, producer_config

CODEC = Codec.default()
TERMINAL = frozenset({"RunSucceeded", "RunFailed", "RunCancelled"})


def noop_definition(wid: str, steps: int) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(steps)]
    return {
        "schema": "runfold.workflow/v1",
        "id": wid,
        "revision": 1,
        "state": {},
        "entry": [names[0]],
        "nodes": {n: {"kind": "action", "action": "noop"} for n in names},
        "routes": {a: [b] for a, b in itertools.pairwise(names)},
    }


DEFINITIONS = [
    noop_definition("noop-1", 1),
    noop_definition("noop-3", 3),
    {
        "schema": "runfold.workflow/v1",
        "id": "sleep-long",
        "revision": 1,
        "state": {},
        "entry": ["s"],
        "nodes": {"s": {"kind": "sleep", "duration_ms": 24 * 3600 * 1000}},
        "routes": {},
    },
]


def _env(settings: KafkaSettings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    return {
        **env,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        **extra,
    }


class Rig:
    """Topology + definitions + N processor processes + one noop worker, for one topic prefix."""

    def __init__(
        self,
        prefix: str,
        partitions: int = 4,
        processors: int = 1,
        commit_interval_ms: int | None = None,
        batch_size: int | None = None,
        worker_concurrency: int = 256,
        worker: bool = True,
        metrics: bool = False,
    ) -> None:
        self.settings = KafkaSettings(topic_prefix=prefix, partitions=partitions)
        self.n_processors = processors
        self.commit_interval_ms = commit_interval_ms
        self.batch_size = batch_size
        self.worker_concurrency = worker_concurrency
        self.with_worker = worker
        self.metrics = metrics
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"rig-{prefix}-"))
        self.log = spawn_log(f"rig-{prefix}")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.metrics_ports: list[int] = []

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> Rig:
        create_topology(self.settings)
        register(self.settings)
        for i in range(self.n_processors):
            self.spawn_processor(f"p{i}")
        if self.with_worker:
            self.spawn_worker()
        self.wait_stable(f"{self.settings.topic_prefix}-processor", self.n_processors, timeout)
        return self

    def spawn_processor(self, instance: str) -> subprocess.Popen[bytes]:
        args = [
            sys.executable,
            "-m",
            "processors.runtime",
            "--instance-id",
            instance,
            "--state-dir",
            str(self.state_dir / instance),
            "--log-level",
            "WARNING",
        ]
        if self.commit_interval_ms:
            args += ["--commit-interval-ms", str(self.commit_interval_ms)]
        if self.batch_size:
            args += ["--batch-size", str(self.batch_size)]
        if self.metrics:
            port = _free_port()
            self.metrics_ports.append(port)
            args += ["--metrics-port", str(port)]
        proc = self._spawn(args)
        self.procs[instance] = proc
        return proc

    def spawn_worker(self) -> None:
        self.procs["worker"] = self._spawn(
            [
                sys.executable,
                "-m",
                "processors.cli.worker",
                "worker",
                "--queue",
                "default",
                "--concurrency",
                str(self.worker_concurrency),
                "--log-level",
                "WARNING",
            ]
        )

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as lf:
            return subprocess.Popen(args, env=_env(self.settings), stdout=subprocess.DEVNULL, stderr=lf)

    def wait_stable(self, group: str, members: int, timeout: float) -> None:
        """Until the group is Stable with `members` members that all hold partitions."""
        admin = AdminClient(admin_config(self.settings))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {self.tail()}")
            try:
                desc = admin.describe_consumer_groups([group])[group].result(10)
                assigned = [m for m in desc.members if m.assignment and m.assignment.topic_partitions]
                if str(desc.state).endswith("STABLE") and len(assigned) == members:
                    return
            except Exception:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"group {group} not stable with {members} members in {timeout}s: {self.tail()}")

    def alive(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return f"{name} exited with {proc.returncode}: {self.tail()}"
        return None

    def tail(self, n: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, delete: bool = True) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if delete:
            delete_topics_containing(self.settings.topic_prefix, self.settings.bootstrap_servers)
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- load ------------------------------------------------------------------------------
    def loadgen(
        self, definition: str, runs: int, rate: float = 0.0, tag: str = "r", warmup: int = 0
    ) -> subprocess.Popen[bytes]:
        """A load-generator process: `runs` StartRun commands, `rate` runs/s (0 = as fast as possible),
        after `warmup` unstamped ones (see `loadgen`)."""
        return self._spawn(
            [
                sys.executable,
                "-m",
                "benchmarks.workflow_throughput",
                "--role",
                "loadgen",
                "--definition",
                definition,
                "--runs",
                str(runs),
                "--rate",
                str(rate),
                "--tag",
                tag,
                "--warmup",
                str(warmup),
            ]
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def register(settings: KafkaSettings) -> None:
    from processors.client import RunClient

    with RunClient(settings) as client:
        for d in DEFINITIONS:
            client.register(d)


def run_id_for(tag: str, i: int, sent_ms: int) -> str:
    """The send time rides in the run id, so any reader can compute start → terminal latency."""
    return f"{tag}-{i}-{sent_ms}"


def sent_ms_of(run_id: str) -> int:
    return int(run_id.rsplit("-", 1)[1])


def loadgen(definition: str, runs: int, rate: float, tag: str, warmup: int = 0) -> None:
    """`warmup` > 0: first send that many unstamped runs (`<tag>warm-<i>-<ms>`) and wait for their
    delivery, so the timed runs do not pay for the new producer's start (its producer id arrives
    ~0.5 s after creation, librdkafka's PID timer): that made the first ~40 runs of a latency case
    up to 0.5 s slower."""
    settings = KafkaSettings()
    p = Producer(producer_config(settings, linger_ms=0 if rate else 5))
    enc = CODEC.encoder("commands")
    topic = f"{settings.topic_prefix}.commands"

    def start(run_tag: str, i: int) -> None:
        now = time.time_ns() // 1_000_000
        rid = run_id_for(run_tag, i, now)
        value = enc(
            {
                "type": "StartRun",
                "run_id": rid,
                "ts_ms": now,
                "record_id": uuid.uuid4().hex,
                "definition_id": definition,
                "revision": None,
                "input": {},
            }
        )
        while True:
            try:
                p.produce(topic, value, rid.encode())
                break
            except BufferError:
                p.poll(0.05)

    if warmup:
        for i in range(warmup):
            start(f"{tag}warm", i)
        p.flush(60)
    t0 = time.perf_counter()
    for i in range(runs):
        if rate:
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        start(tag, i)
        p.poll(0)
    p.flush(60)


def _zigzag(b: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        x = b[i]
        i += 1
        result |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return (result >> 1) ^ -(result & 1), i


def body_branch(value: bytes) -> int:
    """The union branch of a run-event's body, read from the Avro bytes without decoding the
    record (envelope: schema_version, record_id, run_id, ts_ms, sequence, body)."""
    i = 10  # single-object header: 2 magic bytes + 8-byte schema fingerprint
    _, i = _zigzag(value, i)
    n, i = _zigzag(value, i)
    n2, i = _zigzag(value, i + n)
    _, i = _zigzag(value, i + n2)
    _, i = _zigzag(value, i)
    return _zigzag(value, i)[0]


def _terminal_branches() -> frozenset[int]:
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "cost_micros": 0}
    base: dict[str, Any] = {"run_id": "r", "ts_ms": 0, "record_id": "x", "sequence": 1, "usage": zero}
    samples: list[dict[str, Any]] = [
        {"type": "RunSucceeded", "output": None},
        {"type": "RunCancelled", "reason": ""},
        {
            "type": "RunFailed",
            "failure": {"code": "Timeout", "message": "", "retryable": False, "node": None, "lineage": None},
        },
    ]
    return frozenset(body_branch(CODEC.encode("run_events", {**base, **s})) for s in samples)


TERMINAL_BRANCHES = _terminal_branches()


class EventWatch:
    """Reads `<p>.run-events` read_committed from the beginning: counts, terminal times."""

    def __init__(self, settings: KafkaSettings, offset_reset: str = "earliest") -> None:
        self.consumer = Consumer(
            consumer_config(
                settings,
                f"{settings.topic_prefix}-watch-{uuid.uuid4().hex[:6]}",
                fetch_wait_max_ms=5,
                auto_offset_reset=offset_reset,
            )
        )
        self.consumer.subscribe([f"{settings.topic_prefix}.run-events"])
        self.decode = CODEC.decoder("run_events")
        self.events = 0
        self.first_at: float | None = None
        self.terminal: dict[str, float] = {}  # run id -> wall time its terminal event was seen
        self.last_terminal_at = 0.0

    def wait_assigned(self, timeout: float = 20) -> None:
        """Until partitions are assigned and their start positions known (with `latest`, records
        produced before the position is looked up would be skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assigned = self.consumer.assignment()
            if assigned and all(tp.offset >= 0 for tp in self.consumer.position(assigned)):
                return
            self.consumer.poll(0.1)

    def poll(self, timeout: float = 0.1) -> int:
        # Block only for the first record, then take what is buffered: consume(n, timeout)
        # waits for n records or the timeout, which added up to `timeout` to every latency.
        first = self.consumer.poll(timeout)
        msgs = [first, *self.consumer.consume(2000, 0)] if first is not None else []
        now = time.time()
        n = 0
        for m in msgs:
            if m.error() is not None:
                continue
            n += 1
            value, key = m.value(), m.key()
            if value is None or key is None:
                continue
            if body_branch(value) in TERMINAL_BRANCHES:  # decode only terminal events
                self.terminal[key.decode()] = now
                self.last_terminal_at = now
        if n:
            self.events += n
            if self.first_at is None:
                self.first_at = now
        return n

    def until_terminal(self, n: int, timeout: float, alive: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while len(self.terminal) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.terminal)}/{n} runs terminal after {timeout:.0f} s")
            if not self.poll(0.2) and alive is not None and (dead := alive()) is not None:
                raise RuntimeError(dead)

    def close(self) -> None:
        self.consumer.close()


def measure(ctx: RoundContext, processors: int, runs: int) -> dict[str, Any]:
    p = ctx.params
    prefix = f"{ctx.prefix}x{processors}"
    with Rig(prefix, partitions=p["partitions"], processors=processors) as rig:
        watch = EventWatch(rig.settings)
        try:
            gen = rig.loadgen("noop-3", runs)
            watch.until_terminal(runs, p["timeout_s"], rig.alive)
            gen.wait(30)
            t0 = watch.first_at or time.time()
            span = max(watch.last_terminal_at - t0, 1e-6)
            return {
                "runs": runs,
                "seconds": round(span, 3),
                "runs_per_s": round(runs / span, 1),
                "events": watch.events,
                "events_per_s": round(watch.events / span, 1),
                "events_per_run": round(watch.events / runs, 2),
            }
        finally:
            watch.close()


def round_fn(ctx: RoundContext) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    runs = max(200, ctx.params["runs"] // 5) if ctx.warmup else ctx.params["runs"]
    for n in ctx.params["processors"]:
        case = f"{n} processor{'s' if n > 1 else ''}"
        try:
            out[case] = measure(ctx, n, runs)
        except Exception as e:
            out[case] = {"error": error_text(e)}
    return out


def run(
    runs: int = 5000,
    processors: tuple[int, ...] = (1, 2),
    partitions: int = 4,
    rounds: int = 3,
    warmup: int = 1,
    timeout_s: float = 300.0,
) -> Bench:
    bench = Bench(
        "workflow_throughput",
        params={
            "runs": runs,
            "processors": list(processors),
            "partitions": partitions,
            "timeout_s": timeout_s,
            "workflow": "noop-3 (3 sequential noop actions)",
            "worker": "1 process, noop, concurrency 256",
        },
        rounds=rounds,
        warmup=warmup,
    )
    bench.notes.append(
        "processor defaults: batch 500, commit interval 50 ms; one shared 2-core host runs "
        "broker, processors, worker, load generator and reader"
    )
    bench.run(round_fn)
    if 1 in processors and 2 in processors:
        bench.ratio("2_vs_1_processors", "2 processors", "1 processor", "runs_per_s")
    bench.save(plot=[("completed runs/s", "runs_per_s"), ("run events/s", "events_per_s")])
    return bench


def max_runs_per_s(default: float | None = None) -> float | None:
    """The 1-processor median of the last saved workflow_throughput result (for latency.py)."""
    import orjson

    from benchmarks.harness import results_dir

    path = results_dir() / "workflow_throughput.json"
    if not path.exists():
        return default
    data = orjson.loads(path.read_bytes())
    s = data.get("summary", {}).get("1 processor", {}).get("runs_per_s")
    return float(s["median"]) if s else default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", choices=["bench", "loadgen"], default="bench")
    ap.add_argument("--definition", default="noop-3")
    ap.add_argument("--runs", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--tag", default="r")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if a.role == "loadgen":
        loadgen(a.definition, a.runs, a.rate, a.tag, a.warmup)
        return
    b = run(a.runs, rounds=a.rounds)
    print(b.table(["runs_per_s", "events_per_s"]))


if __name__ == "__main__":
    main()


class CommittedEvents:
    """A read_committed reader of a prefix's run events from the start, for timing benchmarks:
    `poll()` gives the decoded events that arrived and the wall time they were read at."""

    def __init__(self, settings: KafkaSettings, purpose: str) -> None:
        self.consumer = Consumer(
            consumer_config(
                settings,
                f"{settings.topic_prefix}-{purpose}-{uuid.uuid4().hex[:6]}",
                fetch_wait_max_ms=5,
                auto_offset_reset="earliest",
            )
        )
        self.consumer.subscribe([f"{settings.topic_prefix}.run-events"])
        self.decode = CODEC.decoder("run_events")

    def poll(self, timeout: float = 0.05) -> tuple[float, list[dict[str, Any]]]:
        first = self.consumer.poll(timeout)
        msgs = [first, *self.consumer.consume(1000, 0)] if first is not None else []
        now = time.time()
        return now, [self.decode(m.value()) for m in msgs if m.error() is None and m.value() is not None]

    def close(self) -> None:
        self.consumer.close()
