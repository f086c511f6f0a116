"""The demo's process handling: nothing it started survives, not even a stubborn grandchild."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from processors.demo.procs import Children, managed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_stop_all_terminates_then_kills_whole_process_groups(tmp_path: Path) -> None:
    # a child that ignores SIGTERM and has a grandchild that ignores it too
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        "open(sys.argv[1], 'w').write(str(g.pid))\n"
        "time.sleep(120)\n"
    )
    pid_file = tmp_path / "grandchild.pid"
    children = Children(tmp_path / "logs", dict(os.environ))
    with managed(children):
        stubborn = children.start("stubborn", [sys.executable, "-c", script, str(pid_file)])
        polite = children.start("polite", [sys.executable, "-c", "import time; time.sleep(120)"])
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, stubborn.tail()
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        children_pids = [stubborn.proc.pid, polite.proc.pid]
        started = time.monotonic()
        children.stop_all(grace_s=1.0)
    assert time.monotonic() - started < 10
    assert children.exit_codes["polite"] == -15  # SIGTERM was enough
    assert children.exit_codes["stubborn"] == -9  # needed SIGKILL
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert not any(_alive(p) for p in children_pids)
    children.stop_all()  # idempotent


def test_managed_stops_children_when_the_body_raises(tmp_path: Path) -> None:
    children = Children(tmp_path, dict(os.environ))
    try:
        with managed(children):
            child = children.start("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"])
            raise KeyboardInterrupt  # what Ctrl-C does in the demo
    except KeyboardInterrupt:
        pass
    assert child.proc.returncode is not None and not _alive(child.proc.pid)
