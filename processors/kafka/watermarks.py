"""A partition's log end asked in short slices, with a metadata refresh between them.

A `get_watermark_offsets` sent while the partition's leader is a broker just lost waits its
whole timeout on that broker, although Kafka moves the leader within its broker session
(9 s by default) and the client learns of it only by refreshing its metadata: one 10 s call
answered nothing for 10 s in the 3-node chaos scenario (tests/chaos/test_cluster_faults.py),
while the new leader answered after the first seconds. Slices of `SLICE_S` with a refresh
between answer as soon as the cluster does.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

SLICE_S = 1.0


def log_end(client: Any, tp: TopicPartition, total_s: float, slice_s: float = SLICE_S) -> int:
    """The high watermark of `tp` through `client` (a consumer), asked again every `slice_s`
    for at most `total_s`; the last KafkaException when no slice was answered."""
    deadline = time.monotonic() + total_s
    while True:
        left = deadline - time.monotonic()
        try:
            return int(
                client.get_watermark_offsets(tp, timeout=max(0.1, min(slice_s, left)), cached=False)[1]
            )
        except KafkaException:
            if time.monotonic() >= deadline - 0.05:
                raise
            with contextlib.suppress(KafkaException):
                client.list_topics(tp.topic, timeout=max(0.1, min(1.0, deadline - time.monotonic())))
