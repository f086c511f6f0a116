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

import contextlib
import itertools
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from checks import TERMINAL, prove
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
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
class Leaders:
    """Kafka's own part of a fault: polls the cluster's metadata every 0.1 s and keeps, per poll,
    how many partitions of runfold's topics and of the internal ones (whose leaders are the
    transaction and group coordinators) were led by each broker or by none."""

    admin: AdminClient
    prefix: str
    polls: list[tuple[float, dict[int, int]]] = field(default_factory=list)  # (time, leader id -> count)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        def go() -> None:
            while not self._stop.wait(0.1):
                try:
                    md = self.admin.list_topics(timeout=1)
                except Exception:
                    continue
                counts: dict[int, int] = {}
                for name, t in md.topics.items():
                    if name.startswith((f"{self.prefix}.", "__")):
                        for p in t.partitions.values():
                            counts[p.leader] = counts.get(p.leader, 0) + 1
                self.polls.append((time.time(), counts))

        t = threading.Thread(target=go, daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()

    def moved_away(self, node: int, start: float) -> float | None:
        """Seconds from `start` until no partition was led by `node` or by no broker (Kafka has
        moved the lost broker's leaderships and coordinators); None if never seen."""
        for at, counts in self.polls:
            if start <= at and not counts.get(node) and not counts.get(-1):
                return round(at - start, 2)
        return None


@dataclass
class RawTransactions:
    """The floor under the same faults: a bare confluent-kafka consume -> produce loop, no
    runfold, doing what the processor's transactions do (KIP-447): a consumer in a group of its
    own reads its topic (RF 3, min ISR 2, leaders on every broker) read_committed, and every
    0.1 s a transaction writes one small record to each partition of that same topic (its own
    input next time round) and commits the consumer's positions with
    `send_offsets_to_transaction` before `commit_transaction`. So it meets every leader, the
    transaction coordinator and the group coordinator that the processor meets. No run can
    finish while no such transaction commits, so its longest time between two commits is
    Kafka's and the client library's part of a stall. A failed transaction is aborted and its
    input rewound; a producer that cannot go on is replaced (as runfold does)."""

    bootstrap: str
    topic: str
    commits: list[float] = field(default_factory=list)
    replaced: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _producer(self) -> Producer:
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"{self.topic}-raw",
                "transaction.timeout.ms": 10_000,
                "reconnect.backoff.max.ms": 1000,
                "retry.backoff.ms": 2,
                "retry.backoff.max.ms": 100,
                "linger.ms": 0,
            }
        )
        p.init_transactions(30)
        return p

    def _consumer(self) -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.topic}-raw",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 20_000,  # runfold's, so that a coordinator's failover is outlasted
                "heartbeat.interval.ms": 1_000,
                "reconnect.backoff.max.ms": 1000,
            }
        )
        c.subscribe([self.topic])
        return c

    def start(self) -> threading.Thread:
        def go() -> None:
            p, c = self._producer(), self._consumer()
            while not self._stop.wait(0.1):
                c.consume(1000, 0)  # its own committed records: the input, and the group's heartbeat
                positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
                try:
                    p.begin_transaction()
                    for part in range(PARTITIONS):
                        p.produce(self.topic, b"x", partition=part)
                    if positions:
                        p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 10)
                    p.commit_transaction(10)
                    self.commits.append(time.time())
                except KafkaException as e:
                    try:
                        if e.args[0].fatal():
                            raise
                        p.abort_transaction(10)
                    except KafkaException:
                        p = self._producer()
                        self.replaced += 1
                    with contextlib.suppress(KafkaException):  # rewind: the input again
                        for tp in c.committed(c.assignment(), timeout=10):
                            if tp.offset >= 0:
                                c.seek(tp)
            c.close()

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


def _longest_gap(times: list[float], start: float, end: float, whole: bool) -> float:
    """The longest interval between consecutive times that overlaps [start, end]; `whole`: an
    interval crossing an edge counts whole (a fault's stall began before or ended after its
    window), else only its part inside."""
    before = [t for t in times if t < start]
    inside = [t for t in times if start <= t <= end]
    later = [t for t in times if t > end]
    lo = max(before) if whole and before else start
    hi = min(later) if whole and later else end
    edges = [lo, *inside, hi]
    return round(max(b - a for a, b in itertools.pairwise(edges)), 2)


def stall_figures(
    name: str,
    start: float,
    end: float,
    finishes: dict[str, tuple[float, int]],
    sent: dict[str, float],
    fault: bool = True,
    leaders_moved_s: float | None = None,
    raw_commits: list[float] | None = None,
) -> dict[str, object]:
    """Per fault window: the longest time with no terminal event (overall and per partition)
    overlapping it, counted whole for a fault; and the latency of the runs started in it."""
    by_partition: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
    for seen, partition in finishes.values():
        by_partition[partition].append(seen)
    every = sorted(seen for seen, _ in finishes.values())
    gaps = {str(p): _longest_gap(sorted(ts), start, end, fault) for p, ts in by_partition.items()}
    overall = _longest_gap(every, start, end, fault)
    lat = sorted(finishes[r][0] - t for r, t in sent.items() if start <= t <= end and r in finishes)
    p99 = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None
    return {
        "fault": name,
        "at": time.strftime("%H:%M:%S", time.gmtime(start)),
        "seconds": round(end - start, 1),
        "longest_gap_s": overall,
        "longest_gap_by_partition_s": gaps,
        "runs_started": len(lat),
        "latency_p99_s": p99,
        "latency_max_s": round(lat[-1], 2) if lat else None,
        # Kafka's own part: until the lost node led nothing (its leaderships and coordinators
        # moved); the stall past it is the clients' (librdkafka's and runfold's) recovery.
        "kafka_leaders_moved_s": leaders_moved_s,
        # ... and the floor: the longest time a bare consume -> produce loop committed nothing.
        "raw_transactions_longest_gap_s": _longest_gap(raw_commits, start, end, fault)
        if raw_commits
        else None,
    }


def warm_up(load: Load, finishes: Finishes, timeout: float = 60.0) -> float:
    """Until most runs started 3-6 s ago finished within 2 s of their start (the worker and the
    child executor joined their groups, the JVMs warmed up), so that the figures are the
    faults'; at most `timeout` s (a slow machine then starts the faults anyway). Returns the
    seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = time.time()
        recent = [(r, t) for r, t in list(load.sent.items()) if now - 6.0 <= t <= now - 3.0]
        quick = [r for r, t in recent if r in finishes.at and finishes.at[r][0] - t < 2.0]
        if len(recent) >= 10 and len(quick) >= 0.9 * len(recent):
            break
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


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
    leaders = Leaders(AdminClient({"bootstrap.servers": cluster.bootstrap}), s.topic_prefix)
    leaders_thread = leaders.start()
    raw_topic = f"{s.topic_prefix}.raw-probe"
    admin.create_topics([NewTopic(raw_topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[
        raw_topic
    ].result(30)
    raw = RawTransactions(cluster.bootstrap, raw_topic)
    raw_thread = raw.start()
    load = Load(Commands(s), RATE)
    sender = load.start()
    windows: list[tuple[str, float, float]] = []
    lost: dict[str, int] = {}  # fault window -> the node it stopped
    warmed = 0.0
    try:
        warmed = warm_up(load, finishes)
        t = time.time()
        time.sleep(6.0)
        windows.append(("steady load (no fault)", t, time.time() - 2.0))  # runs of its last 2 s meet the kill

        # p1's transaction coordinator; when one of the processors' transaction coordinators is
        # also their group's coordinator, that one (the worst case: both move at once).
        txn_ids = [f"{s.topic_prefix}-processor-{p}{tail}" for p in ("p1", "p2") for tail in ("", "~1")]
        txn_coordinators = [coordinator(admin, tid, "__transaction_state") for tid in txn_ids]
        group_coordinator = coordinator(admin, s.group, "__consumer_offsets")
        victim = group_coordinator if group_coordinator in txn_coordinators else txn_coordinators[0]
        owner = txn_ids[txn_coordinators.index(victim)].rsplit("-", 1)[1]
        also = [
            name
            for name, group in (("processor", s.group), ("worker", f"{s.topic_prefix}-worker-default"))
            if coordinator(admin, group, "__consumer_offsets") == victim
        ]
        what = f"transaction coordinator of {owner}" + (
            f", group coordinator of {', '.join(also)}" if also else ""
        )
        t = time.time()
        local_cluster.kill_node(cluster, victim)
        time.sleep(10.0)
        windows.append((f"kill -9 of node {victim} ({what})", t, time.time()))
        lost[windows[-1][0]] = victim
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
            lost[windows[-1][0]] = node
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
        leaders.stop()
        raw.stop()
        reader_thread.join(10)
        leaders_thread.join(10)
        raw_thread.join(30)
        finishes.reader.close()
        codes = fleet.stop()
        figures = [
            stall_figures(
                name,
                a,
                b,
                finishes.at,
                load.sent,
                fault=not name.startswith("steady"),
                leaders_moved_s=leaders.moved_away(lost[name], a) if name in lost else None,
                raw_commits=raw.commits,
            )
            for name, a, b in windows
        ]
        (tmp_path / "finishes.json").write_bytes(
            orjson.dumps({"finishes": finishes.at, "sent": load.sent, "windows": windows})
        )
        print("\n[chaos] 3-node cluster stall figures (longest time with no run finishing):")
        for f in figures:
            print(
                f"[chaos]   {f['fault']} (at {f['at']} UTC): {f['seconds']} s window, longest gap {f['longest_gap_s']} s "
                f"(by partition {f['longest_gap_by_partition_s']}), {f['runs_started']} runs started, "
                f"latency p99 {f['latency_p99_s']} s, max {f['latency_max_s']} s"
                + (
                    f"; Kafka moved the node's leaderships after {f['kafka_leaders_moved_s']} s"
                    if f["kafka_leaders_moved_s"] is not None
                    else ""
                )
                + f"; a bare consume -> produce loop's longest gap {f['raw_transactions_longest_gap_s']} s",
                flush=True,
            )
    assert all(c == 0 for c in codes.values()), (codes, fleet.tails())
    assert fleet.exits == [] and fleet.kills == {}
    proof = prove(
        "3-node cluster: transaction coordinator kill -9 + restart, rolling restart",
        s,
        started=set(load.sent),
        extra={"stalls": figures, "commands_resent": load.cmd.resent, "warm_up_s": warmed},
    )
    assert proof.terminal_by_type == {"RunSucceeded": len(load.sent)}
    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {s.topic_prefix} failed: {e}")
