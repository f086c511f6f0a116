"""Which Kafka runfold talks to: the one code path for the CLI, the demo scripts and the tests.

Rules, first match wins:

1. `RUNFOLD_BROKER` forces a kind: `external`, `docker` or `local`.
2. `KAFKA_BOOTSTRAP_SERVERS` is set          -> `external`: use that cluster, start nothing.
3. a Docker engine answers `docker info`     -> `docker`: `docker-compose.kafka.yml` (CLI) or a
                                                Testcontainers KafkaContainer (tests).
4. otherwise                                 -> `local`: the Apache Kafka broker from Maven jars
                                                (`topology.local_kafka`).

    choice = choose_broker()           # BrokerChoice(kind, reason)
    bootstrap = start_broker(choice)   # what `runfold kafka up` does; returns bootstrap servers
    stop_broker(choice)                # what `runfold kafka down` does

Errors are `BrokerError` and always name the chosen kind and why it was chosen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from topology import local_kafka

BrokerKind = Literal["external", "docker", "local"]
KINDS: tuple[BrokerKind, ...] = ("external", "docker", "local")
COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.kafka.yml"
DOCKER_BOOTSTRAP = "127.0.0.1:9092"


class BrokerError(RuntimeError):
    """A broker could not be selected, reached, started or stopped."""


@dataclass(frozen=True)
class BrokerChoice:
    kind: BrokerKind
    reason: str
    bootstrap: str | None = None  # known up front for `external`

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def docker_engine_running(timeout: float = 3.0) -> bool:
    """True when a `docker` CLI exists and its engine answers within `timeout` seconds."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        proc = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def choose_broker(env: dict[str, str] | None = None, docker_check: bool = True) -> BrokerChoice:
    env = dict(os.environ) if env is None else env
    forced = env.get("RUNFOLD_BROKER", "").strip().lower()
    bootstrap = env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip() or None
    if forced:
        if forced not in KINDS:
            raise BrokerError(f"RUNFOLD_BROKER={forced!r} is not one of {', '.join(KINDS)}")
        if forced == "external" and bootstrap is None:
            raise BrokerError("RUNFOLD_BROKER=external but KAFKA_BOOTSTRAP_SERVERS is not set")
        return BrokerChoice(forced, f"RUNFOLD_BROKER={forced}", bootstrap if forced == "external" else None)
    if bootstrap is not None:
        return BrokerChoice("external", f"KAFKA_BOOTSTRAP_SERVERS={bootstrap} is set", bootstrap)
    if docker_check and docker_engine_running():
        return BrokerChoice("docker", "a Docker engine is running")
    return BrokerChoice("local", "KAFKA_BOOTSTRAP_SERVERS is not set and no Docker engine is running")


def _fail(choice: BrokerChoice, what: str) -> BrokerError:
    return BrokerError(f"{choice.kind} broker (chosen because {choice.reason}): {what}")


def _wait_answers(bootstrap: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if local_kafka.broker_answers(bootstrap, timeout=1.0):
            return True
        time.sleep(0.5)
    return False


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    docker = shutil.which("docker") or "docker"
    return subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), *args], capture_output=True, text=True, check=False
    )


def start_broker(
    choice: BrokerChoice, local_cfg: local_kafka.LocalKafkaConfig | None = None, timeout: float = 90.0
) -> str:
    """Make sure the chosen broker runs and answers; return its bootstrap servers."""
    if choice.kind == "external":
        assert choice.bootstrap is not None
        if not _wait_answers(choice.bootstrap, min(timeout, 15.0)):
            raise _fail(choice, f"no broker answered a metadata request at {choice.bootstrap}")
        return choice.bootstrap
    if choice.kind == "docker":
        proc = _compose("up", "-d")
        if proc.returncode != 0:
            raise _fail(choice, f"`docker compose up -d` failed:\n{proc.stderr.strip()[-2000:]}")
        if not _wait_answers(DOCKER_BOOTSTRAP, timeout):
            logs = _compose("logs", "--tail", "30").stdout
            raise _fail(
                choice, f"the container did not answer on {DOCKER_BOOTSTRAP} in {timeout:.0f}s:\n{logs}"
            )
        return DOCKER_BOOTSTRAP
    try:
        cfg = local_cfg or local_kafka.LocalKafkaConfig.from_env()
        return local_kafka.up(cfg, timeout=timeout).bootstrap
    except local_kafka.LocalKafkaError as e:
        raise _fail(choice, str(e)) from e


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _our_local_broker(
    bootstrap: str | None, local_cfg: local_kafka.LocalKafkaConfig | None
) -> tuple[local_kafka.LocalKafkaConfig, local_kafka.BrokerStatus] | None:
    """The local broker runfold started (recorded in its data dir, still running), when
    `bootstrap` names it: `kafka up` prints `export KAFKA_BOOTSTRAP_SERVERS=...` for it, so
    that variable being set does not make it someone else's cluster."""
    try:
        cfg = local_cfg or local_kafka.LocalKafkaConfig.from_env()
    except local_kafka.LocalKafkaError:
        return None
    status = local_kafka.get_status(cfg)
    if not status.running:
        return None
    for server in (bootstrap or "").split(","):
        host, _, port = server.strip().rpartition(":")
        if host.lower() in _LOOPBACK and port == str(cfg.port):
            return cfg, status
    return None


def stop_broker(choice: BrokerChoice, local_cfg: local_kafka.LocalKafkaConfig | None = None) -> str:
    """Stop what `start_broker` started; say what was done. An external cluster is left alone,
    unless its bootstrap servers name the local broker runfold started (`_our_local_broker`)."""
    if choice.kind == "external":
        ours = _our_local_broker(choice.bootstrap, local_cfg)
        if ours is None:
            return f"external cluster {choice.bootstrap} left running (runfold did not start it)"
        cfg, status = ours
        try:
            local_kafka.down(cfg)
        except local_kafka.LocalKafkaError as e:
            raise _fail(choice, str(e)) from e
        return (
            f"local Kafka broker (pid {status.pid}, {status.bootstrap}) stopped: runfold started it "
            f"(data dir {cfg.data_dir}), and KAFKA_BOOTSTRAP_SERVERS points at it"
        )
    if choice.kind == "docker":
        proc = _compose("down", "-v")
        if proc.returncode != 0:
            raise _fail(choice, f"`docker compose down` failed:\n{proc.stderr.strip()[-2000:]}")
        return "docker compose Kafka stopped"
    try:
        cfg = local_cfg or local_kafka.LocalKafkaConfig.from_env()
        before = local_kafka.down(cfg)
    except local_kafka.LocalKafkaError as e:
        raise _fail(choice, str(e)) from e
    if before.running:
        return f"local Kafka broker (pid {before.pid}, {before.bootstrap}) stopped"
    return f"no local Kafka broker was running with data dir {cfg.data_dir}"
