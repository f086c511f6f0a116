"""A librdkafka call that can abort the process, made in a child process instead.

The admin client's consumer-group requests sent to a group coordinator (`describe_consumer_groups`,
`list_consumer_group_offsets`, ...) abort the process that makes them when a broker restarts
(`rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0' failed`,
confluentinc/librdkafka#4605, #3663, open in librdkafka 2.16.0, the newest release; see
processors/kafka/watermarks.py). Where runfold needs what only they answer (a group's members
and their assignment), it asks them in a short-lived child Python process: an abort there is an
error here, and the processor, the worker or the CLI that asked goes on.

    call("topology.consumers:consumed_topics_here", {...}, timeout_s)  # -> the JSON it returned
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import orjson


class IsolatedCallFailed(RuntimeError):
    """The child process died (a librdkafka abort, a segfault), timed out or raised."""


def call(target: str, arg: Any, timeout_s: float) -> Any:
    """`module:function(arg)` run in a child process; its JSON result. IsolatedCallFailed when
    the child did not end with one within `timeout_s`."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "topology.isolated", target],
            input=orjson.dumps(arg),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise IsolatedCallFailed(f"{target}: no answer within {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise IsolatedCallFailed(f"{target}: child process exited {proc.returncode}: {' / '.join(tail)}")
    return orjson.loads(proc.stdout)


def _main() -> None:
    module, _, name = sys.argv[1].partition(":")
    function = getattr(importlib.import_module(module), name)
    sys.stdout.buffer.write(orjson.dumps(function(orjson.loads(sys.stdin.buffer.read()))))


if __name__ == "__main__":
    _main()
