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
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from processors import native_engine
from topology import broker, local_kafka
from topology.settings import KafkaSettings

# An xdist worker runs with COLUMNS=80 and LINES=24 that its controller set (execnet), not the
# environment the suite was started in: every CLI subprocess a test starts would then render its
# tables at 80 columns instead of the 120 it uses when stdout is not a terminal
# (processors/cli/common.py), and wrap cells that tests read (defs list's "none (all
# deprecated)"). The worker gives its tests the environment a serial run has.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# Property tests: no per-example deadline (a loaded 2-core CI box is not a slow test), and in CI
# a derandomized search so a red build is reproducible, never a roll of the dice. Locally the
# search stays random: that is where new counterexamples are found. The sizes are the tier's
# budget (the unit tier in under 3 minutes on 2 cores): hypothesis's 100 examples where a test
# names none, and the generated-world tests' own sizes (SOAK_SIZES' defaults in their modules).
# `soak` (`bash scripts/test.sh soak`, never in CI) is the long search: random, 2,000 examples
# where a test names none, and the generated-world tests at SOAK_SIZES, each size still
# overridable by its own variable.
hypothesis_settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.register_profile(
    "soak",
    deadline=None,
    max_examples=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SOAK_SIZES = {
    "RUNFOLD_ENGINE_FUZZ_EXAMPLES": "20000",  # tests/unit/test_engine_generative.py (CI: 500)
    "RUNFOLD_ENGINE_DIFF_EXAMPLES": "2000",  # tests/unit/test_engine_differential.py (CI: 200)
    "RUNFOLD_INDEX_FUZZ_EXAMPLES": "2000",  # tests/unit/test_index_projection.py (CI: 150)
}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
hypothesis_settings.load_profile(PROFILE)
if PROFILE == "soak":
    # before the test modules import: they read their sizes at import
    for _name, _size in SOAK_SIZES.items():
        os.environ.setdefault(_name, _size)

# The tier of a test is the folder it is in, never a marker someone must remember: a file added
# to tests/unit is a unit test, one in tests/integration an integration test, one in tests/chaos
# a chaos test (scripts/test.sh selects the tiers with these markers and folders).
TESTS = Path(__file__).resolve().parent
TIERS: dict[str, tuple[str, ...]] = {
    "unit": ("unit",),
    "integration": ("integration",),
    "chaos": ("integration", "chaos"),
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.resolve().relative_to(TESTS).parts[0]
        except (ValueError, IndexError):
            continue
        for marker in TIERS.get(folder, ()):
            item.add_marker(marker)


def _utf8(value: Any) -> Any:
    """A report's strings as UTF-8 can carry them: a lone surrogate (a file name decoded with
    surrogateescape, in a captured log) becomes its backslash escape."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8(v) for v in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Any:
    """pytest-xdist sends each report from its worker as UTF-8: a string it cannot encode would
    crash the worker and end the whole run (execnet's DumpError), not just fail the test."""
    data = yield
    return _utf8(data)


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
