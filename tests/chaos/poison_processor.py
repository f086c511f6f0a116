"""`python tests/chaos/poison_processor.py ARGS` = `runfold processor ARGS` with two faults the
poison-pill scenario needs and no production path can enable (this module is the only one that
installs them, and only the test starts it):

- the fold raises for a record that carries the marker `{"poison": "raise"}` (a StartRun input,
  an ActivationCompleted output): an engine defect on one record;
- the commit's run-state snapshots raise for a run whose input carries `{"poison": "commit"}`:
  a failure found at commit time, which names no record, so the loop must trace it back.

Whatever the engine checks one day, these two reach the runtime's own isolation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from processors.cli.processor import main
from processors.runtime import fold


def _marked(value: Any, mark: str) -> bool:
    return isinstance(value, dict) and value.get("poison") == mark


_decide = fold.decide


def decide(state: Any, msg: dict[str, Any], ctx: Any) -> Any:
    if _marked(msg.get("input"), "raise") or _marked(msg.get("output"), "raise"):
        raise RuntimeError("injected fault: the fold of this record raises")
    return _decide(state, msg, ctx)


_snapshots = fold.Folder.snapshots


def snapshots(self: fold.Folder, overlay: Any, partition: int, counters: Any) -> None:
    for state in overlay.states.values():
        if state is not None and _marked(state.get("input"), "commit"):
            raise TypeError("injected fault: this run's snapshot cannot be written")
    _snapshots(self, overlay, partition, counters)


fold.decide = decide  # type: ignore[assignment]
fold.Folder.snapshots = snapshots  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "runfold processor"
    main()
