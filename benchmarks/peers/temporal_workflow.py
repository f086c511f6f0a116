"""Temporal peer for `runfold bench peers`: workflows of 1 or 3 no-op activities.

Two roles, separate processes, against a Temporal dev server (`temporal server start-dev`):

    python benchmarks/peers/temporal_workflow.py worker --address 127.0.0.1:PORT --queue Q
        a Worker running the workflows and the `noop` activity (the SDK's defaults)
    python benchmarks/peers/temporal_workflow.py drive --address 127.0.0.1:PORT --queue Q
        the client: ops on stdin, answers on stdout (benchmarks/peers/_drive.py); a workflow is
        started and its result awaited (`execute_workflow`)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow

sys.path.insert(0, str(Path(__file__).parent))
with workflow.unsafe.imports_passed_through():
    import _drive  # a sibling file, shared with the DBOS driver (which runs without runfold)


@activity.defn
async def noop() -> None:
    return None


_STEP = {"start_to_close_timeout": timedelta(seconds=30)}


@workflow.defn
class Noop1:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(noop, **_STEP)  # type: ignore[call-overload]


@workflow.defn
class Noop3:
    @workflow.run
    async def run(self) -> None:
        for _ in range(3):
            await workflow.execute_activity(noop, **_STEP)  # type: ignore[call-overload]


async def worker(address: str, queue: str) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address)
    async with Worker(client, task_queue=queue, workflows=[Noop1, Noop3], activities=[noop]):
        print('{"ready": true}', flush=True)
        await asyncio.Event().wait()


async def drive(address: str, queue: str) -> None:
    from temporalio.client import Client

    client = await Client.connect(address)

    async def run_one(steps: int) -> None:
        wf = Noop3.run if steps == 3 else Noop1.run
        await client.execute_workflow(wf, id=f"b-{uuid.uuid4().hex}", task_queue=queue)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print('{"ready": true}', flush=True)
    import json

    while line := await reader.readline():
        if not line.strip():
            continue
        op: dict[str, Any] = json.loads(line)
        try:
            if op["op"] == "throughput":
                out = await _drive.throughput_async(
                    run_one, op["concurrency"], op["seconds"], op.get("warmup_s", 1.0), op.get("steps", 3)
                )
            elif op["op"] == "latency":
                out = await _drive.latency_async(run_one, op["rate"], op["seconds"], op.get("steps", 1))
            else:
                raise ValueError(f"unknown op {op['op']!r}")
        except Exception as e:
            out = {"error": f"{type(e).__name__}: {e}"[:1000]}
        print(json.dumps({"result": out}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("role", choices=["worker", "drive"])
    ap.add_argument("--address", required=True)
    ap.add_argument("--queue", default="runfold-bench")
    args = ap.parse_args()
    asyncio.run((worker if args.role == "worker" else drive)(args.address, args.queue))


if __name__ == "__main__":
    main()
