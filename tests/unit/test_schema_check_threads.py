"""`schema_problem` gives a schema check a fixed budget of frames by setting the interpreter's
recursion limit, which every thread shares. The worker runs agents' structured-output checks
(processors/engine/agent_loop.py) in threads beside the user's actions, so the check must
neither lower the limit under another thread's feet nor leave it changed when two checks
overlap."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from processors.engine.errors import schema_problem


class _Gate:
    """A validator whose check blocks until released, so a test can act while it runs."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def iter_errors(self, value: Any) -> Iterator[Any]:
        self.inside.set()
        assert self.release.wait(10)
        return iter(())


@pytest.fixture
def high_limit() -> Iterator[int]:
    """A process whose code raised the limit (deep recursion of its own), as user code may."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        yield 20_000
    finally:
        sys.setrecursionlimit(before)


def _recurse(n: int) -> int:
    return 0 if n == 0 else 1 + _recurse(n - 1)


def test_a_check_does_not_lower_the_limit_another_thread_recurses_under(high_limit: int) -> None:
    gate = _Gate()
    checker = threading.Thread(target=schema_problem, args=(gate, {}))
    checker.start()
    assert gate.inside.wait(10)
    outcome: list[object] = []

    def deep() -> None:  # 3,000 frames: within the limit the process set
        try:
            outcome.append(_recurse(3_000))
        except RecursionError as e:
            outcome.append(e)

    other = threading.Thread(target=deep)
    other.start()
    other.join(30)
    gate.release.set()
    checker.join(10)
    assert outcome == [3_000], outcome
    assert sys.getrecursionlimit() == high_limit


def test_two_overlapping_checks_leave_the_limit_as_it_was() -> None:
    before = sys.getrecursionlimit()
    first, second = _Gate(), _Gate()

    def check_deeper(gate: _Gate, depth: int) -> None:  # a different depth: a different limit set
        if depth:
            check_deeper(gate, depth - 1)
        else:
            schema_problem(gate, {})

    a = threading.Thread(target=check_deeper, args=(first, 0))
    a.start()
    assert first.inside.wait(10)
    b = threading.Thread(target=check_deeper, args=(second, 30))
    b.start()
    second.inside.wait(0.5)  # serialised: it waits for the first; overlapping: it is inside
    first.release.set()
    a.join(10)
    assert second.inside.wait(10)
    second.release.set()
    b.join(10)
    assert sys.getrecursionlimit() == before
