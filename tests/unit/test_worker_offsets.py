"""Low-watermark offset tracking under out-of-order completion."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processors.executors.offsets import OffsetTracker, PartitionWatermark

TP = ("t.activations.default", 0)


def test_out_of_order_completion_commits_only_contiguous_prefix() -> None:
    tracker = OffsetTracker()
    for off in (10, 11, 12, 15):
        tracker.add(TP, off)
    tracker.done(TP, 11)
    tracker.done(TP, 15)
    assert tracker.take_commits() == {}
    tracker.done(TP, 10)
    assert tracker.take_commits() == {TP: 12}
    assert tracker.take_commits() == {}  # nothing moved since
    tracker.done(TP, 12)
    assert tracker.take_commits() == {TP: 16}
    assert tracker.in_flight() == 0


def test_take_commits_of_some_partitions_keeps_the_others() -> None:
    tracker = OffsetTracker()
    other = ("t.activations.default", 1)
    tracker.add(TP, 0)
    tracker.add(other, 5)
    tracker.done(TP, 0)
    tracker.done(other, 5)
    assert tracker.take_commits(only=[other]) == {other: 6}
    assert tracker.take_commits() == {TP: 1}
    tracker.forget([TP])
    tracker.done(TP, 1)  # a forgotten partition is ignored
    assert tracker.take_commits() == {}


@given(st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=40), st.randoms())
def test_watermark_is_one_past_the_longest_done_prefix(gaps: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    offsets, off = [], 0
    for gap in gaps:
        off += gap
        offsets.append(off)
    part = PartitionWatermark()
    for o in offsets:
        part.add(o)
    order = offsets[:]
    rnd.shuffle(order)
    done: set[int] = set()
    for o in order[: rnd.randint(0, len(order))]:
        part.done(o)
        done.add(o)
        prefix = 0
        while prefix < len(offsets) and offsets[prefix] in done:
            prefix += 1
        expected = offsets[prefix - 1] + 1 if prefix else None
        assert part.committable == expected
