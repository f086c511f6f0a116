"""What a long restore reports in its progress log."""

from __future__ import annotations

from processors.runtime.assignment import _Restore, restore_progress
from processors.runtime.store import NO_OFFSET


def test_progress_says_what_is_left_and_how_long_it_takes_at_the_rate_so_far() -> None:
    r = _Restore(partition=3, started=100.0, start_offset=1_000, events=40_000, last_offset=40_999)
    assert restore_progress(r, 121_000, now=110.0) == {
        "partition": 3,
        "restored_events": 40_000,
        "next_offset": 41_000,
        "log_end": 121_000,
        "offsets_left": 80_000,
        "events_per_s": 4_000,
        "eta_s": 20,
    }


def test_progress_before_the_first_event_and_with_the_log_end_unknown() -> None:
    fresh = _Restore(partition=0, started=100.0, start_offset=0)
    assert fresh.last_offset == NO_OFFSET
    progress = restore_progress(fresh, 5_000, now=100.0)
    assert (
        progress["next_offset"],
        progress["offsets_left"],
        progress["events_per_s"],
        progress["eta_s"],
    ) == (0, 5_000, 0, None)
    unknown = restore_progress(
        _Restore(partition=1, started=0.0, start_offset=7, events=9, last_offset=15), -1001, 3.0
    )
    assert (unknown["log_end"], unknown["offsets_left"], unknown["eta_s"], unknown["events_per_s"]) == (
        -1,
        None,
        None,
        3,
    )
    caught_up = restore_progress(
        _Restore(partition=2, started=0.0, start_offset=0, events=10, last_offset=9), 10, 1.0
    )
    assert (caught_up["offsets_left"], caught_up["eta_s"]) == (0, None)


def test_the_eta_counts_offsets_at_the_offset_rate_so_transaction_markers_do_not_halve_it() -> None:
    # small transactions: one marker per event, so 20,000 events took 40,000 offsets
    r = _Restore(partition=0, started=100.0, start_offset=1_000, events=20_000, last_offset=40_999)
    progress = restore_progress(r, 121_000, now=110.0)
    assert (progress["events_per_s"], progress["offsets_left"], progress["eta_s"]) == (2_000, 80_000, 20)


def test_offsets_retention_removed_before_the_first_event_read_do_not_count_as_progress() -> None:
    # a new store reads from offset 0, but the log starts at 1,000,000 (older segments deleted)
    r = _Restore(
        partition=0,
        started=100.0,
        start_offset=0,
        events=40_001,
        first_offset=1_000_000,
        last_offset=1_040_000,
    )
    progress = restore_progress(r, 1_120_001, now=110.0)
    assert (progress["offsets_left"], progress["eta_s"]) == (80_000, 20)  # counted from 0 it said 1 s
