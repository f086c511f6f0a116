"""What the client raises when the cluster fails: every broker-side failure a failover produces
is the documented retryable `BrokerUnavailable`, never a bare `RunfoldError` (issue 23: a
`start()` during a broker kill raised `RunfoldError(... _DESTROY_BROKER ...)`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st

from processors.client import BrokerUnavailable, RunfoldError
from processors.client.reader import _FAILING_OVER, PartitionReader, TopicMissing, broker_error
from topology.settings import KafkaSettings

# Every error code librdkafka defines, local (negative) and broker ones.
ALL_CODES = sorted({v for k, v in vars(KafkaError).items() if isinstance(v, int) and k.lstrip("_").isupper()})


@given(st.sampled_from(ALL_CODES), st.booleans())
def test_every_retriable_or_failover_error_is_broker_unavailable(code: int, wrapped: bool) -> None:
    err = KafkaError(code, "x")
    typed = broker_error(KafkaException(err) if wrapped else err, "reading offsets of t[0]", "b:9092")
    if code in _FAILING_OVER or err.retriable():
        assert isinstance(typed, BrokerUnavailable)
    assert isinstance(typed, RunfoldError)
    assert "reading offsets of t[0]" in str(typed)
    if type(typed) is RunfoldError:  # only what a retry cannot fix stays untyped
        assert code not in _FAILING_OVER and not err.retriable()


def test_the_errors_seen_during_a_broker_kill_are_retryable() -> None:
    for code in (
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
    ):
        assert isinstance(broker_error(KafkaError(code), "x", "b"), BrokerUnavailable)
    assert isinstance(broker_error(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), "x", "b"), TopicMissing)
    assert type(broker_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "x", "b")) is RunfoldError


@pytest.fixture
def reader() -> Iterator[PartitionReader]:
    r = PartitionReader(KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_prefix="t"), timeout_s=2.0)
    yield r
    r.close()


def test_a_lookup_that_fails_over_is_retried_until_the_new_leader_answers(reader: PartitionReader) -> None:
    answers: list[object] = [
        KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "broker handle destroyed")),
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "not leader")),
        (0, 42),
    ]

    def call() -> object:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    assert reader._retrying("reading offsets of t.run-events[0]", call) == (0, 42)


def test_a_failover_longer_than_the_timeout_raises_broker_unavailable(reader: PartitionReader) -> None:
    def call() -> object:
        raise KafkaException(KafkaError(KafkaError._DESTROY_BROKER, "broker handle destroyed"))

    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"t\.run-events\[0\].*retry"):
        reader._retrying("reading offsets of t.run-events[0]", call)
    assert 2.0 <= time.monotonic() - t0 < 4.0


def test_no_broker_at_all_fails_at_once(reader: PartitionReader) -> None:
    def call() -> object:
        raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))

    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="no Kafka broker answered"):
        reader._retrying("x", call)
    assert time.monotonic() - t0 < 0.5
