"""Route-condition and reference micro-benchmark (a few seconds, one core).

    .venv/bin/python benchmarks/cel_bench.py [--seconds 1.0]

Prints evaluations per second for typical route conditions with a small and a large
state, the same through `select_routes`, and `resolve` + `input_hash` of a node input.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

from processors.engine.conditions import compile_condition, select_routes
from processors.engine.definition import Route
from processors.engine.refs import Scope, input_hash, resolve


def rate(fn: Callable[[], Any], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(200):
            fn()
        n += 200
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0)
    seconds = parser.parse_args().seconds

    small: dict[str, Any] = {"notes": ["a", "b", "c", "d"], "brief": None, "approved": False, "rounds": 1}
    large = {**small, **{f"k{i}": {"text": "x" * 200, "items": list(range(20))} for i in range(200)}}
    run_input = {"topic": "kafka"}
    cases = [
        ("size(state.notes) > 3, small state", "size(state.notes) > 3", small),
        ("size(state.notes) > 3, 200-key state", "size(state.notes) > 3", large),
        ("state['notes'] (whole state), 200-key state", "size(state['notes']) > 3", large),
        ("state.approved || state.rounds >= 3", "state.approved || state.rounds >= 3", small),
    ]
    for label, expr, state in cases:
        cond = compile_condition(expr)
        r = rate(functools.partial(cond.evaluate, state=state, input=run_input, output=None), seconds)
        print(f"{label:50s} {r:12,.0f} evals/s")
    routes = [Route(to="review", when="size(state.notes) > 3"), Route(to="end")]
    r = rate(lambda: select_routes(routes, state=small, input=run_input), seconds)
    print(f"{'select_routes([review when ..., end])':50s} {r:12,.0f} calls/s")
    template = {"query": {"from": "item"}, "topic": {"from": "input", "pointer": "/topic"}, "k": [1, 2]}
    scope = Scope(input=run_input, state=small, item="q")
    r = rate(lambda: input_hash(resolve(template, scope)), seconds)
    print(f"{'resolve + input_hash of a 3-field input':50s} {r:12,.0f} calls/s")


if __name__ == "__main__":
    main()
