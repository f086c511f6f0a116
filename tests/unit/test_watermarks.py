"""processors.kafka.watermarks without a broker: every offset query is the admin client's
ListOffsets (never a consumer's `get_watermark_offsets(cached=False)` / `offsets_for_times`, which
abort the process while brokers fail over), asked in slices with a metadata refresh between, and
answered as soon as the cluster answers, not after one whole timeout spent on a lost leader."""

from __future__ import annotations

import ast
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition

from processors.kafka.watermarks import Offsets, log_end

ROOT = Path(__file__).resolve().parents[2]


class _Info:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _LeaderMoves:
    """Like an admin client whose cached leader is a broker just lost: every ListOffsets waits its
    whole timeout, until a metadata refresh after `moves_at` learns the new leader."""

    def __init__(self, moves_at: float, low: int = 3, high: int = 42, lso: int = 40) -> None:
        self.moves_at = time.monotonic() + moves_at
        self.refreshed = False
        self.timeouts: list[float] = []
        self.asked: list[tuple[Any, Any]] = []
        self.answers = {"earliest": low, "latest": high, "latest-committed": lso}

    def list_offsets(
        self, specs: dict[TopicPartition, Any], isolation_level: Any, request_timeout: float
    ) -> Any:
        self.timeouts.append(request_timeout)
        [(tp, spec)] = specs.items()
        self.asked.append((spec, isolation_level))
        fut: Future[Any] = Future()
        if not self.refreshed:
            time.sleep(request_timeout)
            fut.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT, "ListOffsets timed out")))
            return {tp: fut}
        name = type(spec).__name__
        if "Earliest" in name:
            fut.set_result(_Info(self.answers["earliest"]))
        elif "Latest" in name:
            committed = isolation_level == IsolationLevel.READ_COMMITTED
            fut.set_result(_Info(self.answers["latest-committed" if committed else "latest"]))
        else:
            fut.set_result(_Info(7))
        return {tp: fut}

    def list_topics(self, topic: str, timeout: float) -> None:
        if time.monotonic() >= self.moves_at:
            self.refreshed = True


def test_answers_once_the_new_leader_is_known_not_after_the_whole_timeout() -> None:
    admin = _LeaderMoves(moves_at=0.5)
    started = time.monotonic()
    assert log_end(Offsets(admin=admin), TopicPartition("t", 0), total_s=10.0, slice_s=0.2) == 40
    assert time.monotonic() - started < 2.0  # one 10 s call answered nothing for 10 s
    assert max(admin.timeouts) <= 0.2


def test_the_last_error_when_no_slice_is_answered_within_the_total() -> None:
    admin = _LeaderMoves(moves_at=60.0)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        log_end(Offsets(admin=admin), TopicPartition("t", 0), total_s=0.6, slice_s=0.2)
    # the time asked of the client stays within the total (each slice at most slice_s, the last
    # one at least 0.1 s); the wall clock only rules out a whole long timeout (a loaded host
    # stretches every sleep, so a tight wall bound failed under load)
    asked = admin.timeouts
    assert asked and max(asked) <= 0.2 and sum(asked) <= 0.7, asked
    assert time.monotonic() - started < 5.0


def test_the_isolation_level_chooses_the_committed_end_or_the_log_end() -> None:
    admin = _LeaderMoves(moves_at=0.0)
    admin.refreshed = True
    offsets = Offsets(admin=admin)
    tp = TopicPartition("t", 0)
    assert offsets.end(tp, 1.0) == 40  # the last stable offset: where read_committed ends
    assert offsets.end(tp, 1.0, committed=False) == 42  # the high watermark
    assert offsets.watermarks(tp, 1.0) == (3, 40)
    assert offsets.for_time(tp, 123, 1.0) == 7


def test_an_end_below_the_start_reads_as_an_empty_partition() -> None:
    admin = _LeaderMoves(moves_at=0.0, low=50, high=50, lso=49)
    admin.refreshed = True
    assert Offsets(admin=admin).watermarks(TopicPartition("t", 0), 1.0) == (50, 50)


def test_an_admin_request_that_never_answers_is_a_timeout_not_a_hang() -> None:
    class Silent:
        def list_offsets(self, specs: dict[TopicPartition, Any], **_: Any) -> Any:
            return {tp: Future() for tp in specs}

        def list_topics(self, topic: str, timeout: float) -> None:
            return None

    started = time.monotonic()
    with pytest.raises(KafkaException):
        Offsets(admin=Silent()).end(TopicPartition("t", 0), 0.3, slice_s=0.1)
    assert time.monotonic() - started < 5.0


# The calls that abort or crash the process while brokers fail over (the module's docstring):
# none of runfold's code may make them, but the one home that documents them.
_CRASHING = {"offsets_for_times", "list_consumer_group_offsets", "describe_consumer_groups"}


def _crashing_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        if name in _CRASHING and str(path.relative_to(ROOT)) not in _ALLOWED:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
        if name == "get_watermark_offsets":
            cached = [k for k in node.keywords if k.arg == "cached"]
            # cached=True reads the client's own state (no request): the only form allowed
            if not (cached and isinstance(cached[0].value, ast.Constant) and cached[0].value.value is True):
                found.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} get_watermark_offsets (not cached=True)"
                )
    return found


# where such a call is made in a child process (topology/isolated.py), or only by `runfold demo`
# waiting for its own single local broker to come up (no failover there)
_ALLOWED = {"topology/consumers.py", "processors/demo/run.py"}


def test_no_code_of_runfold_calls_an_offset_query_that_crashes_in_a_failover() -> None:
    found = [
        c
        for d in ("processors", "topology")
        for p in sorted((ROOT / d).rglob("*.py"))
        for c in _crashing_calls(p)
    ]
    assert not found, found
