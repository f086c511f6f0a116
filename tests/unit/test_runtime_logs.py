"""Repeated Kafka client errors are logged once per window, with how many were held back."""

from __future__ import annotations

from processors.runtime.logs import RepeatThrottle


def test_the_first_of_each_message_passes_then_one_per_window_with_the_count_held_back() -> None:
    t = RepeatThrottle(window_s=10.0)
    assert t.admit("1/1 brokers are down", 0.0) == 0
    assert [t.admit("1/1 brokers are down", s) for s in (0.1, 5.0, 9.9)] == [None, None, None]
    assert t.admit("connect failed", 1.0) == 0  # another message is not held back by the first
    assert t.admit("1/1 brokers are down", 10.0) == 3
    assert t.admit("1/1 brokers are down", 12.0) is None
    assert t.admit("1/1 brokers are down", 30.0) == 1
    assert t.admit("connect failed", 30.0) == 0
