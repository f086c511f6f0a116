"""A local Apache Kafka broker from Maven Central jars: no Docker needed.

One JVM runs broker + controller (KRaft) on loopback, replication factor 1 for
the internal topics. The jars are fetched once by Maven into a user cache and
later starts work offline.

Public interface (used by `runfold kafka ...`, `scripts/*.sh` and `tests/conftest.py`)::

    cfg = LocalKafkaConfig.from_env()       # RUNFOLD_KAFKA_PORT, RUNFOLD_KAFKA_CONTROLLER_PORT,
                                            # RUNFOLD_KAFKA_DATA_DIR, RUNFOLD_CACHE_DIR
    status = up(cfg)                        # idempotent; returns BrokerStatus (running, pid, bootstrap)
    status = get_status(cfg)
    down(cfg)                               # SIGTERM, then SIGKILL after a grace period

Errors are `LocalKafkaError` with a message that says what is missing or
wrong, and (for a broker that did not come up) the tail of the broker log.

Files in the data dir (default `.runfold/kafka` under the current directory):
`server.properties`, `log4j2.properties`, `broker.json` (pid + ports, the
state file `status` and `down` read), `broker.log` (stdout/stderr and log4j
output), `logs/` (topic data) and `meta/` (KRaft metadata).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

# Keep in step with <kafka.version> in topology/kafka-broker-pom.xml.
KAFKA_VERSION = "4.1.1"
DEFAULT_PORT = 9092
POM_PATH = Path(__file__).with_name("kafka-broker-pom.xml")
STATE_FILE = "broker.json"
LOG_FILE = "broker.log"
_COMPLETE_MARKER = ".complete"


class LocalKafkaError(RuntimeError):
    """The local broker could not be fetched, started, found or stopped."""


def _port_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    # isdecimal, not isdigit: "²" is a digit int() refuses
    if not raw.strip().isdecimal() or not 0 < int(raw) < 65_536:
        raise LocalKafkaError(f"{name}={raw!r} is not a port number (1-65535)")
    return int(raw)


@dataclass(frozen=True)
class LocalKafkaConfig:
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_PORT + 1
    data_dir: Path = Path(".runfold/kafka")
    cache_dir: Path = Path.home() / ".cache" / "runfold"
    # Sized for a laptop (docs/benchmarks.md, "The local broker on a laptop"): 512 MB, half of it
    # young. The broker allocates ~35 MB/s under the benchmarks, and each young collection pauses
    # every request whatever its size, so the young generation stays large (docs/runtime.md,
    # "Broker GC"). Kafka's 1 GB default cost the whole dev tree (broker + processor + worker)
    # ~230 MiB more PSS for the same workflow throughput; 384 MB lost throughput.
    heap: str = "512m"
    young: str = "256m"
    # The log cleaner's dedupe buffer is allocated in the heap when the broker starts and stays
    # resident (Kafka's default 128 MiB, a quarter of this heap); the dev broker compacts only
    # small topics (run-state, definitions), which 16 MiB holds ~500,000 keys of.
    cleaner_dedupe_bytes: int = 16 * 2**20
    # glibc's malloc arenas (MALLOC_ARENA_MAX): 2 instead of 8 per core for the JVM's native
    # allocations; 0 leaves glibc's default.
    malloc_arenas: int = 2

    @classmethod
    def from_env(
        cls,
        port: int | None = None,
        controller_port: int | None = None,
        data_dir: Path | str | None = None,
        cache_dir: Path | str | None = None,
    ) -> LocalKafkaConfig:
        """Explicit arguments win over the environment, which wins over the defaults."""
        env = os.environ
        p = port if port is not None else _port_from_env("RUNFOLD_KAFKA_PORT", DEFAULT_PORT)
        cp = (
            controller_port
            if controller_port is not None
            else _port_from_env("RUNFOLD_KAFKA_CONTROLLER_PORT", p + 1)
        )
        dd = Path(data_dir if data_dir is not None else env.get("RUNFOLD_KAFKA_DATA_DIR", ".runfold/kafka"))
        default_cache = Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "runfold"
        cd = Path(cache_dir if cache_dir is not None else env.get("RUNFOLD_CACHE_DIR", default_cache))
        if p == cp:
            raise LocalKafkaError(f"broker port and controller port are both {p}; they must differ")
        return cls(port=p, controller_port=cp, data_dir=dd.expanduser().resolve(), cache_dir=cd.expanduser())

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def libs_dir(self) -> Path:
        return self.cache_dir / f"kafka-{KAFKA_VERSION}" / "libs"

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def state_file(self) -> Path:
        return self.data_dir / STATE_FILE


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    bootstrap: str
    data_dir: str
    log_file: str
    pid: int | None = None
    started_at: float | None = None
    already_running: bool = False
    startup_seconds: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --------------------------------------------------------------------------- jars


def require_tool(name: str, purpose: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LocalKafkaError(
            f"`{name}` was not found on PATH; it is needed to {purpose}. "
            f"Install it (e.g. a Java 17+ JDK and Apache Maven), or set KAFKA_BOOTSTRAP_SERVERS "
            f"to use an existing Kafka cluster."
        )
    return path


def ensure_jars(cfg: LocalKafkaConfig) -> Path:
    """Fetch the broker jars into the cache once (under a file lock); return the libs dir."""
    libs = cfg.libs_dir
    if (libs / _COMPLETE_MARKER).exists():
        return libs
    mvn = require_tool("mvn", f"fetch the Apache Kafka {KAFKA_VERSION} broker jars (once)")
    libs.parent.mkdir(parents=True, exist_ok=True)
    with open(libs.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching the same jars
        if (libs / _COMPLETE_MARKER).exists():
            return libs
        staging = libs.parent / f"libs.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM_PATH),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            out = (proc.stdout + proc.stderr).strip().splitlines()[-25:]
            raise LocalKafkaError(
                f"Maven could not fetch the Kafka {KAFKA_VERSION} broker jars (exit {proc.returncode}):\n"
                + "\n".join(out)
            )
        if not any(staging.glob("kafka_2.13-*.jar")):
            raise LocalKafkaError(f"Maven finished but no kafka_2.13 jar is in {staging}")
        (staging / _COMPLETE_MARKER).write_text(KAFKA_VERSION + "\n")
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    return libs


# --------------------------------------------------------------------------- config files


def server_properties(cfg: LocalKafkaConfig) -> str:
    d = cfg.data_dir
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # A static voter set (not --standalone) so the controller port can change between starts.
        "controller.quorum.voters": f"1@127.0.0.1:{cfg.controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{cfg.port},CONTROLLER://127.0.0.1:{cfg.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{cfg.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(d / "logs"),
        "metadata.log.dir": str(d / "meta"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "min.insync.replicas": "1",
        "default.replication.factor": "1",
        "delete.topic.enable": "true",
        # Laptop-sized: fewer threads, small segments so retention tests finish.
        "num.network.threads": "2",
        "num.io.threads": "4",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(cfg.cleaner_dedupe_bytes),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def log4j2_properties(cfg: LocalKafkaConfig) -> str:
    return f"""status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {cfg.log_file}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
"""


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, base64url without padding (what `random-uuid` prints).
    Like Kafka's Uuid.randomUuid, never one starting with '-': the storage tool would take
    `--cluster-id -…` for an option and refuse to format (1 start in 64)."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cid


def _format_storage(cfg: LocalKafkaConfig, java: str, libs: Path, props: Path) -> None:
    if (cfg.data_dir / "meta" / "meta.properties").exists():
        return
    cmd = [
        java,
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={cfg.data_dir / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        _cluster_id(),
        "--config",
        str(props),
        "--ignore-formatted",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LocalKafkaError(
            f"formatting KRaft storage in {cfg.data_dir} failed (exit {proc.returncode}):\n"
            + (proc.stdout + proc.stderr).strip()[-3000:]
        )


# --------------------------------------------------------------------------- processes


def _pid_alive(pid: int) -> bool:
    """True when `pid` runs (a zombie child is reaped and counts as gone)."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _is_our_broker(pid: int, cfg: LocalKafkaConfig) -> bool:
    """Guards against pid reuse: the process must be a kafka.Kafka JVM using our properties file."""
    props = str(cfg.data_dir / "server.properties")
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        out = subprocess.run(
            ["ps", "-p", str(pid), "-o", "command="], capture_output=True, text=True, check=False
        )
        cmdline = out.stdout
    return "kafka.Kafka" in cmdline and props in cmdline


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port_pair() -> tuple[int, int]:
    """Two distinct free loopback ports (broker, controller), for tests and throwaway brokers."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for s in socks:
            s.close()


def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a broker at `bootstrap` answers a metadata request within `timeout` seconds (the
    local broker: no security settings)."""
    from confluent_kafka.admin import AdminClient

    from topology.settings import cluster_answers

    return cluster_answers(
        AdminClient(
            {
                "bootstrap.servers": bootstrap,
                "log_level": 0,
                "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000)),
            }
        ),
        timeout,
    )


def tail(path: Path, lines: int = 30) -> str:
    try:
        data = path.read_bytes()[-20000:].decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


def _read_state(cfg: LocalKafkaConfig) -> dict[str, object] | None:
    try:
        state = orjson.loads(cfg.state_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return state if isinstance(state, dict) else None


def _live_pid(cfg: LocalKafkaConfig) -> int | None:
    """The pid of the broker recorded in the state file, if that process still runs and is ours."""
    state = _read_state(cfg)
    if state is None:
        return None
    pid = state.get("pid")
    if isinstance(pid, int) and _pid_alive(pid) and _is_our_broker(pid, cfg):
        return pid
    return None


def _status(cfg: LocalKafkaConfig, pid: int | None, **extra: object) -> BrokerStatus:
    state = _read_state(cfg) or {}
    started = state.get("started_at")
    return BrokerStatus(
        running=pid is not None,
        bootstrap=cfg.bootstrap,
        data_dir=str(cfg.data_dir),
        log_file=str(cfg.log_file),
        pid=pid,
        started_at=float(started) if isinstance(started, int | float) and pid else None,
        **extra,  # type: ignore[arg-type]
    )


def get_status(cfg: LocalKafkaConfig) -> BrokerStatus:
    return _status(cfg, _live_pid(cfg))


def _wait_ready(cfg: LocalKafkaConfig, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            raise LocalKafkaError(
                f"the local Kafka broker (pid {pid}) exited during startup. Last lines of {cfg.log_file}:\n"
                + tail(cfg.log_file)
            )
        if broker_answers(cfg.bootstrap, timeout=1.0):
            return
        time.sleep(0.2)
    raise LocalKafkaError(
        f"the local Kafka broker (pid {pid}) did not answer on {cfg.bootstrap} within {timeout:.0f}s. "
        f"Last lines of {cfg.log_file}:\n" + tail(cfg.log_file)
    )


def up(cfg: LocalKafkaConfig, timeout: float = 90.0) -> BrokerStatus:
    """Start the broker (fetching jars and formatting storage first if needed); no-op if it runs."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent `up` on the same data dir waits, then sees ours
        return _up_locked(cfg, timeout)


def _up_locked(cfg: LocalKafkaConfig, timeout: float) -> BrokerStatus:
    t0 = time.monotonic()
    pid = _live_pid(cfg)
    if pid is not None:
        _wait_ready(cfg, pid, timeout)  # it may still be starting (a concurrent `up`)
        return _status(cfg, pid, already_running=True)
    for port, what in ((cfg.port, "broker"), (cfg.controller_port, "controller")):
        if not _port_free(port):
            raise LocalKafkaError(
                f"port {port} (Kafka {what} listener) on 127.0.0.1 is taken by another process, not by a "
                f"runfold broker with data dir {cfg.data_dir}. Stop that process, choose other ports with "
                f"RUNFOLD_KAFKA_PORT / RUNFOLD_KAFKA_CONTROLLER_PORT, or set KAFKA_BOOTSTRAP_SERVERS to use "
                f"the cluster that is already there."
            )
    java = require_tool("java", "run the local Kafka broker")
    libs = ensure_jars(cfg)
    props = cfg.data_dir / "server.properties"
    props.write_text(server_properties(cfg))
    log4j = cfg.data_dir / "log4j2.properties"
    log4j.write_text(log4j2_properties(cfg))
    _format_storage(cfg, java, libs, props)
    cds_flags, cds_pending = _class_data_sharing(cfg, java)
    # -Xms as -Xmx: a heap that starts small makes Parallel GC's sizing run full collections
    # (0.2-0.5 s each) in the first minute instead of growing the old generation.
    cmd = [
        java,
        f"-Xms{cfg.heap}",
        f"-Xmx{cfg.heap}",
        f"-Xmn{cfg.young}",
        "-XX:+UseParallelGC",
        *_gc_log_flags(cfg.data_dir / "gc.log"),
        *cds_flags,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.dir={cfg.data_dir}",
        "-cp",
        f"{libs}/*",
        "kafka.Kafka",
        str(props),
    ]
    env = {**os.environ, **({"MALLOC_ARENA_MAX": str(cfg.malloc_arenas)} if cfg.malloc_arenas else {})}
    with open(cfg.log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    state = {
        "pid": proc.pid,
        "port": cfg.port,
        "controller_port": cfg.controller_port,
        "bootstrap": cfg.bootstrap,
        "started_at": time.time(),
        "kafka_version": KAFKA_VERSION,
        "cds_pending": cds_pending,
    }
    cfg.state_file.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    try:
        _wait_ready(cfg, proc.pid, timeout)
    except LocalKafkaError:
        _terminate(proc.pid, grace=10.0)
        cfg.state_file.unlink(missing_ok=True)
        raise
    return _status(cfg, proc.pid, startup_seconds=round(time.monotonic() - t0, 2))


def _terminate(pid: int, grace: float) -> None:
    """SIGTERM the broker's process group (a controlled shutdown), SIGKILL after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            raise LocalKafkaError(f"the local Kafka broker (pid {pid}) survived SIGKILL")
        time.sleep(0.1)


def down(cfg: LocalKafkaConfig, grace: float = 30.0) -> BrokerStatus:
    """Stop the broker recorded in the data dir; a no-op when none runs. Returns the status before."""
    pid = _live_pid(cfg)
    before = _status(cfg, pid)
    state = _read_state(cfg) or {}
    if pid is not None:
        _terminate(pid, grace)
        _publish_archive(state.get("cds_pending"))
    cfg.state_file.unlink(missing_ok=True)
    return before


def _gc_log_flags(path: Path) -> list[str]:
    """The broker's GC log (two 10 MB files). Quoted, for a path with `:`; none for a path with
    `%`, which -Xlog expands (%p, %t) and cannot escape."""
    if "%" in str(path):
        return []
    return [f'-Xlog:gc:file="{path}"::filecount=2,filesize=10m']


def _class_data_sharing(cfg: LocalKafkaConfig, java: str) -> tuple[list[str], str | None]:
    """JVM flags for a class-data-sharing archive of the broker's classes (starts ~2x faster).

    The first broker records the archive as it exits (to a temporary name `down` publishes);
    later brokers map it. The archive is tied to the JVM binary, so its name hashes it.
    RUNFOLD_KAFKA_CDS=0 turns this off.
    """
    if os.environ.get("RUNFOLD_KAFKA_CDS", "1") == "0":
        return [], None
    real = os.path.realpath(java)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    archive = cfg.libs_dir.parent / f"broker-{key}.jsa"
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=error"], None
    for stale in archive.parent.glob(f"{archive.name}.tmp-*"):
        if time.time() - stale.stat().st_mtime > 3600:  # left by a broker that was SIGKILLed
            stale.unlink(missing_ok=True)
    pending = archive.with_name(f"{archive.name}.tmp-{uuid.uuid4().hex[:8]}")
    return [f"-XX:ArchiveClassesAtExit={pending}", "-Xlog:cds*=error"], str(pending)


def _publish_archive(pending: object) -> None:
    if not isinstance(pending, str) or not pending:
        return
    tmp = Path(pending)
    final = tmp.with_name(tmp.name.split(".tmp-")[0])
    if tmp.exists() and tmp.stat().st_size > 0 and not final.exists():
        os.replace(tmp, final)
    else:
        tmp.unlink(missing_ok=True)
