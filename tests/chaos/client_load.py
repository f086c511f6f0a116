"""A service that embeds runfold's client, as the crash-hunting scenarios run it: a process of
its own (an abort inside librdkafka ends it, which the scenario must see), with threads that
start runs (`RunClient.start`, then `wait`) and start-signal-wait runs of a workflow that waits
for a signal (`RunClient.signal`), until SIGTERM. It never exits by itself: every client error is
written down and the command asked again with the same run id (commands are idempotent).

    python tests/chaos/client_load.py <bootstrap> <topic prefix> <out.jsonl> [threads]

`out.jsonl`: one JSON object a line: {"kind": "sent"|"accepted"|"finished"|"error", "run": ...,
"t": epoch s, ...}. A run is "sent" before its first StartRun, so a command taken although its
answer was lost is still counted as started.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import uuid
from typing import Any

import orjson

from processors.client import RunClient
from topology.settings import KafkaSettings

SIGNAL_WF = "sig1"


def main() -> None:
    bootstrap, prefix, out = sys.argv[1:4]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    settings = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    lock = threading.Lock()
    sink = open(out, "ab")  # noqa: SIM115 - closed at the end of main

    def record(kind: str, **fields: Any) -> None:
        with lock:
            sink.write(orjson.dumps({"kind": kind, "t": time.time(), **fields}) + b"\n")
            sink.flush()

    def until_answered(what: str, run: str, call: Any) -> bool:
        while not stop.is_set():
            try:
                call()
                return True
            except Exception as e:  # every client error: written down, asked again
                record("error", run=run, what=what, error=f"{type(e).__name__}: {e}"[:300])
                stop.wait(0.5)
        return False

    def starter(i: int) -> None:
        with RunClient(settings, timeout_s=10, answer_timeout_s=20) as client:
            while not stop.is_set():
                run = f"ld{i}-{uuid.uuid4().hex[:10]}"
                record("sent", run=run, definition="noop3")
                if not until_answered(
                    "start", run, lambda run=run: client.start("noop3", {"i": i}, run_id=run)
                ):
                    return
                record("accepted", run=run)
                if until_answered("wait", run, lambda run=run: client.wait(run, timeout=30)):
                    record("finished", run=run)

    def signaller(i: int) -> None:
        with RunClient(settings, timeout_s=10, answer_timeout_s=20) as client:
            while not stop.is_set():
                run = f"sg{i}-{uuid.uuid4().hex[:10]}"
                record("sent", run=run, definition=SIGNAL_WF)
                if not until_answered("start", run, lambda run=run: client.start(SIGNAL_WF, {}, run_id=run)):
                    return
                record("accepted", run=run)
                if not until_answered("signal", run, lambda run=run: client.signal(run, "go", {"ok": True})):
                    return
                if until_answered("wait", run, lambda run=run: client.wait(run, timeout=30)):
                    record("finished", run=run)

    workers = [threading.Thread(target=starter, args=(i,), daemon=True) for i in range(threads)]
    workers.append(threading.Thread(target=signaller, args=(threads,), daemon=True))
    for w in workers:
        w.start()
    record("ready", threads=len(workers))
    while not stop.is_set():
        stop.wait(0.5)
    for w in workers:
        w.join(60)
    record("stopped")
    sink.close()


if __name__ == "__main__":
    main()
