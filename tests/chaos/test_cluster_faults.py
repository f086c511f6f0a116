"""Broker faults on a local 3-node cluster (RF 3, min ISR 2, 6 partitions): noop3 runs at a
steady rate on two processors, a worker and the child executor, while

1. the broker that is the transaction coordinator of processor p1 is killed with SIGKILL, then
   restarted;
2. every broker is restarted in turn (a clean stop, then a start, waiting until its replicas
   are back in sync).

The proof is the chaos suite's (checks.prove: one terminal per run, no duplicate StepSucceeded,
no sequence gap, replay --verify clean) plus: no process exited (nothing restarted by hand).
The stall figures are printed and recorded: per fault, the longest time with no terminal event
in each partition and in the whole topic (as seen by a read_committed reader in this process),
and the p99 / max start-to-terminal latency of the runs started during it.

    .venv/bin/pytest -m chaos tests/chaos/test_cluster_faults.py -s   # ~2-3 minutes
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from checks import TERMINAL, prove
from confluent_kafka.admin import AdminClient
from fleet import Fleet
from processor_support import Commands, Reader, make_settings, setup_topology

from processors.runtime.settings import ProcessorSettings
from topology import local_cluster
from topology.admin import delete_topology, verify_topology

pytestmark = [pytest.mark.integration, pytest.mark.chaos]
RATE = float(os.environ.get("RUNFOLD_CHAOS_CLUSTER_RATE", "8"))  # runs started per second
PARTITIONS = 6
INTERNAL_PARTITIONS = 8  # transaction.state.log.num.partitions = offsets.topic.num.partitions locally
NOOP3 = {
    "schema": "runfold.workflow/v1",
    "id": "noop3",
    "revision": 1,
    "state": {},
    "entry": ["a"],
    "nodes": {n: {"kind": "action", "action": "noop"} for n in "abc"},
    "routes": {"a": ["b"], "b": ["c"]},
}


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, 32-bit wrap-around)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator(admin: AdminClient, key: str, internal_topic: str) -> int:
    """The broker id leading the partition of `internal_topic` that `key` hashes to: the
    transaction coordinator of a transactional id (`__transaction_state`), the group coordinator
    of a group (`__consumer_offsets`). Kafka's partitionFor: Utils.abs(key.hashCode()) %
    partitions; confluent-kafka has no describe_transactions / find_coordinator."""
    h = java_string_hash(key)
    partition = (0 if h == -(1 << 31) else abs(h)) % INTERNAL_PARTITIONS
    md = admin.list_topics(internal_topic, timeout=10)
    return md.topics[internal_topic].partitions[partition].leader


def wait_in_sync(admin: AdminClient, prefix: str, timeout: float = 90.0) -> float:
    """Wait until every replica of runfold's topics and the internal ones is in sync again."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            md = admin.list_topics(timeout=5)
            behind = [
                (name, p.id)
                for name, t in md.topics.items()
                if name.startswith((f"{prefix}.", "__"))
                for p in t.partitions.values()
                if len(p.isrs) < len(p.replicas) or p.leader < 0
            ]
            if not behind:
                return time.monotonic() - t0
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError(f"replicas not back in sync within {timeout:.0f}s")


@dataclass
class Load:
    """Starts noop3 runs at a steady rate from a thread; records when each was sent."""

    cmd: Commands
    rate: float
    sent: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        def go() -> None:
            t0, i = time.time(), 0
            while not self._stop.is_set():
                delay = t0 + i / self.rate - time.time()
                if delay > 0:
                    time.sleep(delay)
                run = f"cl-{i:05d}"
                self.sent[run] = time.time()
                self.cmd.start(run, "noop3", {"i": i})
                i += 1
            self.cmd.flush(90)

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Finishes:
    """When each run's terminal event became visible to a read_committed reader, by partition."""

    reader: Reader
    at: dict[str, tuple[float, int]] = field(default_factory=dict)  # run -> (seen, partition)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        def go() -> None:
            while not self._stop.is_set():
                for r in self.reader.poll(0.05):
                    if r["type"] in TERMINAL:
                        self.at.setdefault(r["run_id"], (time.time(), r["_partition"]))

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


def stall_figures(
    name: str, start: float, end: float, finishes: dict[str, tuple[float, int]], sent: dict[str, float]
) -> dict[str, object]:
    """Longest gap with no terminal event (per partition and overall) that begins in [start,
    end] (a gap open at `end` runs to the next terminal event after it), and the latency of the
    runs started in [start, end]."""
    times: dict[int, list[float]] = {p: [start] for p in range(PARTITIONS)}
    every = [start]
    after: dict[int, float] = {}
    for seen, partition in finishes.values():
        if start <= seen <= end:
            times[partition].append(seen)
            every.append(seen)
        elif seen > end:
            after[partition] = min(after.get(partition, seen), seen)
    gaps: dict[str, float] = {}
    for p, ts in times.items():
        ts = [*sorted(ts), after.get(p, end)]
        gaps[str(p)] = round(max(b - a for a, b in itertools.pairwise(ts)), 2)
    every = [*sorted(every), min(after.values(), default=end)]
    overall = round(max(b - a for a, b in itertools.pairwise(every)), 2)
    lat = sorted(finishes[r][0] - t for r, t in sent.items() if start <= t <= end and r in finishes)
    p99 = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None
    return {
        "fault": name,
        "seconds": round(end - start, 1),
        "longest_gap_s": overall,
        "longest_gap_by_partition_s": gaps,
        "runs_started": len(lat),
        "latency_p99_s": p99,
        "latency_max_s": round(lat[-1], 2) if lat else None,
    }


def warm_up(load: Load, finishes: Finishes, fleet: Fleet, timeout: float = 90.0) -> None:
    """Until the runs started in the last 3 s all finished within 2 s of their start (the worker
    and the child executor joined their groups, the JVMs warmed up): the figures are the faults'."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.time()
        recent = [(r, t) for r, t in list(load.sent.items()) if now - 5.0 <= t <= now - 2.0]
        if len(recent) >= 10 and all(r in finishes.at and finishes.at[r][0] - t < 2.0 for r, t in recent):
            return
        time.sleep(0.5)
    raise AssertionError(f"the fleet did not reach a steady state in {timeout:.0f}s: {fleet.tails()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_cluster.LocalClusterConfig]:
    ports = local_cluster.free_ports(6)
    cfg = local_cluster.LocalClusterConfig.from_env(
        brokers=3,
        ports=ports[:3],
        controller_ports=ports[3:],
        data_dir=tmp_path_factory.mktemp("chaos-cluster"),
    )
    try:
        local_cluster.up(cfg, timeout=240)
    except local_cluster.LocalKafkaError as e:
        pytest.fail(f"the chaos suite's 3-node cluster did not start: {e}", pytrace=False)
    try:
        yield cfg
    finally:
        local_cluster.down(cfg)


@pytest.mark.timeout(420)
def test_broker_killed_and_rolling_restart_on_three_nodes(
    cluster: local_cluster.LocalClusterConfig, tmp_path: Path
) -> None:
    s: ProcessorSettings = make_settings(
        cluster.bootstrap,
        f"cl{uuid.uuid4().hex[:6]}",
        tmp_path / "state",
        partitions=PARTITIONS,
        commit_interval_ms=50,
    )
    setup_topology(s, [NOOP3])
    check = verify_topology(s)
    assert check.ok and check.replication["replication_factor"] == 3, check.to_dict()
    assert check.replication["min_insync_replicas"] == 2
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    fleet = Fleet(s, tmp_path)
    fleet.processor("p1")
    fleet.processor("p2")
    fleet.worker("w1")
    fleet.child_executor("c1")
    fleet.ready(processors=2, timeout=120)
    finishes = Finishes(Reader(s, [s.topics.run_events], "run_events"))
    reader_thread = finishes.start()
    load = Load(Commands(s), RATE)
    sender = load.start()
    windows: list[tuple[str, float, float]] = []
    try:
        warm_up(load, finishes, fleet)
        t = time.time()
        time.sleep(5.0)
        windows.append(("steady load (no fault)", t, time.time()))

        victim = coordinator(admin, f"{s.topic_prefix}-processor-p1", "__transaction_state")
        also = [
            name
            for name, group in (("processor", s.group), ("worker", f"{s.topic_prefix}-worker-default"))
            if coordinator(admin, group, "__consumer_offsets") == victim
        ]
        what = "transaction coordinator of p1" + (f", group coordinator of {', '.join(also)}" if also else "")
        t = time.time()
        local_cluster.kill_node(cluster, victim)
        time.sleep(10.0)
        windows.append((f"kill -9 of node {victim} ({what})", t, time.time()))
        t = time.time()
        local_cluster.start_node(cluster, victim)
        wait_in_sync(admin, s.topic_prefix)
        windows.append((f"restart of node {victim}", t, time.time()))

        for node in range(1, cluster.size + 1):
            t = time.time()
            local_cluster.stop_node(cluster, node)
            local_cluster.start_node(cluster, node)
            wait_in_sync(admin, s.topic_prefix)
            windows.append((f"rolling restart: node {node} stopped cleanly and started", t, time.time()))
        t = time.time()
        time.sleep(4.0)
        windows.append(("steady load after the faults", t, time.time()))
        load.stop()
        sender.join(120)
        deadline = time.monotonic() + 120
        while set(load.sent) - set(finishes.at) and time.monotonic() < deadline:
            time.sleep(0.5)
        missing = set(load.sent) - set(finishes.at)
        assert not missing, f"{len(missing)} runs not terminal, e.g. {sorted(missing)[:5]}; {fleet.tails()}"
        alive = {name: proc.poll() for name, proc in fleet.procs.items()}
        assert all(code is None for code in alive.values()), (
            f"processes exited during the faults (exit codes {alive}); logs: {fleet.tails()}"
        )
    finally:
        load.stop()
        finishes.stop()
        reader_thread.join(10)
        finishes.reader.close()
        codes = fleet.stop()
    figures = [stall_figures(name, a, b, finishes.at, load.sent) for name, a, b in windows]
    print("\n[chaos] 3-node cluster stall figures (longest time with no run finishing):")
    for f in figures:
        print(
            f"[chaos]   {f['fault']}: {f['seconds']} s window, longest gap {f['longest_gap_s']} s "
            f"(by partition {f['longest_gap_by_partition_s']}), {f['runs_started']} runs started, "
            f"latency p99 {f['latency_p99_s']} s, max {f['latency_max_s']} s",
            flush=True,
        )
    assert all(c == 0 for c in codes.values()), (codes, fleet.tails())
    assert fleet.exits == [] and fleet.kills == {}
    proof = prove(
        "3-node cluster: transaction coordinator kill -9 + restart, rolling restart",
        s,
        started=set(load.sent),
        extra={"stalls": figures, "commands_resent": load.cmd.resent},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(load.sent)}
    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {s.topic_prefix} failed: {e}")
