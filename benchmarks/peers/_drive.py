"""The load loops every workflow peer's driver shares (`runfold bench peers`), stdlib only: the
DBOS driver runs in a venv of its own, without runfold installed.

A driver is a long-lived process that reads one JSON op per stdin line and answers one JSON
line on stdout. Around the measured window it prints `{"mark": "start"}` and
`{"mark": "end"}`, so the orchestrator samples every process's CPU exactly over the window
(ramp-up and drain excluded):

    {"op": "throughput", "concurrency": 16, "seconds": 5, "warmup_s": 1, "steps": 3}
        closed loop: `concurrency` workflows in flight, each started when one finishes;
        workflows/s = completions inside the window / its length. The window opens after
        `warmup_s` and at least one full cycle (`concurrency` completions; at most 30 s more):
        at a high concurrency on a loaded host a cycle takes seconds, and a window opened
        before it would count the ramp.
    {"op": "latency", "rate": 25.0, "seconds": 5, "steps": 1}
        open loop: a start every 1/rate s for `seconds`; latency = completion seen by the
        client - the start's planned time (so a start that queued behind others counts its wait).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def mark(name: str) -> None:
    print(json.dumps({"mark": name}), flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2) if s else -1.0


def latency_summary(lat_ms: list[float], planned: int, seconds: float) -> dict[str, Any]:
    return {
        "planned": planned,
        "completed": len(lat_ms),
        "rate_runs_per_s": round(planned / seconds, 2),
        "p50_ms": pct(lat_ms, 0.5),
        "p90_ms": pct(lat_ms, 0.9),
        "p99_ms": pct(lat_ms, 0.99),
        "max_ms": round(max(lat_ms), 2) if lat_ms else -1.0,
    }


def warm_until(completed: Callable[[], int], concurrency: int, warmup_s: float) -> None:
    """Sleep `warmup_s`, then on until `concurrency` workflows completed (at most 30 s more)."""
    started = time.monotonic()
    while time.monotonic() - started < warmup_s or (
        completed() < concurrency and time.monotonic() - started < warmup_s + 30
    ):
        time.sleep(0.05)


def throughput_threads(
    run_one: Callable[[int], None], concurrency: int, seconds: float, warmup_s: float, steps: int
) -> dict[str, Any]:
    """`concurrency` threads, each running one workflow after the other."""
    stop = threading.Event()
    done: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def loop() -> None:
        while not stop.is_set():
            try:
                run_one(steps)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}"[:300])
                return
            with lock:
                done.append(time.monotonic())

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    warm_until(lambda: len(done), concurrency, warmup_s)
    t0 = time.monotonic()
    mark("start")
    time.sleep(seconds)
    t1 = time.monotonic()
    mark("end")
    stop.set()
    for t in threads:
        t.join(60)
    n = sum(1 for x in done if t0 <= x < t1)
    return {
        "concurrency": concurrency,
        "completed": n,
        "workflows_per_s": round(n / (t1 - t0), 2),
        **_err(errors),
    }


def latency_threads(
    run_one: Callable[[int], None], rate: float, seconds: float, steps: int
) -> dict[str, Any]:
    """Open loop: a start every 1/rate s, each on a pool thread (more threads than in flight)."""
    n = max(1, int(rate * seconds))
    lat: list[float] = []
    errors: list[str] = []

    def one(planned: float) -> None:
        try:
            run_one(steps)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}"[:300])
            return
        lat.append((time.monotonic() - planned) * 1000)

    with ThreadPoolExecutor(max_workers=max(8, min(256, int(rate * 2) + 8))) as pool:
        t0 = time.monotonic() + 0.05
        mark("start")
        for i in range(n):
            planned = t0 + i / rate
            delay = planned - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, planned)
        mark("end")
    return {**latency_summary(lat, n, seconds), **_err(errors)}


async def throughput_async(
    run_one: Callable[[int], Awaitable[None]], concurrency: int, seconds: float, warmup_s: float, steps: int
) -> dict[str, Any]:
    stop = False
    done: list[float] = []
    errors: list[str] = []

    async def loop() -> None:
        while not stop:
            try:
                await run_one(steps)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}"[:300])
                return
            done.append(time.monotonic())

    tasks = [asyncio.create_task(loop()) for _ in range(concurrency)]
    started = time.monotonic()
    while time.monotonic() - started < warmup_s or (
        len(done) < concurrency and time.monotonic() - started < warmup_s + 30
    ):
        await asyncio.sleep(0.05)
    t0 = time.monotonic()
    mark("start")
    await asyncio.sleep(seconds)
    t1 = time.monotonic()
    mark("end")
    stop = True
    await asyncio.wait(tasks, timeout=60)
    n = sum(1 for x in done if t0 <= x < t1)
    return {
        "concurrency": concurrency,
        "completed": n,
        "workflows_per_s": round(n / (t1 - t0), 2),
        **_err(errors),
    }


async def latency_async(
    run_one: Callable[[int], Awaitable[None]], rate: float, seconds: float, steps: int
) -> dict[str, Any]:
    n = max(1, int(rate * seconds))
    lat: list[float] = []
    errors: list[str] = []

    async def one(planned: float) -> None:
        try:
            await run_one(steps)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}"[:300])
            return
        lat.append((time.monotonic() - planned) * 1000)

    tasks = []
    t0 = time.monotonic() + 0.05
    mark("start")
    for i in range(n):
        planned = t0 + i / rate
        delay = planned - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(planned)))
    mark("end")
    await asyncio.wait(tasks, timeout=60)
    return {**latency_summary(lat, n, seconds), **_err(errors)}


def _err(errors: list[str]) -> dict[str, Any]:
    return {"errors": len(errors), "first_error": errors[0]} if errors else {}


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Answer ops from stdin until it closes; `{"ready": true}` first."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        op = json.loads(line)
        try:
            out = handle(op)
        except Exception as e:
            out = {"error": f"{type(e).__name__}: {e}"[:1000]}
        print(json.dumps({"result": out}), flush=True)
