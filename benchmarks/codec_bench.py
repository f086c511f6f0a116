"""Codec throughput: encode/decode msgs/s for a typical StepSucceeded event and a StartRun command.

Run: .venv/bin/python benchmarks/codec_bench.py [--seconds 2]   (prints one JSON object; < 30 s)
Single-threaded, pre-bound encoder/decoder as the processor's hot loop uses them; best of 3 rounds.
"""

from __future__ import annotations

import argparse
import functools
import platform
import time
from collections.abc import Callable
from typing import Any

import fastavro
import orjson

from schemas import Codec

TS = 1_764_400_000_000

STEP_SUCCEEDED = {
    "type": "StepSucceeded",
    "run_id": "r-2f6c1a9e",
    "record_id": "0b5e8f3a9d2c4e71a6b3f0c2d8e9a1b4",
    "ts_ms": TS,
    "sequence": 42,
    "node": "summarize",
    "lineage": "3",
    "attempt": 1,
    "dispatch_id": "5f0e9c2b7a1d4e8f3c6b9a2d5e8f1c4b",
    "output": {
        "summary": "Apache Kafka is a distributed event streaming platform. " * 3,
        "sources": ["https://a.example/1", "https://b.example/2"],
        "confidence": 0.87,
    },
    "usage": {"prompt_tokens": 1834, "completion_tokens": 212, "cost_micros": 4120},
}
START_RUN = {
    "type": "StartRun",
    "run_id": "r-2f6c1a9e",
    "record_id": "7c1d9e2f4a6b8c0d1e3f5a7b9c2d4e6f",
    "ts_ms": TS,
    "definition_id": "research-brief",
    "revision": None,
    "input": {"topic": "exactly-once stream processing", "depth": 2},
    "labels": {"team": "search"},
}


def rate(fn: Callable[[], Any], seconds: float) -> float:
    best = 0.0
    for _ in range(3):
        n, start = 0, time.perf_counter()
        deadline = start + seconds / 3
        while time.perf_counter() < deadline:
            for _ in range(500):
                fn()
            n += 500
        best = max(best, n / (time.perf_counter() - start))
    return round(best)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement (3 rounds)")
    args = parser.parse_args()
    codec = Codec.default()
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "fastavro": fastavro.__version__,
        "orjson": orjson.__version__,
        "seconds_per_measurement": args.seconds,
    }
    for name, kind, msg in (
        ("StepSucceeded", "run_events", STEP_SUCCEEDED),
        ("StartRun", "commands", START_RUN),
    ):
        encode, decode = codec.encoder(kind), codec.decoder(kind)
        data = encode(msg)
        assert decode(data)["type"] == msg["type"]
        out[name] = {
            "bytes": len(data),
            "encode_per_s": rate(functools.partial(encode, msg), args.seconds),
            "decode_per_s": rate(functools.partial(decode, data), args.seconds),
        }
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
