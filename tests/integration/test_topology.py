"""`create` and `verify` against a real broker, including topics that are deliberately wrong."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from topology.admin import create_topology, verify_topology
from topology.catalog import TopicNames, topic_specs
from topology.settings import KafkaSettings, admin_config

pytestmark = pytest.mark.integration


def _create_raw(settings: KafkaSettings, name: str, partitions: int, config: dict[str, str]) -> None:
    admin = AdminClient(admin_config(settings))
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])[
        name
    ].result()


def test_create_then_verify_is_clean_and_create_is_idempotent(kafka_settings: KafkaSettings) -> None:
    specs = topic_specs(kafka_settings)
    before = verify_topology(kafka_settings)
    assert {p.kind for p in before.problems} == {"missing"} and len(before.problems) == len(specs)

    first = create_topology(kafka_settings)
    assert first.created == [s.name for s in specs] and first.existing == []
    assert verify_topology(kafka_settings).ok

    second = create_topology(kafka_settings)
    assert second.created == [] and second.existing == [s.name for s in specs]
    assert verify_topology(kafka_settings).ok


def test_verify_reports_wrong_partitions_copartitioning_and_cleanup_policy(
    kafka_settings: KafkaSettings,
) -> None:
    names = TopicNames(kafka_settings.topic_prefix)
    # receipts with one partition too many: breaks the co-partitioned group
    _create_raw(kafka_settings, names.receipts, kafka_settings.partitions + 1, {"cleanup.policy": "delete"})
    # run-state must be compacted; make it delete
    _create_raw(kafka_settings, names.run_state, kafka_settings.partitions, {"cleanup.policy": "delete"})
    report = create_topology(kafka_settings)
    assert names.receipts in report.existing and names.run_state in report.existing  # left alone

    check = verify_topology(kafka_settings)
    assert not check.ok
    kinds = {(p.kind, p.topic) for p in check.problems}
    assert ("partitions", names.receipts) in kinds
    assert ("cleanup_policy", names.run_state) in kinds
    assert any(p.kind == "copartitioning" and names.receipts in p.topic for p in check.problems)
    assert len(check.problems) == 3, check.problems


def test_cli_verify_exits_1_on_problems_and_0_when_clean(kafka_settings: KafkaSettings) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "RUNFOLD_PARTITIONS": str(kafka_settings.partitions),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "processors.cli",
                "topology",
                *args,
                "--prefix",
                kafka_settings.topic_prefix,
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    missing = run("verify")
    assert missing.returncode == 1
    assert {p["kind"] for p in orjson.loads(missing.stdout)["problems"]} == {"missing"}
    created = run("create")
    assert created.returncode == 0 and len(orjson.loads(created.stdout)["created"]) == 9
    clean = run("verify")
    assert clean.returncode == 0 and orjson.loads(clean.stdout)["ok"] is True


def test_create_sets_min_insync_replicas_per_topic_and_verify_reports_what_it_found(
    kafka_settings: KafkaSettings,
) -> None:
    from confluent_kafka.admin import ConfigResource, ResourceType

    report = create_topology(kafka_settings)
    assert report.replication["replication_factor"] == 1  # one local broker
    admin = AdminClient(admin_config(kafka_settings))
    res = ConfigResource(ResourceType.TOPIC, TopicNames(kafka_settings.topic_prefix).commands)
    entry = admin.describe_configs([res])[res].result()["min.insync.replicas"]
    assert (entry.value, entry.is_default) == ("1", False)  # the topic's own setting, not the broker's
    check = verify_topology(kafka_settings)
    assert check.ok, check.problems
    assert set(check.found) == set(check.checked)
    assert all(f == {"replication_factor": 1, "min_insync_replicas": 1} for f in check.found.values())
