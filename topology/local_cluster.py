"""A local Kafka cluster of N KRaft nodes (each broker + controller) from the same Maven jars as
`topology.local_kafka`: for development and for tests of what a real cluster does (replication,
leader election, a broker lost).

    cfg = LocalClusterConfig.from_env(brokers=3)  # ports from a base: RUNFOLD_KAFKA_PORT (9092),
                                                   # controllers RUNFOLD_KAFKA_CONTROLLER_PORT (base+100)
    status = up(cfg)              # idempotent; every node started, the cluster answers with N brokers
    down(cfg)                     # every node: SIGTERM (a controlled shutdown), SIGKILL after a grace
    kill_node(cfg, 2)             # SIGKILL one node (the chaos tests); start_node(cfg, 2) brings it back
    stop_node(cfg, 2)             # a clean stop of one node (a rolling restart)

Node i (1..N) listens on base+i-1 and controller base+100+i-1 (or the explicit port lists), keeps
its data in `<data_dir>/node-<i>` (default `.runfold/kafka-cluster`), its log in `broker.log`
there. The cluster's state file `cluster.json` in the data dir lists nodes, pids and ports.
Internal topics have replication factor min(3, N) and min ISR min(2, N) (what an exactly-once
deployment needs, topology/replication.py); the heap is small (256 MB per node by default,
RUNFOLD_KAFKA_CLUSTER_HEAP) so three nodes fit a laptop.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from topology import local_kafka
from topology.local_kafka import LocalKafkaError

STATE_FILE = "cluster.json"
DEFAULT_DATA_DIR = ".runfold/kafka-cluster"
CONTROLLER_OFFSET = 100


@dataclass(frozen=True)
class LocalClusterConfig:
    ports: tuple[int, ...]
    controller_ports: tuple[int, ...]
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    cache_dir: Path = Path.home() / ".cache" / "runfold"
    heap: str = "256m"
    young: str = "96m"
    # Kafka's broker.session.timeout.ms (how long the controller waits for a lost broker's
    # heartbeat before it moves the broker's leaderships); None keeps Kafka's 9 s.
    broker_session_ms: int | None = None

    def __post_init__(self) -> None:
        if len(self.ports) != len(self.controller_ports) or not self.ports:
            raise LocalKafkaError("a local cluster needs one broker and one controller port per node")
        every = [*self.ports, *self.controller_ports]
        if len(set(every)) != len(every):
            raise LocalKafkaError(f"the cluster's ports must all differ: {every}")

    @classmethod
    def from_env(
        cls,
        brokers: int = 3,
        base_port: int | None = None,
        controller_base: int | None = None,
        data_dir: Path | str | None = None,
        ports: tuple[int, ...] | None = None,
        controller_ports: tuple[int, ...] | None = None,
    ) -> LocalClusterConfig:
        """Explicit arguments win over the environment, which wins over the defaults."""
        if not 1 <= brokers <= 9:
            raise LocalKafkaError(f"a local cluster has 1-9 nodes, not {brokers}")
        env = os.environ
        base = base_port or local_kafka._port_from_env("RUNFOLD_KAFKA_PORT", local_kafka.DEFAULT_PORT)
        cbase = controller_base or local_kafka._port_from_env(
            "RUNFOLD_KAFKA_CONTROLLER_PORT", base + CONTROLLER_OFFSET
        )
        ps = ports or tuple(base + i for i in range(brokers))
        cps = controller_ports or tuple(cbase + i for i in range(brokers))
        if max(*ps, *cps) >= 65_536:
            raise LocalKafkaError(f"ports {ps} / {cps} go beyond 65535")
        dd = Path(
            data_dir if data_dir is not None else env.get("RUNFOLD_KAFKA_CLUSTER_DIR", DEFAULT_DATA_DIR)
        )
        default_cache = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "runfold"
        heap = env.get("RUNFOLD_KAFKA_CLUSTER_HEAP", "256m")
        session = env.get("RUNFOLD_KAFKA_CLUSTER_BROKER_SESSION_MS", "").strip()
        if session and (not session.isdigit() or int(session) < 1000):
            raise LocalKafkaError(
                f"RUNFOLD_KAFKA_CLUSTER_BROKER_SESSION_MS={session!r} is not a number >= 1000"
            )
        return cls(
            ports=ps,
            controller_ports=cps,
            data_dir=dd.expanduser().resolve(),
            cache_dir=Path(env.get("RUNFOLD_CACHE_DIR", default_cache)).expanduser(),
            heap=heap,
            broker_session_ms=int(session) if session else None,
        )

    @property
    def size(self) -> int:
        return len(self.ports)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node_dir(self, node: int) -> Path:
        return self.data_dir / f"node-{node}"

    def node_bootstrap(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node - 1]}"

    @property
    def state_file(self) -> Path:
        return self.data_dir / STATE_FILE

    def jars(self) -> local_kafka.LocalKafkaConfig:
        """A single-broker config sharing this cluster's jar cache (ensure_jars takes one)."""
        return local_kafka.LocalKafkaConfig(cache_dir=self.cache_dir, data_dir=self.data_dir)


@dataclass(frozen=True)
class ClusterStatus:
    running: bool
    bootstrap: str
    bootstrap_servers: list[str]
    data_dir: str
    nodes: list[dict[str, object]] = field(default_factory=list)
    already_running: bool = False
    startup_seconds: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "running": self.running,
            "bootstrap": self.bootstrap,
            "bootstrap_servers": self.bootstrap_servers,
            "data_dir": self.data_dir,
            "brokers": len(self.nodes),
            "nodes": self.nodes,
            "already_running": self.already_running,
            "startup_seconds": self.startup_seconds,
        }


def server_properties(cfg: LocalClusterConfig, node: int) -> str:
    d = cfg.node_dir(node)
    port, cport = cfg.ports[node - 1], cfg.controller_ports[node - 1]
    voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(cfg.controller_ports))
    rf, isr = min(3, cfg.size), min(2, cfg.size)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(d / "logs"),
        "metadata.log.dir": str(d / "meta"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(isr),
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(isr),
        "group.initial.rebalance.delay.ms": "0",
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(isr),
        "delete.topic.enable": "true",
        # A node killed and restarted must catch up and lead again without an operator.
        "auto.leader.rebalance.enable": "true",
        "leader.imbalance.check.interval.seconds": "10",
        # A follower's fetch waits up to this for data, and an append does not always wake it
        # (measured: a transaction's writes, replicated to 3 nodes, flushed in 35-45 ms at the
        # default 500 ms, 8-16 ms at 50). Only idle fetches come back sooner.
        "replica.fetch.wait.max.ms": "50",
        # Laptop-sized: three JVMs share the machine.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.replica.fetchers": "1",
        "background.threads": "2",
        "log.cleaner.threads": "1",
    }
    if cfg.broker_session_ms is not None:
        props["broker.session.timeout.ms"] = str(cfg.broker_session_ms)
        props["broker.heartbeat.interval.ms"] = str(max(250, min(2000, cfg.broker_session_ms // 4)))
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _format(cfg: LocalClusterConfig, node: int, java: str, libs: Path, cluster_id: str) -> None:
    d = cfg.node_dir(node)
    if (d / "meta" / "meta.properties").exists():
        return
    proc = subprocess.run(
        [
            java,
            "-Xmx128m",
            f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(d / "server.properties"),
            "--ignore-formatted",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise LocalKafkaError(
            f"formatting KRaft storage of node {node} in {d} failed (exit {proc.returncode}):\n"
            + (proc.stdout + proc.stderr).strip()[-3000:]
        )


def _read_state(cfg: LocalClusterConfig) -> dict[str, object]:
    try:
        state = orjson.loads(cfg.state_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(cfg: LocalClusterConfig, state: dict[str, object]) -> None:
    tmp = cfg.state_file.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    os.replace(tmp, cfg.state_file)


def _is_our_node(pid: int, cfg: LocalClusterConfig, node: int) -> bool:
    props = str(cfg.node_dir(node) / "server.properties")
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "kafka.Kafka" in cmdline and props in cmdline


def node_pid(cfg: LocalClusterConfig, node: int) -> int | None:
    """The pid of node `node` when it runs (and is ours: guards against pid reuse)."""
    pids = _read_state(cfg).get("pids")
    pid = pids.get(str(node)) if isinstance(pids, dict) else None
    if isinstance(pid, int) and local_kafka._pid_alive(pid) and _is_our_node(pid, cfg, node):
        return pid
    return None


def _status(cfg: LocalClusterConfig, **extra: object) -> ClusterStatus:
    nodes = []
    for n in range(1, cfg.size + 1):
        nodes.append(
            {
                "node": n,
                "bootstrap": cfg.node_bootstrap(n),
                "controller_port": cfg.controller_ports[n - 1],
                "pid": node_pid(cfg, n),
                "log_file": str(cfg.node_dir(n) / local_kafka.LOG_FILE),
            }
        )
    return ClusterStatus(
        running=all(x["pid"] is not None for x in nodes),
        bootstrap=cfg.bootstrap,
        bootstrap_servers=[f"127.0.0.1:{p}" for p in cfg.ports],
        data_dir=str(cfg.data_dir),
        nodes=nodes,
        **extra,  # type: ignore[arg-type]
    )


def get_status(cfg: LocalClusterConfig) -> ClusterStatus:
    return _status(cfg)


def _spawn(cfg: LocalClusterConfig, node: int, java: str, libs: Path) -> int:
    d = cfg.node_dir(node)
    cmd = [
        java,
        f"-Xms{cfg.heap}",
        f"-Xmx{cfg.heap}",
        f"-Xmn{cfg.young}",
        "-XX:+UseSerialGC",  # one GC thread per node: three nodes share two cores with the clients
        "-Xss512k",
        *_shared_archive(cfg, java),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={d}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(d / "server.properties"),
    ]
    with open(d / local_kafka.LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def _shared_archive(cfg: LocalClusterConfig, java: str) -> list[str]:
    """Map the single broker's class-data-sharing archive when one was recorded (starts ~2x
    faster); nodes never record one themselves (local_kafka._class_data_sharing)."""
    flags, pending = local_kafka._class_data_sharing(cfg.jars(), java)
    return flags if pending is None else []


def _record_pid(cfg: LocalClusterConfig, node: int, pid: int | None) -> None:
    state = _read_state(cfg)
    pids = state.get("pids")
    pids = dict(pids) if isinstance(pids, dict) else {}
    if pid is None:
        pids.pop(str(node), None)
    else:
        pids[str(node)] = pid
    state.update(
        pids=pids,
        ports=list(cfg.ports),
        controller_ports=list(cfg.controller_ports),
        bootstrap=cfg.bootstrap,
        kafka_version=local_kafka.KAFKA_VERSION,
    )
    _write_state(cfg, state)


def _prepare(cfg: LocalClusterConfig) -> tuple[str, Path]:
    java = local_kafka.require_tool("java", "run the local Kafka cluster")
    libs = local_kafka.ensure_jars(cfg.jars())
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    state = _read_state(cfg)
    cluster_id = state.get("cluster_id")
    if not isinstance(cluster_id, str):
        cluster_id = local_kafka._cluster_id()
        _write_state(cfg, {**state, "cluster_id": cluster_id})
    for n in range(1, cfg.size + 1):
        d = cfg.node_dir(n)
        d.mkdir(parents=True, exist_ok=True)
        (d / "server.properties").write_text(server_properties(cfg, n))
        log4j = local_kafka.log4j2_properties(local_kafka.LocalKafkaConfig(data_dir=d))
        (d / "log4j2.properties").write_text(log4j)
        _format(cfg, n, java, libs, cluster_id)
    return java, libs


def _brokers_seen(cfg: LocalClusterConfig, via: str) -> int:
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": via, "log_level": 0}).list_topics(timeout=1.0)
    except Exception:
        return 0
    return len(md.brokers)


def wait_brokers(cfg: LocalClusterConfig, count: int, timeout: float, via: str | None = None) -> None:
    """Wait until the cluster's metadata names `count` brokers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for n in range(1, cfg.size + 1):
            if node_pid(cfg, n) is None and via is None:
                continue
            if _brokers_seen(cfg, via or cfg.node_bootstrap(n)) >= count:
                return
        time.sleep(0.3)
    tails = "\n".join(
        f"node {n}: " + local_kafka.tail(cfg.node_dir(n) / local_kafka.LOG_FILE, 8)
        for n in range(1, cfg.size + 1)
    )
    raise LocalKafkaError(f"the local cluster did not show {count} brokers within {timeout:.0f}s:\n{tails}")


def up(cfg: LocalClusterConfig, timeout: float = 180.0) -> ClusterStatus:
    """Start every node that is not running, wait until the cluster names all of them."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.monotonic()
        if get_status(cfg).running:
            wait_brokers(cfg, cfg.size, timeout)
            return _status(cfg, already_running=True)
        for n in range(1, cfg.size + 1):
            if node_pid(cfg, n) is not None:
                continue
            for port in (cfg.ports[n - 1], cfg.controller_ports[n - 1]):
                if not local_kafka._port_free(port):
                    raise LocalKafkaError(
                        f"port {port} (node {n} of the local cluster) on 127.0.0.1 is taken by another "
                        f"process; choose another base port (RUNFOLD_KAFKA_PORT, --base-port) or stop it"
                    )
        java, libs = _prepare(cfg)
        for n in range(1, cfg.size + 1):  # all at once: the controller quorum needs a majority
            if node_pid(cfg, n) is None:
                _record_pid(cfg, n, _spawn(cfg, n, java, libs))
        try:
            wait_brokers(cfg, cfg.size, timeout)
        except LocalKafkaError:
            down(cfg, grace=10.0)
            raise
        return _status(cfg, startup_seconds=round(time.monotonic() - t0, 2))


def start_node(cfg: LocalClusterConfig, node: int, timeout: float = 120.0) -> int:
    """Start one node (after kill_node/stop_node) and wait until the cluster names it again."""
    pid = node_pid(cfg, node)
    if pid is not None:
        return pid
    java, libs = _prepare(cfg)
    pid = _spawn(cfg, node, java, libs)
    _record_pid(cfg, node, pid)
    wait_brokers(cfg, cfg.size, timeout, via=cfg.node_bootstrap(node))
    return pid


def kill_node(cfg: LocalClusterConfig, node: int) -> None:
    """SIGKILL one node: the broker lost without a controlled shutdown."""
    pid = node_pid(cfg, node)
    if pid is None:
        raise LocalKafkaError(f"node {node} of the local cluster is not running")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while local_kafka._pid_alive(pid):
        if time.monotonic() > deadline:
            raise LocalKafkaError(f"node {node} (pid {pid}) survived SIGKILL")
        time.sleep(0.05)
    _record_pid(cfg, node, None)


def stop_node(cfg: LocalClusterConfig, node: int, grace: float = 60.0) -> None:
    """A clean stop of one node (SIGTERM: the controlled shutdown moves its leaderships first)."""
    pid = node_pid(cfg, node)
    if pid is not None:
        local_kafka._terminate(pid, grace)
    _record_pid(cfg, node, None)


def down(cfg: LocalClusterConfig, grace: float = 30.0) -> ClusterStatus:
    """Stop every node (all at once: a controlled shutdown of the last ones needs no quorum
    for long). Returns the status before."""
    before = get_status(cfg)
    pids = [(n, node_pid(cfg, n)) for n in range(1, cfg.size + 1)]
    for _, pid in pids:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
    for n, pid in pids:
        if pid is not None:
            local_kafka._terminate(pid, grace)
        _record_pid(cfg, n, None)
    return before


def config_from_state(data_dir: Path | str | None = None) -> LocalClusterConfig | None:
    """The cluster recorded in a data dir (what `down` without --brokers stops), or None."""
    dd = (
        Path(data_dir or os.environ.get("RUNFOLD_KAFKA_CLUSTER_DIR", DEFAULT_DATA_DIR)).expanduser().resolve()
    )
    try:
        state = orjson.loads((dd / STATE_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    ports, cports = state.get("ports"), state.get("controller_ports")
    if not (isinstance(ports, list) and isinstance(cports, list) and ports):
        return None
    return LocalClusterConfig.from_env(
        brokers=len(ports), data_dir=dd, ports=tuple(ports), controller_ports=tuple(cports)
    )


def free_ports(count: int) -> tuple[int, ...]:
    """`count` distinct free loopback ports (a throwaway cluster's brokers and controllers)."""
    import socket

    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def free_base_port(brokers: int, low: int = 20_000, high: int = 40_000) -> int:
    """A base port whose `brokers` ports and controller ports (base+100...) are all free now."""
    import random

    for _ in range(200):
        base = random.randrange(low, high)
        wanted = [base + i for i in range(brokers)] + [base + CONTROLLER_OFFSET + i for i in range(brokers)]
        if all(local_kafka._port_free(p) for p in wanted):
            return base
    raise LocalKafkaError(f"no free run of {brokers} ports found between {low} and {high}")
