"""A local 3-node KRaft cluster through the real CLI (`kafka up --brokers 3`), the topics on it
with the replication it wants (RF 3, min ISR 2, read from the cluster), `topology verify`
failing on topics below that, and `kafka down` stopping every node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from topology import local_cluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial(
        "starts a 3-node cluster of its own: three JVMs, more than 2 cores share beside other tests"
    ),
]


def _run(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "topology", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.stdout.strip(), f"no JSON from {args}: {proc.stderr}"
    return proc.returncode, orjson.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.timeout(400)
def test_three_nodes_up_topics_at_rf_3_min_isr_2_verify_fails_below_down_stops_all(tmp_path: Path) -> None:
    base = local_cluster.free_base_port(3)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_") and k != "KAFKA_BOOTSTRAP_SERVERS"
    }
    env |= {
        "RUNFOLD_KAFKA_CLUSTER_DIR": str(tmp_path / "cluster"),
        # `kafka down` also stops the single local broker of this data dir: never the developer's
        "RUNFOLD_KAFKA_DATA_DIR": str(tmp_path / "single"),
        "RUNFOLD_BROKER": "local",
    }
    rc, up, err = _run(env, "kafka", "up", "--brokers", "3", "--base-port", str(base))
    pids = [n["pid"] for n in up.get("nodes", [])]
    try:
        assert rc == 0, (up, err)
        servers = [f"127.0.0.1:{base + i}" for i in range(3)]
        assert up["bootstrap_servers"] == servers and up["brokers"] == 3
        assert all(isinstance(p, int) for p in pids)
        topo = {**env, "KAFKA_BOOTSTRAP_SERVERS": up["bootstrap"], "RUNFOLD_TOPIC_PREFIX": "good"}
        topo.pop("RUNFOLD_BROKER")
        rc, created, err = _run(topo, "topology", "create")
        assert rc == 0, (created, err)
        assert created["replication"]["replication_factor"] == 3
        assert created["replication"]["min_insync_replicas"] == 2
        rc, check, err = _run(topo, "topology", "verify")
        assert rc == 0 and check["ok"], (check, err)
        assert check["warnings"] == []  # the launcher's internal topics are replicated 3 / min ISR 2
        assert check["found"] and all(
            f == {"replication_factor": 3, "min_insync_replicas": 2} for f in check["found"].values()
        ), check["found"]

        # Topics someone made by hand before runfold's defaults: RF 1, and RF 3 with min ISR 1.
        admin = AdminClient({"bootstrap.servers": up["bootstrap"]})
        bad = [
            NewTopic("bad.commands", num_partitions=2, replication_factor=1),
            NewTopic(
                "bad.receipts", num_partitions=2, replication_factor=3, config={"min.insync.replicas": "1"}
            ),
        ]
        for fut in admin.create_topics(bad).values():
            fut.result(30)
        bad_env = {**topo, "RUNFOLD_TOPIC_PREFIX": "bad", "RUNFOLD_PARTITIONS": "2"}
        _run(bad_env, "topology", "create")  # the rest; the two above are left as they are
        rc, check, err = _run(bad_env, "topology", "verify")
        assert rc == 1 and not check["ok"], check
        problems = {(p["kind"], p["topic"]): p for p in check["problems"]}
        rf = problems[("replication", "bad.commands")]
        assert (rf["expected"], rf["actual"]) == ("3", "1")
        assert "bad.commands" in rf["message"] and "replication factor is 1, wanted 3" in rf["message"]
        isr = problems[("min_insync_replicas", "bad.receipts")]
        assert (isr["expected"], isr["actual"]) == ("2", "1")
        assert "min.insync.replicas is 1, wanted 2" in isr["message"]
        assert len(check["problems"]) == 2, check["problems"]
        # the human output says the same
        text = subprocess.run(
            [sys.executable, "-m", "topology", "topology", "verify"],
            env=bad_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (
            text.returncode == 1
            and "bad.commands: replication factor is 1, wanted 3" in text.stdout.replace("\n", " ")
        )
    finally:
        rc, down, err = _run(env, "kafka", "down")
    assert rc == 0, (down, err)
    assert "cluster of 3" in down["message"]
    assert all(_gone(p) for p in pids), f"nodes left running after down: {pids}"
