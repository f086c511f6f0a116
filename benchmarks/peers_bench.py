"""runfold vs Temporal vs DBOS Transact on the same no-op workflows, side by side (`runfold bench peers`).

Systems, one at a time, each started fresh and stopped after its measurements, in every round:

    runfold          a local broker of its own (defaults) + processor + `noop` worker + client
    runfold-fsync    the same on a broker of its own that fsyncs every write
                     (log.flush.interval.messages=1, a dynamic config of the broker, so it holds
                     for the transaction and offsets topics too)
    temporal         `temporal server start-dev` (CLI v1.5.1 built from its Go module into the
                     cache dir; SQLite file) + a `temporalio` Worker + a client process
    dbos-sqlite      DBOS Transact 3.4 on a SQLite file (one process: driver = worker = client)
    dbos-postgres    the same on a PostgreSQL server of its own (Debian's package, when installed;
                     fsync and synchronous_commit on, the defaults)

Per system (benchmarks/peers/_drive.py has the load loops):

    throughput   3 no-op steps, closed loop at each concurrency of its curve: workflows/s
    cpu          CPU-seconds over the measured window, summed over every process of the system
                 (broker/server/database, worker, processor, client: psutil, process trees),
                 per completed workflow, at the concurrency of its max
    latency      1 no-op step, open loop, at 25 % of its own max and at a common low rate:
                 p50/p90/p99 from the planned start to the completion seen by the client
    memory       peak of the summed RSS and PSS of its processes, sampled every second

A peer that cannot be installed or started is skipped, with the reason in the output.
Results: benchmarks/results/peers.json (+ peers.png); medians over --rounds.

    runfold bench peers --quick              # a few minutes: 1 round, short windows
    runfold bench peers --rounds 3           # the table in docs/benchmarks.md
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from benchmarks.harness import ROOT, error_text, host_info, results_dir, spawn_log

TEMPORAL_CLI = "v1.5.1"
DBOS_VERSION = "3.4.0"
PEERS = ("runfold", "runfold-fsync", "temporal", "dbos-sqlite", "dbos-postgres")
LOW_RATE = 2.5  # runs/s: a rate every system sustains, for a like-for-like latency

# What one step costs each system in durability, beside its numbers (docs/benchmarks.md).
GUARANTEES = {
    "runfold": "state + events exactly-once (Kafka transactions, read_committed); 1 broker, "
    "replication 1; no fsync per write (the broker acks from the page cache, Kafka's default: "
    "a lost host loses what the OS had not flushed, a cluster relies on replication instead)",
    "runfold-fsync": "as runfold, and the broker fsyncs every write before it acks "
    "(log.flush.interval.messages=1), transaction and offsets topics included",
    "temporal": "dev server, SQLite file (default pragmas: rollback journal, synchronous=FULL, "
    "fsync per commit); history events durable per task completion; activities at-least-once; "
    "no replication",
    "dbos-sqlite": "each step's result checkpointed in a SQLite transaction (synchronous=FULL, "
    "fsync per commit); steps at-least-once (re-run when the process dies before the checkpoint), "
    "workflows run to completion once; no replication",
    "dbos-postgres": "as dbos-sqlite, in PostgreSQL (fsync=on, synchronous_commit=on: WAL flushed "
    "per commit); no replication",
}


@dataclass
class Plan:
    rounds: int
    curve: dict[str, list[int]]
    seconds: float
    warmup_s: float
    latency_s: float
    low_s: float
    port_base: int
    cache_dir: Path


def plan(quick: bool, rounds: int | None, port_base: int, cache_dir: Path | None) -> Plan:
    cache = cache_dir or Path(os.environ.get("RUNFOLD_CACHE_DIR", ROOT / ".runfold" / "cache"))
    if quick:
        curve = {"runfold": [64, 512], "temporal": [8, 32], "dbos": [8, 32]}
        return Plan(rounds or 1, curve, 4.0, 1.5, 5.0, 6.0, port_base, cache)
    curve = {"runfold": [16, 64, 256, 1024], "temporal": [4, 16, 64], "dbos": [4, 16, 64]}
    return Plan(rounds or 3, curve, 8.0, 2.0, 10.0, 12.0, port_base, cache)


# ---- processes: CPU and memory over whole trees ---------------------------------------------
class Tree:
    """The processes of one system by role (each root and its descendants), via psutil."""

    def __init__(self) -> None:
        self.roots: dict[str, int] = {}
        self.peak_rss = 0.0
        self.peak_pss = 0.0
        self.peak_by_role: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def add(self, role: str, pid: int) -> None:
        self.roots[role] = pid

    def _procs(self) -> Iterator[tuple[str, Any]]:
        import psutil

        for role, pid in self.roots.items():
            try:
                root = psutil.Process(pid)
                yield role, root
                for child in root.children(recursive=True):
                    yield role, child
            except psutil.Error:
                continue

    def cpu(self) -> dict[str, float]:
        import psutil

        out: dict[str, float] = {}
        for role, p in self._procs():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out[role] = out.get(role, 0.0) + t.user + t.system + t.children_user + t.children_system
        return out

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(1.0):
            rss = pss = 0.0
            by_role: dict[str, float] = {}
            for role, p in self._procs():
                with contextlib.suppress(psutil.Error):
                    m = p.memory_full_info()
                    rss += m.rss
                    pss += getattr(m, "pss", m.rss)
                    by_role[role] = by_role.get(role, 0.0) + getattr(m, "pss", m.rss)
            if pss > self.peak_pss:
                self.peak_by_role = {r: round(v / 2**20, 1) for r, v in by_role.items()}
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def memory(self) -> dict[str, Any]:
        return {
            "peak_rss_mib": round(self.peak_rss / 2**20, 1),
            "peak_pss_mib": round(self.peak_pss / 2**20, 1),
            "peak_pss_by_role_mib": self.peak_by_role,
        }


class Driver:
    """A driver process (benchmarks/peers/_drive.py protocol): ops in, CPU sampled at its marks."""

    def __init__(self, args: list[str], env: dict[str, str], log: IO[bytes], timeout: float = 120) -> None:
        self.proc = subprocess.Popen(
            args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT
        )
        first = self._line(timeout)
        if not first.get("ready"):
            raise RuntimeError(f"driver not ready: {first}")

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        result: list[bytes] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            raise RuntimeError(f"driver gave no answer in {timeout:.0f} s (exit {self.proc.poll()})")
        parsed: dict[str, Any] = orjson.loads(result[0])
        return parsed

    def op(self, tree: Tree, **op: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(op) + b"\n")
        self.proc.stdin.flush()
        cpu0: dict[str, float] = {}
        cpu1: dict[str, float] = {}
        t0 = t1 = time.monotonic()
        while True:
            msg = self._line(600)
            if msg.get("mark") == "start":
                cpu0, t0 = tree.cpu(), time.monotonic()
            elif msg.get("mark") == "end":
                cpu1, t1 = tree.cpu(), time.monotonic()
            elif "result" in msg:
                out: dict[str, Any] = msg["result"]
                if cpu1:
                    by_role = {r: round(cpu1.get(r, 0.0) - cpu0.get(r, 0.0), 3) for r in cpu1}
                    out["cpu_s_by_role"] = by_role
                    out["cpu_s"] = round(sum(by_role.values()), 3)
                    out["window_s"] = round(t1 - t0, 3)
                return out

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        _stop(self.proc)


def _stop(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before port {port} answered")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} did not answer in {timeout:.0f} s")


class Skip(Exception):
    """A peer that cannot be installed or started here: skipped, with the reason."""


@dataclass
class System:
    name: str
    driver: Driver
    tree: Tree
    info: dict[str, Any] = field(default_factory=dict)


# ---- runfold -----------------------------------------------------------------------------------
@contextlib.contextmanager
def runfold_system(name: str, port: int, fsync: bool, log: IO[bytes]) -> Iterator[System]:
    from benchmarks.workflow_throughput import Rig
    from topology import local_kafka

    data = Path(tempfile.mkdtemp(prefix=f"peers-{name}-"))
    cfg = local_kafka.LocalKafkaConfig.from_env(port=port, controller_port=port + 1, data_dir=data / "kafka")
    saved = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    rig: Rig | None = None
    driver: Driver | None = None
    try:
        t0 = time.monotonic()
        status = local_kafka.up(cfg)
        info: dict[str, Any] = {"broker_start_s": round(time.monotonic() - t0, 2)}
        if fsync:
            info["broker_config"] = _fsync_every_write(cfg.bootstrap)
        info["coordinators_ready_s"] = _warm_transaction_coordinators(cfg.bootstrap)
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = cfg.bootstrap
        rig = Rig(f"pr{uuid.uuid4().hex[:6]}", partitions=4).start()
        tree = Tree()
        assert status.pid is not None
        tree.add("broker", status.pid)
        tree.add("processor", rig.procs["p0"].pid)
        tree.add("worker", rig.procs["worker"].pid)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")},
            "KAFKA_BOOTSTRAP_SERVERS": cfg.bootstrap,
            "RUNFOLD_TOPIC_PREFIX": rig.settings.topic_prefix,
        }
        driver = Driver([sys.executable, "-m", "benchmarks.peers.runfold_workflow"], env, log)
        tree.add("client", driver.proc.pid)
        tree.start()
        yield System(name, driver, tree, info)
        tree.stop()
    finally:
        if driver is not None:
            driver.close()
        if rig is not None:
            rig.stop(delete=False)  # the broker and its topics go next
            shutil.rmtree(rig.state_dir, ignore_errors=True)
        local_kafka.down(cfg)
        shutil.rmtree(data, ignore_errors=True)
        if saved is None:
            os.environ.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        else:
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = saved


def _warm_transaction_coordinators(bootstrap: str, producers: int = 48) -> float:
    """Seconds until transactional producers with `producers` random ids all got their producer
    id: every partition of a fresh broker's transaction-state topic loaded (48 random ids miss
    one of its 8 partitions 1.6 % of the time). Under heavy host load a fresh broker answered
    "not coordinator" to the processor's second producer for minutes, which stalled a round."""
    from concurrent.futures import ThreadPoolExecutor

    from confluent_kafka import Producer

    def init(i: int) -> None:
        p = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"warm-{uuid.uuid4().hex}", "log_level": 0}
        )
        p.init_transactions(180)

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(init, range(producers)))
    return round(time.monotonic() - t0, 2)


def _fsync_every_write(bootstrap: str) -> dict[str, str]:
    """Set log.flush.interval.messages=1 on the broker (node 1, the only one: a dynamic broker
    config holds for every topic without its own override, the internal ones too) and read it
    back."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("log.flush.interval.messages", "1", incremental_operation=AlterConfigOpType.SET)
    for f in admin.incremental_alter_configs(
        [ConfigResource(ResourceType.BROKER, "1", incremental_configs=[entry])]
    ).values():
        f.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        res = ConfigResource(ResourceType.BROKER, "1")
        got = admin.describe_configs([res])[res].result(30)
        value = got["log.flush.interval.messages"].value
        if value == "1":
            return {"log.flush.interval.messages": value}
        time.sleep(0.5)
    raise RuntimeError("the broker did not take log.flush.interval.messages=1")


# ---- Temporal -----------------------------------------------------------------------------------
def temporal_binary(cache: Path, log: IO[bytes]) -> Path:
    """The Temporal CLI, built once from its Go module into the cache (never committed)."""
    gobin = cache / f"temporal-{TEMPORAL_CLI}"
    binary = gobin / "temporal"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        raise Skip(f"Temporal: `go` is not on PATH to build the CLI {TEMPORAL_CLI} from its Go module")
    env = {
        **os.environ,
        "GOBIN": str(gobin),
        "GOPATH": str(cache / "gopath"),
        "GOMODCACHE": str(cache / "gomod"),
        "GOCACHE": str(cache / "gobuild"),
    }
    print(f"building the Temporal CLI {TEMPORAL_CLI} into {gobin} (once, minutes)", file=sys.stderr)
    proc = subprocess.run(
        [go, "install", f"github.com/temporalio/cli/cmd/temporal@{TEMPORAL_CLI}"],
        env=env,
        stdout=log,
        stderr=log,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0 or not binary.exists():
        raise Skip(
            f"Temporal: `go install` of the CLI {TEMPORAL_CLI} failed (exit {proc.returncode}, see the log)"
        )
    return binary


@contextlib.contextmanager
def temporal_system(port: int, cache: Path, log: IO[bytes]) -> Iterator[System]:
    try:
        import psutil  # noqa: F401
        import temporalio  # noqa: F401
    except ImportError as e:
        raise Skip(f"Temporal: the Python SDK is not importable ({e})") from e
    binary = temporal_binary(cache, log)
    data = Path(tempfile.mkdtemp(prefix="peers-temporal-"))
    procs: list[subprocess.Popen[bytes]] = []
    driver: Driver | None = None
    try:
        t0 = time.monotonic()
        server = subprocess.Popen(
            [
                str(binary),
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(port),
                "--http-port",
                str(port + 1),
                "--metrics-port",
                str(port + 2),
                "--db-filename",
                str(data / "temporal.sqlite"),
                "--log-level",
                "error",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        procs.append(server)
        _wait_port(port, 120, server)
        address = f"127.0.0.1:{port}"
        script = str(ROOT / "benchmarks" / "peers" / "temporal_workflow.py")
        queue = f"q-{uuid.uuid4().hex[:6]}"
        worker = Driver(
            [sys.executable, script, "worker", "--address", address, "--queue", queue], dict(os.environ), log
        )
        procs.append(worker.proc)
        info = {"server_start_s": round(time.monotonic() - t0, 2)}
        driver = Driver(
            [sys.executable, script, "drive", "--address", address, "--queue", queue], dict(os.environ), log
        )
        tree = Tree()
        tree.add("server", server.pid)
        tree.add("worker", worker.proc.pid)
        tree.add("client", driver.proc.pid)
        tree.start()
        yield System("temporal", driver, tree, info)
        tree.stop()
    finally:
        if driver is not None:
            driver.close()
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(data, ignore_errors=True)


# ---- DBOS ---------------------------------------------------------------------------------------
def dbos_python(cache: Path, log: IO[bytes]) -> Path:
    """A venv of its own for DBOS (dbos 3.4 needs croniter >= 6.2.4; runfold's faust-streaming
    needs < 6, so they cannot share runfold's venv), created once in the cache."""
    venv = cache / f"peers-dbos-{DBOS_VERSION}"
    py = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return py
    print(f"installing DBOS {DBOS_VERSION} into {venv} (once)", file=sys.stderr)
    base = shutil.which("python3.11") or sys.executable
    steps = [
        [base, "-m", "venv", str(venv)],
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"dbos=={DBOS_VERSION}",
            "psycopg[binary]>=3.1",
        ],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, stdout=log, stderr=log, check=False, timeout=900)
        if proc.returncode != 0:
            raise Skip(f"DBOS: `{' '.join(cmd[-3:])}` failed (exit {proc.returncode}, see the log)")
    stamp.write_text(DBOS_VERSION + "\n")
    return py


def postgres_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0))
    if not found:
        raise Skip(
            "DBOS on PostgreSQL: Debian's postgresql package is not installed (apt-get install postgresql)"
        )
    return Path(found[-1])


@contextlib.contextmanager
def postgres_server(port: int, log: IO[bytes]) -> Iterator[tuple[str, int]]:
    """A throwaway PostgreSQL cluster with the durability defaults (fsync, synchronous_commit on);
    as root it runs as the postgres user, as scripts/_postgres.sh does. Yields (url, postmaster pid)."""
    bindir = postgres_bindir()
    data = Path(tempfile.mkdtemp(prefix="peers-pg-"))
    root = os.geteuid() == 0
    if root:
        shutil.chown(data, "postgres")

    def as_owner(*cmd: str) -> None:
        full = ["runuser", "-u", "postgres", "--", *cmd] if root else list(cmd)
        proc = subprocess.run(full, stdout=log, stderr=log, check=False, timeout=120)
        if proc.returncode != 0:
            raise Skip(
                f"DBOS on PostgreSQL: `{Path(cmd[0]).name}` failed (exit {proc.returncode}, see the log)"
            )

    try:
        as_owner(
            str(bindir / "initdb"),
            "-D",
            str(data / "db"),
            "-U",
            "runfold",
            "--auth=trust",
            "--locale=C",
            "-E",
            "UTF8",
        )
        as_owner(
            str(bindir / "pg_ctl"),
            "-D",
            str(data / "db"),
            "-l",
            str(data / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        )
        as_owner(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "runfold", "bench")
        pid = int((data / "db" / "postmaster.pid").read_text().split()[0])
        yield f"postgresql://runfold@127.0.0.1:{port}/bench", pid
    finally:
        with contextlib.suppress(Skip):
            as_owner(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def dbos_system(name: str, port: int, cache: Path, log: IO[bytes]) -> Iterator[System]:
    py = dbos_python(cache, log)
    script = str(ROOT / "benchmarks" / "peers" / "dbos_workflow.py")
    with contextlib.ExitStack() as stack:
        tree = Tree()
        t0 = time.monotonic()
        if name == "dbos-postgres":
            url, pg_pid = stack.enter_context(postgres_server(port, log))
            tree.add("database", pg_pid)
        else:
            data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peers-dbos-")))
            url = f"sqlite:///{data / 'dbos.sqlite'}"
        driver = Driver(
            [str(py), script, "--db", url], {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, log
        )
        stack.callback(driver.close)
        tree.add("app", driver.proc.pid)
        tree.start()
        yield System(name, driver, tree, {"start_s": round(time.monotonic() - t0, 2)})
        tree.stop()


# ---- measuring ----------------------------------------------------------------------------------
def measure(system: System, curve: list[int], p: Plan) -> dict[str, Any]:
    d, tree = system.driver, system.tree
    # not measured: a fresh broker or server is busy for seconds after it answers (internal
    # topics, caches, JIT), and a first window would charge that to the workflows
    # (on a host this loaded, a fresh broker's transaction coordinator has taken minutes): until
    # workflows complete, for at most 2 minutes, else the round is an error, not a figure
    deadline = time.monotonic() + 120
    while not d.op(tree, op="throughput", concurrency=curve[0], seconds=p.warmup_s, warmup_s=1, steps=3).get(
        "completed"
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("no workflow completed in 2 minutes of warm-up")
    points = []
    for c in curve:
        r = d.op(tree, op="throughput", concurrency=c, seconds=p.seconds, warmup_s=p.warmup_s, steps=3)
        if r.get("completed"):
            r["cpu_ms_per_workflow"] = round(1000 * r["cpu_s"] / r["completed"], 2)
        points.append(r)
    best = max(points, key=lambda r: r.get("workflows_per_s", 0.0))
    out: dict[str, Any] = {"curve": points, **system.info}
    top = best.get("workflows_per_s", 0.0)
    out["max_workflows_per_s"] = top
    out["max_at_concurrency"] = best.get("concurrency")
    out["cpu_ms_per_workflow"] = best.get("cpu_ms_per_workflow")
    if top:
        rate = round(max(0.5, 0.25 * top), 2)
        out["latency_25pct"] = d.op(tree, op="latency", rate=rate, seconds=p.latency_s, steps=1)
    out["latency_low"] = d.op(tree, op="latency", rate=LOW_RATE, seconds=p.low_s, steps=1)
    out["memory"] = tree.memory()
    return out


def one_system(name: str, p: Plan, log: IO[bytes]) -> dict[str, Any]:
    base = p.port_base
    if name == "runfold":
        ctx = runfold_system(name, base + 2, False, log)
    elif name == "runfold-fsync":
        ctx = runfold_system(name, base, True, log)
    elif name == "temporal":
        ctx = temporal_system(base + 5, p.cache_dir, log)
    else:
        ctx = dbos_system(name, base + 4, p.cache_dir, log)
    curve = p.curve["runfold" if name.startswith("runfold") else name.split("-")[0]]
    load = os.getloadavg()[0]
    with ctx as system:
        out = measure(system, curve, p)
    # the host is shared: its load beside each system's figures (at start, at end)
    out["loadavg_1m"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    return out


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of each system's headline figures."""
    keys = {
        "max_workflows_per_s": ("max_workflows_per_s",),
        "cpu_ms_per_workflow": ("cpu_ms_per_workflow",),
        "p50_ms_at_25pct": ("latency_25pct", "p50_ms"),
        "p99_ms_at_25pct": ("latency_25pct", "p99_ms"),
        "rate_at_25pct": ("latency_25pct", "rate_runs_per_s"),
        "p50_ms_at_low_rate": ("latency_low", "p50_ms"),
        "p99_ms_at_low_rate": ("latency_low", "p99_ms"),
        "peak_rss_mib": ("memory", "peak_rss_mib"),
        "peak_pss_mib": ("memory", "peak_pss_mib"),
    }
    out: dict[str, Any] = {}
    for name in PEERS:
        rows = [r[name] for r in rounds if name in r and "skipped" not in r[name] and "error" not in r[name]]
        if not rows:
            why = next((r[name] for r in rounds if name in r), {"skipped": "not run"})
            out[name] = {k: v for k, v in why.items() if k in ("skipped", "error")}
            continue
        s: dict[str, Any] = {}
        for k, path in keys.items():
            vals = []
            for row in rows:
                v: Any = row
                for part in path:
                    v = v.get(part) if isinstance(v, dict) else None
                if isinstance(v, int | float):
                    vals.append(float(v))
            if vals:
                s[k] = round(statistics.median(vals), 2)
        s["rounds"] = len(rows)
        s["guarantees"] = GUARANTEES[name]
        out[name] = s
    base = out.get("runfold", {}).get("max_workflows_per_s")
    for s in out.values():
        if base and s.get("max_workflows_per_s"):
            s["runfold_throughput_ratio"] = round(base / s["max_workflows_per_s"], 2)
    return out


def run(
    quick: bool = False,
    rounds: int | None = None,
    peers: tuple[str, ...] = PEERS,
    port_base: int = 19300,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    p = plan(quick, rounds, port_base, cache_dir)
    p.cache_dir.mkdir(parents=True, exist_ok=True)
    log_path = spawn_log("peers")
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    host = host_info()
    host["fsync_ms_median_tmp"] = fsync_ms(Path(tempfile.gettempdir()))
    raw: list[dict[str, Any]] = []
    with log_path.open("ab") as log:
        for i in range(p.rounds):
            rnd: dict[str, Any] = {}
            for name in peers:
                print(f"[peers round {i + 1}/{p.rounds}] {name}", file=sys.stderr, flush=True)
                try:
                    rnd[name] = one_system(name, p, log)
                except Skip as e:
                    rnd[name] = {"skipped": str(e)}
                except Exception as e:
                    rnd[name] = {"error": error_text(e)}
                print(f"  {orjson.dumps(rnd[name]).decode()[:600]}", file=sys.stderr, flush=True)
            raw.append(rnd)
    result = {
        "bench": "peers",
        "started": started,
        "host": host,
        "command": " ".join(["runfold bench peers", *(["--quick"] if quick else []), f"--rounds {p.rounds}"]),
        "plan": {
            "rounds": p.rounds,
            "curve": p.curve,
            "throughput_window_s": p.seconds,
            "warmup_s": p.warmup_s,
            "latency_window_s": p.latency_s,
            "low_rate_runs_per_s": LOW_RATE,
            "low_rate_window_s": p.low_s,
        },
        "summary": summarise(raw),
        "raw_rounds": raw,
        "log": str(log_path),
    }
    out = results_dir()
    (out / "peers.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    try:
        plot(result, out / "peers.png")
    except Exception as e:  # a missing matplotlib must not lose the JSON
        print(f"plot skipped: {error_text(e)}", file=sys.stderr)
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, rows in _curves(result).items():
        ax1.plot([c for c, _ in rows], [w for _, w in rows], marker="o", label=name)
    ax1.set(xscale="log", yscale="log", xlabel="workflows in flight", ylabel="3-step workflows/s")
    ax1.legend()
    names = [n for n, s in result["summary"].items() if "p50_ms_at_25pct" in s]
    x = range(len(names))
    s = result["summary"]
    ax2.bar([i - 0.2 for i in x], [s[n]["p50_ms_at_25pct"] for n in names], 0.4, label="p50 @ 25 % of max")
    ax2.bar([i + 0.2 for i in x], [s[n]["p99_ms_at_25pct"] for n in names], 0.4, label="p99 @ 25 % of max")
    ax2.set_xticks(list(x), names, rotation=20)
    ax2.set(ylabel="1-step latency, ms")
    ax2.legend()
    fig.suptitle(f"runfold bench peers ({result['started']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _curves(result: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Per system, the median workflows/s at each concurrency over the rounds."""
    acc: dict[str, dict[int, list[float]]] = {}
    for rnd in result["raw_rounds"]:
        for name, r in rnd.items():
            for pt in r.get("curve", []):
                if "workflows_per_s" in pt:
                    acc.setdefault(name, {}).setdefault(pt["concurrency"], []).append(pt["workflows_per_s"])
    return {n: sorted((c, statistics.median(v)) for c, v in pts.items()) for n, pts in acc.items()}


def fsync_ms(directory: Path, n: int = 30) -> float:
    """The median time of a 4 KiB write + fsync in `directory`: every peer but runfold (defaults)
    pays it per commit, so it is beside their numbers in the output."""
    path = directory / f".fsync-probe-{uuid.uuid4().hex[:6]}"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return round(statistics.median(times), 2)


def peer_requirements() -> list[str]:
    """The `bench-peers` extra of pyproject.toml: what `runfold bench peers` installs when missing."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs: list[str] = data["project"]["optional-dependencies"]["bench-peers"]
    return reqs


def ensure_peer_packages() -> list[str]:
    """pip-install the bench-peers extra into this venv when one of its modules is missing."""
    missing = []
    for req, module in (("temporalio", "temporalio"), ("psutil", "psutil")):
        try:
            __import__(module)
        except ImportError:
            missing.append(req)
    if not missing:
        return []
    reqs = peer_requirements()
    print(f"installing {', '.join(reqs)} into {sys.prefix} (the bench-peers extra)", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs], check=False
    )
    return reqs


def table(result: dict[str, Any]) -> str:
    cols = [
        ("max_workflows_per_s", "3-step wf/s"),
        ("cpu_ms_per_workflow", "CPU ms/wf"),
        ("rate_at_25pct", "25% rate"),
        ("p50_ms_at_25pct", "p50@25%"),
        ("p99_ms_at_25pct", "p99@25%"),
        ("p50_ms_at_low_rate", f"p50@{LOW_RATE}/s"),
        ("p99_ms_at_low_rate", f"p99@{LOW_RATE}/s"),
        ("peak_pss_mib", "PSS MiB"),
        ("peak_rss_mib", "RSS MiB"),
    ]
    rows = [["system", *(c for _, c in cols)]]
    for name, s in result["summary"].items():
        if "skipped" in s or "error" in s:
            rows.append(
                [name, f"{'skipped' if 'skipped' in s else 'error'}: {s.get('skipped') or s.get('error')}"]
            )
            continue
        rows.append([name, *(f"{s[k]:,}" if k in s else "-" for k, _ in cols)])
    width = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(width[i]) for i, v in enumerate(r)) for r in rows)


def markdown(result: dict[str, Any]) -> str:
    """The summary as the table in docs/benchmarks.md."""
    head = (
        "| system | 3-step workflows/s (max; at in flight) | CPU ms per workflow | 1-step p50 / p99 ms at 25 % "
        f"of its max (rate) | p50 / p99 ms at {LOW_RATE} runs/s | peak PSS / RSS MiB | runfold (defaults) / it |"
    )
    rows = [head, "|---|---|---|---|---|---|---|"]
    for name, s in result["summary"].items():
        if "skipped" in s or "error" in s:
            rows.append(
                f"| {name} | {'skipped' if 'skipped' in s else 'error'}: {s.get('skipped') or s.get('error')} | | | | | |"
            )
            continue
        at = [
            r[name].get("max_at_concurrency")
            for r in result["raw_rounds"]
            if "max_at_concurrency" in r.get(name, {})
        ]
        rows.append(
            f"| {name} | {s.get('max_workflows_per_s', '-'):,} (at {', '.join(str(a) for a in at)}) "
            f"| {s.get('cpu_ms_per_workflow', '-')} "
            f"| {s.get('p50_ms_at_25pct', '-')} / {s.get('p99_ms_at_25pct', '-')} ({s.get('rate_at_25pct', '-')}/s) "
            f"| {s.get('p50_ms_at_low_rate', '-')} / {s.get('p99_ms_at_low_rate', '-')} "
            f"| {s.get('peak_pss_mib', '-'):,} / {s.get('peak_rss_mib', '-'):,} "
            f"| {s.get('runfold_throughput_ratio', '-')}x |"
        )
    return "\n".join(rows)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--port-base", type=int, default=19300)
    a = ap.parse_args()
    ensure_peer_packages()
    r = run(a.quick, a.rounds, tuple(x.strip() for x in a.peers.split(",")), a.port_base)
    print(table(r))


if __name__ == "__main__":
    main()
