"""A broker restart under the long-running processes that are not the processor: a worker, the
child executor, `runfold index run` and `runfold ui` (its ingest in a thread) each carry on by
themselves, none exits, and each stopped by SIGTERM afterwards exits 0 (ExitCode.OK,
docs/runtime.md "Exit codes"). Runs with a child run are started before the restart, while it
happens and after it; every one succeeds and reaches both indexes.

The broker is this module's OWN (free ports, a temporary data dir, the project's launcher), never
the shared one. The processor runs too (the runs need it) and is restarted if it stops by itself:
its own recovery is the chaos suite's (tests/chaos/test_chaos.py, a broker restart under load)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_support import own_broker
from processor_support import Commands, make_settings, setup_topology, workflow

from processors.index.settings import open_reader
from processors.kafka.exits import ExitCode
from processors.runtime.settings import ProcessorSettings
from topology import local_kafka

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(480),
    pytest.mark.serial("restarts a broker of its own under five services: its timings assume the cores"),
]

NOOP3 = workflow(
    "noop3",
    {n: {"kind": "action", "action": "noop"} for n in ("a", "b", "c")},
    {"a": ["b"], "b": ["c"]},
)
PARENT = workflow("parent", {"child": {"kind": "workflow", "workflow": "noop3", "revision": 1}})
SERVICES = ("worker", "child-executor", "index", "ui")


@pytest.fixture(scope="module")
def restarted_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kafka.LocalKafkaConfig]:
    with own_broker(tmp_path_factory.mktemp("restarted-kafka"), "this test's") as cfg:
        yield cfg


class Services:
    """The processes, each a subprocess logging to its own file."""

    def __init__(self, settings: ProcessorSettings, tmp: Path) -> None:
        self.settings = settings
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.processor_exits: list[int] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))}
        self.env = {
            **env,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        }
        cli = [sys.executable, "-m", "processors.cli"]
        self.args = {
            "processor": [
                *cli,
                "processor",
                "--instance-id",
                "p1",
                "--state-dir",
                str(tmp / "state"),
                "--commit-interval-ms",
                "50",
            ],
            "worker": [*cli, "worker", "--queue", "default", "--log-level", "WARNING"],
            "child-executor": [*cli, "child-executor", "--instance-id", "c1"],
            "index": [*cli, "index", "run", "--db", str(tmp / "index.sqlite")],
            "ui": [*cli, "ui", "--port", "0", "--db", str(tmp / "ui.sqlite")],
        }

    def start(self, name: str) -> None:
        with (self.tmp / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                self.args[name], env=self.env, stdout=subprocess.DEVNULL, stderr=log
            )

    def supervise_processor(self) -> None:
        code = self.procs["processor"].poll()
        if code is not None:
            self.processor_exits.append(code)
            self.start("processor")

    def ended(self) -> dict[str, int]:
        return {n: p.returncode for n in SERVICES if (p := self.procs[n]).poll() is not None}

    def tails(self) -> str:
        return "\n".join(
            f"--- {n}\n" + (self.tmp / f"{n}.log").read_text(errors="replace")[-3000:] for n in self.procs
        )

    def stop_all(self) -> dict[str, int | None]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for n, p in self.procs.items():
            try:
                codes[n] = p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[n] = p.wait(10)
        return codes


def _statuses(db: Path, runs: list[str]) -> dict[str, Any]:
    if not db.exists():
        return {}
    index = open_reader(db)
    try:
        return {r: (row or {}).get("status") for r in runs if (row := index.get(r)) is not None}
    finally:
        index.close()


def _wait_succeeded(services: Services, runs: list[str], timeout: float, what: str) -> None:
    """Every run (and its child) succeeded in both indexes; no service but the processor ended."""
    everything = [*runs, *(f"{r}/child" for r in runs)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert not services.ended(), (what, services.ended(), services.tails())
        services.supervise_processor()
        seen = [_statuses(services.tmp / db, everything) for db in ("index.sqlite", "ui.sqlite")]
        if all(list(s.values()).count("succeeded") == len(everything) for s in seen):
            return
        time.sleep(1)
    raise AssertionError(f"{what}: not every run succeeded in both indexes: {seen}\n{services.tails()}")


def test_a_broker_restart_is_waited_out_by_the_worker_child_executor_index_and_ui(
    restarted_broker: local_kafka.LocalKafkaConfig, tmp_path: Path
) -> None:
    settings = make_settings(restarted_broker.bootstrap, f"r{uuid.uuid4().hex[:8]}", tmp_path / "state")
    setup_topology(settings, [NOOP3, PARENT])
    services = Services(settings, tmp_path)
    for name in ("processor", *SERVICES):
        services.start(name)
    commands = Commands(settings)
    try:
        before = [f"before-{i}" for i in range(5)]
        for run in before:
            commands.start(run, "parent")
        commands.flush()
        _wait_succeeded(services, before, 120, "before the restart")

        during = [f"during-{i}" for i in range(5)]
        for run in during:
            commands.start(run, "parent")
        commands.flush()
        local_kafka.down(restarted_broker)  # SIGTERM: a clean broker restart, runs in flight
        time.sleep(3)
        assert not services.ended(), (services.ended(), services.tails())
        local_kafka.up(restarted_broker, timeout=180)

        after = [f"after-{i}" for i in range(5)]
        for run in after:
            commands.start(run, "parent")
        commands.flush()
        _wait_succeeded(services, [*during, *after], 240, "after the restart")
    finally:
        codes = services.stop_all()
    assert {n: codes[n] for n in SERVICES} == dict.fromkeys(SERVICES, ExitCode.OK), (codes, services.tails())
    assert codes["processor"] == ExitCode.OK, (codes, services.tails())
    print(f"processor exits restarted: {services.processor_exits}")
