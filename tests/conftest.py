"""Shared fixtures. Integration tests get a real Kafka broker through `kafka_bootstrap`.

Broker selection is topology.broker's one code path:
  KAFKA_BOOTSTRAP_SERVERS set  -> that cluster (scripts/test.sh sets it; so does a shared dev broker)
  a Docker engine runs         -> a Testcontainers KafkaContainer for the session
  otherwise                    -> the local Apache Kafka broker from Maven jars, on a free port in a
                                  temporary data dir, stopped at the end of the session

Fixtures:
  kafka_bootstrap  (session)  "host:port" of a broker that answers
  topic_prefix     (function) a unique prefix per test, e.g. "t3f9a1c2e"; its topics are deleted after
  kafka_settings   (function) KafkaSettings for kafka_bootstrap + topic_prefix (2 partitions: quick)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from processors import native_engine
from topology import broker, local_kafka
from topology.settings import KafkaSettings

# Property tests: no per-example deadline (a loaded 2-core CI box is not a slow test), and in CI
# a derandomized search so a red build is reproducible, never a roll of the dice. Locally the
# search stays random: that is where new counterexamples are found.
hypothesis_settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
)


def _testcontainers_kafka() -> Iterator[str]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        try:
            from testcontainers.kafka import KafkaContainer  # testcontainers < 4.14
        except ImportError as e:
            raise RuntimeError("a Docker engine runs but testcontainers[kafka] is not installed") from e
    with KafkaContainer().with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


def pytest_report_header() -> str:
    """Which engine the suite runs (processors/native_engine.py): scripts/test.sh builds the
    compiled one; tests/unit/test_native_engine.py runs the engine's tests with the other."""
    return f"runfold engine: {native_engine.running()} (RUNFOLD_ENGINE={native_engine.mode()})"


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    choice = broker.choose_broker()
    if choice.kind == "external":
        yield broker.start_broker(choice)  # only checks that it answers
    elif choice.kind == "docker":
        yield from _testcontainers_kafka()
    else:
        port, cport = local_kafka.free_port_pair()
        cfg = local_kafka.LocalKafkaConfig.from_env(
            port=port, controller_port=cport, data_dir=tmp_path_factory.mktemp("kafka")
        )
        try:
            status = local_kafka.up(cfg)
        except local_kafka.LocalKafkaError as e:
            pytest.fail(f"local broker (chosen because {choice.reason}) did not start: {e}", pytrace=False)
        try:
            yield status.bootstrap
        finally:
            local_kafka.down(cfg)


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_settings(kafka_bootstrap: str, topic_prefix: str) -> Iterator[KafkaSettings]:
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=topic_prefix, partitions=2)
    yield settings
    from topology.admin import delete_topology

    # Keep the shared broker tidy: remove what the test created under its own prefix.
    try:
        delete_topology(settings)
    except Exception as e:  # a test that broke the broker connection must not hide its own failure
        print(f"cleanup of topics under {topic_prefix} failed: {e}")


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
