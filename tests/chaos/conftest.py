"""Chaos suite fixtures: the suite's OWN local broker (never the shared dev broker), per-test
topologies, sizes from the environment, and the per-scenario summary at the end.

Sizes (CI defaults; raise them for a soak):
  RUNFOLD_CHAOS_RUNS   runs of the processor kill -9 scenario (default 400)
  RUNFOLD_CHAOS_KILLS  processor kill -9 count (default 5)

    .venv/bin/pytest -m chaos tests/chaos            # ~5 minutes on 2 cores (stopping: +35 s)
    RUNFOLD_CHAOS_RUNS=1000 RUNFOLD_CHAOS_KILLS=10 .venv/bin/pytest -m chaos tests/chaos
"""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # processor_support

from broker_support import own_broker
from checks import RESULTS
from processor_support import make_settings, setup_topology

from processors.runtime.settings import ProcessorSettings
from topology import local_cluster, local_kafka
from topology.admin import delete_topology

WF = "runfold.workflow/v1"


def _noop_chain(wid: str, steps: int) -> dict[str, Any]:
    names = [chr(ord("a") + i) for i in range(steps)]
    return {
        "schema": WF,
        "id": wid,
        "revision": 1,
        "state": {},
        "entry": [names[0]],
        "nodes": {n: {"kind": "action", "action": "noop"} for n in names},
        "routes": {a: [b] for a, b in itertools.pairwise(names)},
    }


DEFINITIONS = [
    _noop_chain("noop3", 3),
    # two 300 ms sleeps on short leases: a killed worker's activation expires and is retried
    {
        "schema": WF,
        "id": "slow2",
        "revision": 1,
        "state": {},
        "entry": ["a"],
        "routes": {"a": ["b"]},
        "nodes": {
            n: {
                "kind": "action",
                "action": "sleep",
                "input": {"from": "literal", "value": {"ms": 300}},
                "lease_ms": 1500,
                "heartbeat_ms": 300,
                "retry": {"max_attempts": 6, "backoff_ms": 100},
            }
            for n in ("a", "b")
        },
    },
    {
        "schema": WF,
        "id": "strict",
        "revision": 1,
        "state": {},
        "entry": ["a"],
        "input_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
        "nodes": {"a": {"kind": "action", "action": "noop"}},
    },
]


@pytest.fixture(scope="session")
def chaos_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kafka.LocalKafkaConfig]:
    """A broker of the suite's own (free ports, temporary data dir): the broker-restart
    scenario restarts it; nothing here touches a shared broker."""
    with own_broker(tmp_path_factory.mktemp("chaos-kafka"), "the chaos suite's") as cfg:
        yield cfg


@pytest.fixture(scope="session")
def quiet_broker_bootstrap(request: pytest.FixtureRequest) -> str:
    """The broker of scenarios that never stop, freeze or restart the broker itself (the
    stopping scenarios freeze workers only): KAFKA_BOOTSTRAP_SERVERS when it is set (a
    developer's own broker, as for the integration tests), else the suite's own."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        return given
    broker: local_kafka.LocalKafkaConfig = request.getfixturevalue("chaos_broker")
    return broker.bootstrap


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_cluster.LocalClusterConfig]:
    """A local 3-node cluster of a module's own (RF 3, min ISR 2; free ports, a temporary data
    dir), stopped after the module: its scenarios kill, freeze and restart its nodes."""
    ports = local_cluster.free_ports(6)
    cfg = local_cluster.LocalClusterConfig.from_env(
        brokers=3,
        ports=ports[:3],
        controller_ports=ports[3:],
        data_dir=tmp_path_factory.mktemp("chaos-cluster"),
    )
    try:
        local_cluster.up(cfg, timeout=240)
    except local_kafka.LocalKafkaError as e:
        pytest.fail(f"the chaos suite's 3-node cluster did not start: {e}", pytrace=False)
    try:
        yield cfg
    finally:
        local_cluster.down(cfg)


@pytest.fixture
def chaos_settings(chaos_broker: local_kafka.LocalKafkaConfig, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(
        chaos_broker.bootstrap,
        f"c{uuid.uuid4().hex[:8]}",
        tmp_path / "state",
        commit_interval_ms=50,
        activation_queues=("default", "agents"),
    )
    setup_topology(s, DEFINITIONS)
    yield s
    try:
        delete_topology(s)
    except Exception as e:  # a broker the test broke must not hide the test's own failure
        print(f"cleanup of {s.topic_prefix} failed: {e}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    terminalreporter.section("runfold chaos summary")
    for r in RESULTS:
        terminalreporter.write_line(
            f"{r['scenario']}: runs {r['runs_started']} started / {r['runs_accepted']} accepted / "
            f"{r['runs_terminal']} terminal {r['terminal_by_type']}; events {r['events']}; "
            f"StepSucceeded {r['step_succeeded']} (0 duplicated); retried attempts {r['retried_attempts']}; "
            f"garbage {r['garbage_sent']} -> dead letters {r['dead_letters']}; bad commands {r['bad_commands']} -> "
            f"RunRejected {r['rejections']}; replay --verify {r['replay_runs_checked']} runs, "
            f"{r['replay_differences']} differences; {r['extra']}"
        )
