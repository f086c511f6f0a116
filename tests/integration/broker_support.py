"""A Kafka broker of a test's own, for tests that stop, freeze or restart it: free ports, a
temporary data dir, the project's own launcher (topology/local_kafka.py); never the shared
broker of KAFKA_BOOTSTRAP_SERVERS."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from topology import local_kafka


@contextmanager
def own_broker(data_dir: Path, whose: str) -> Iterator[local_kafka.LocalKafkaConfig]:
    """Up for the `with` block, down after it; a broker that does not start fails the test with
    the launcher's reason (`whose`: "the chaos suite's", "this test's")."""
    port, cport = local_kafka.free_port_pair()
    cfg = local_kafka.LocalKafkaConfig.from_env(port=port, controller_port=cport, data_dir=data_dir)
    assert cfg.port != local_kafka.DEFAULT_PORT
    try:
        local_kafka.up(cfg, timeout=180)
    except local_kafka.LocalKafkaError as e:
        pytest.fail(f"{whose} own broker did not start: {e}", pytrace=False)
    try:
        yield cfg
    finally:
        local_kafka.down(cfg)
