"""A log-end query asked in slices with a metadata refresh between (processors.kafka.watermarks):
answered as soon as the cluster answers, not after one whole timeout spent on a lost leader."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processors.kafka.watermarks import log_end


class _LeaderMoves:
    """Like a consumer whose cached leader is a broker just lost: every query waits its whole
    timeout, until a metadata refresh after `moves_at` learns the new leader."""

    def __init__(self, moves_at: float) -> None:
        self.moves_at = time.monotonic() + moves_at
        self.refreshed = False
        self.timeouts: list[float] = []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        assert cached is False
        self.timeouts.append(timeout)
        if self.refreshed:
            return 0, 42
        time.sleep(timeout)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get watermark offsets"))

    def list_topics(self, topic: str, timeout: float) -> None:
        if time.monotonic() >= self.moves_at:
            self.refreshed = True


def test_answers_once_the_new_leader_is_known_not_after_the_whole_timeout() -> None:
    client = _LeaderMoves(moves_at=0.5)
    started = time.monotonic()
    assert log_end(client, TopicPartition("t", 0), total_s=10.0, slice_s=0.2) == 42
    assert time.monotonic() - started < 2.0  # one 10 s call answered nothing for 10 s
    assert max(client.timeouts) <= 0.2


def test_the_last_error_when_no_slice_is_answered_within_the_total() -> None:
    client = _LeaderMoves(moves_at=60.0)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        log_end(client, TopicPartition("t", 0), total_s=0.6, slice_s=0.2)
    # the time asked of the client stays within the total (each slice at most slice_s, the last
    # one at least 0.1 s); the wall clock only rules out a whole long timeout (a loaded host
    # stretches every sleep, so a tight wall bound failed under load)
    asked = client.timeouts
    assert asked and max(asked) <= 0.2 and sum(asked) <= 0.7, asked
    assert time.monotonic() - started < 5.0
