"""Child processes the demo starts, and the guarantee that none survives it.

Each child runs in its own session (process group), so a terminate reaches the
grandchildren too. `stop_all` sends SIGTERM to every group, waits, then SIGKILLs
what is left; it runs on normal exit, on exceptions, on Ctrl-C (SIGINT) and on
SIGTERM to the demo itself, and it is idempotent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Children:
    log_dir: Path
    env: dict[str, str]
    children: list[Child] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)  # filled by stop_all

    def start(self, name: str, argv: list[str]) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop_all
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        child = Child(name, proc, log_path, log)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if not c.alive]

    def stop_all(self, grace_s: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every process group, wait up to `grace_s`, SIGKILL the rest. Exit codes by name."""
        for c in self.children:
            _signal_group(c.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in self.children:
            with suppress(subprocess.TimeoutExpired):
                c.proc.wait(max(deadline - time.monotonic(), 0.05))
        for c in self.children:
            # the leader may be gone while a grandchild lingers: signal the group regardless
            _signal_group(c.proc, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                c.proc.wait(5)
            c.log.close()
        self.exit_codes.update({c.name: c.proc.returncode for c in self.children})
        self.children.clear()
        return dict(self.exit_codes)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the child is its session's (and group's) leader


@contextmanager
def managed(children: Children) -> Iterator[Children]:
    """Stop every child on the way out, whatever the way (return, exception, SIGINT, SIGTERM)."""
    previous: dict[int, Any] = {}

    def _raise_interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        previous[stop_signal] = signal.signal(stop_signal, _raise_interrupt)
    try:
        yield children
    finally:
        # a second Ctrl-C while stopping must not leave children behind
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            children.stop_all()
        finally:
            signal.signal(signal.SIGINT, old_int)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
