"""KafkaSettings sources and precedence, client config builders, redaction, topic catalogue."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from topology.broker import BrokerError, choose_broker
from topology.catalog import TopicNames, topic_specs
from topology.settings import (
    KafkaSettings,
    admin_config,
    consumer_config,
    producer_config,
    redact,
    transactional_producer_config,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("RUNFOLD_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = KafkaSettings()
    assert s.bootstrap_servers == "127.0.0.1:9092"
    assert (s.topic_prefix, s.partitions, s.replication_factor) == ("runfold", 4, None)
    assert s.activation_queues == ("default", "agents")
    assert s.client_overrides == {}


def test_env_sources_and_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9092")
    assert KafkaSettings().bootstrap_servers == "k1:9092"
    monkeypatch.setenv("RUNFOLD_BOOTSTRAP_SERVERS", "k2:9092")
    assert KafkaSettings().bootstrap_servers == "k2:9092"
    assert KafkaSettings(bootstrap_servers="k3:9092").bootstrap_servers == "k3:9092"
    monkeypatch.setenv("RUNFOLD_ACTIVATION_QUEUES", "default, tools,default")
    monkeypatch.setenv("RUNFOLD_PARTITIONS", "8")
    s = KafkaSettings()
    assert s.activation_queues == ("default", "tools") and s.partitions == 8


def test_local_broker_port_is_the_default_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNFOLD_KAFKA_PORT", "19092")
    assert KafkaSettings().bootstrap_servers == "127.0.0.1:19092"


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_config_file_is_read_and_env_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = tmp_path / f"runfold{suffix}"
    if suffix == ".yaml":
        path.write_text(
            "kafka:\n  topic_prefix: prod\n  partitions: 12\n"
            "  client_overrides: {security.protocol: SASL_SSL, sasl.password: hunter2, socket.keepalive.enable: true}\n"
            "processor: {batch_size: 500}\n"
        )
    else:
        path.write_text(
            '[kafka]\ntopic_prefix = "prod"\npartitions = 12\n'
            '[kafka.client_overrides]\n"security.protocol" = "SASL_SSL"\n"sasl.password" = "hunter2"\n'
            '"socket.keepalive.enable" = true\n'
        )
    monkeypatch.setenv("RUNFOLD_CONFIG", str(path))
    monkeypatch.setenv("RUNFOLD_PARTITIONS", "3")
    monkeypatch.setenv("RUNFOLD_CLIENT_SASL_MECHANISMS", "PLAIN")
    s = KafkaSettings()
    assert s.topic_prefix == "prod"
    assert s.partitions == 3  # env wins over the file
    assert s.client_overrides == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "hunter2",
        "socket.keepalive.enable": "true",
        "sasl.mechanisms": "PLAIN",
    }


def test_config_file_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from topology.settings import ConfigFileError

    monkeypatch.setenv("RUNFOLD_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigFileError, match=r"absent\.yaml"):
        KafkaSettings()
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka\n")
    monkeypatch.setenv("RUNFOLD_CONFIG", str(bad))
    with pytest.raises(ConfigFileError, match=r"bad\.toml is not valid TOML"):
        KafkaSettings()


def test_invalid_values_are_rejected() -> None:
    with pytest.raises(ValidationError, match="topic prefix"):
        KafkaSettings(topic_prefix="bad prefix")
    with pytest.raises(ValidationError, match="queue names"):
        KafkaSettings.model_validate({"activation_queues": "default,bad.queue"})
    with pytest.raises(ValidationError):
        KafkaSettings(partitions=0)


def test_secrets_are_redacted_in_repr_and_redacted_view(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNFOLD_CLIENT_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("RUNFOLD_CLIENT_SASL_OAUTHBEARER_CLIENT_SECRET", "s3cr3t")
    monkeypatch.setenv("RUNFOLD_CLIENT_SASL_USERNAME", "alice")
    s = KafkaSettings()
    assert s.client_overrides["sasl.password"] == "hunter2"  # the client still gets it
    for text in (repr(s), str(s.redacted())):
        assert "hunter2" not in text and "s3cr3t" not in text and "alice" in text
    assert redact({"ssl.key.password": "x", "api.token": "y", "acks": "all"}) == {
        "ssl.key.password": "***",
        "api.token": "***",
        "acks": "all",
    }


def test_builders_layer_defaults_settings_and_call_overrides() -> None:
    s = KafkaSettings(
        bootstrap_servers="b:1", client_overrides={"security.protocol": "SSL", "linger.ms": "20"}
    )
    p = producer_config(s)
    assert p["bootstrap.servers"] == "b:1" and p["security.protocol"] == "SSL"
    assert p["enable.idempotence"] is True and p["acks"] == "all"
    assert p["linger.ms"] == "20"  # settings override the default
    assert producer_config(s, linger_ms=0)["linger.ms"] == 0  # the call overrides settings
    assert producer_config(s, **{"compression.type": "zstd"})["compression.type"] == "zstd"

    t = transactional_producer_config(s, "proc-1")
    assert t["transactional.id"] == "proc-1" and t["enable.idempotence"] is True
    with pytest.raises(ValueError):
        transactional_producer_config(s, "")

    c = consumer_config(s, "g1")
    assert c["group.id"] == "g1" and c["isolation.level"] == "read_committed"
    assert c["enable.auto.commit"] is False and c["auto.offset.reset"] == "earliest"
    assert c["partition.assignment.strategy"] == "range"
    assert consumer_config(s, "g1", read_committed=False)["isolation.level"] == "read_uncommitted"
    # a dead member's partitions wait 20 s, not librdkafka's 45; settings, then the call, override it
    assert c["session.timeout.ms"] == 20_000  # outlasts a group coordinator's failover
    assert c["heartbeat.interval.ms"] == 1_000  # the last heartbeat answered is at most 1 s old
    slow = KafkaSettings(client_overrides={"session.timeout.ms": "30000"})
    assert consumer_config(slow, "g1")["session.timeout.ms"] == "30000"
    assert consumer_config(slow, "g1", session_timeout_ms=6_000)["session.timeout.ms"] == 6_000
    short = consumer_config(s, "g1", session_timeout_ms=1_200)
    assert short["heartbeat.interval.ms"] == 400  # well within a shorter session
    assert admin_config(s) == {
        "bootstrap.servers": "b:1",
        "reconnect.backoff.max.ms": 1000,  # a broker back from a restart is reconnected within 1 s
        "security.protocol": "SSL",
        "linger.ms": "20",
    }
    assert (
        admin_config(KafkaSettings(client_overrides={"reconnect.backoff.max.ms": "5000"}))[
            "reconnect.backoff.max.ms"
        ]
        == "5000"
    )  # client_overrides win


def test_topic_catalogue() -> None:
    s = KafkaSettings.model_validate(
        {"topic_prefix": "p", "partitions": 6, "activation_queues": "default,agents,tools"}
    )
    n = TopicNames("p")
    assert (n.commands, n.receipts, n.run_events, n.run_state) == (
        "p.commands",
        "p.receipts",
        "p.run-events",
        "p.run-state",
    )
    assert (n.child_activations, n.definitions, n.dead_letters) == (
        "p.child-activations",
        "p.definitions",
        "p.dead-letters",
    )
    assert n.activations("tools") == "p.activations.tools"
    specs = {t.name: t for t in topic_specs(s)}
    assert len(specs) == 10
    assert {specs[name].partitions for name in n.copartitioned()} == {6}
    assert specs["p.definitions"].partitions == 1
    assert (
        specs["p.run-state"].cleanup_policy == "compact"
        and specs["p.definitions"].cleanup_policy == "compact"
    )
    assert specs["p.run-events"].config["retention.ms"] == "-1"
    assert specs["p.commands"].cleanup_policy == "delete"


def test_broker_choice() -> None:
    assert choose_broker({"KAFKA_BOOTSTRAP_SERVERS": "x:9092"}).kind == "external"
    assert choose_broker({}, docker_check=False).kind == "local"
    assert choose_broker({"RUNFOLD_BROKER": "local", "KAFKA_BOOTSTRAP_SERVERS": "x:9092"}).kind == "local"
    with pytest.raises(BrokerError, match="RUNFOLD_BROKER"):
        choose_broker({"RUNFOLD_BROKER": "cloud"})
    with pytest.raises(BrokerError, match="KAFKA_BOOTSTRAP_SERVERS is not set"):
        choose_broker({"RUNFOLD_BROKER": "external"})
