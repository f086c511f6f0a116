"""The processes `runfold dev` runs, their output merged into one terminal, and their end.

Each service runs in its own session (process group): a Ctrl-C in the terminal reaches only
`runfold dev`, which then stops every group itself (SIGTERM, a grace period, SIGKILL), so no
grandchild survives and a worker finishing a handler is let drain. Every line a service writes
(stdout and stderr, already in the one `--log-format` the services share) is printed as
`<name> | <line>` by a reader thread per service.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from typing import IO

_PRINT = threading.Lock()  # lines of different services never interleave mid-line


def say(name: str, line: str, out: IO[str] | None = None) -> None:
    stream = out or sys.stdout
    with _PRINT:
        stream.write(f"{name:<14}| {line}\n")
        stream.flush()


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._reader = threading.Thread(
            target=self._pump, args=(self.proc,), name=f"dev-{self.name}", daemon=True
        )
        self._reader.start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            say(self.name, raw.decode(errors="replace").rstrip("\n"))

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, SIGKILL what is left (the group regardless:
        the leader may be gone while a grandchild lingers)."""
        proc = self.proc
        if proc is None:
            return None
        _signal_group(proc, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
        _signal_group(proc, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if self._reader is not None:
            self._reader.join(2)
        return proc.returncode

    def restart(self, grace_s: float = 10.0) -> None:
        self.stop(grace_s)
        self.restarts += 1
        self.start()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when `runfold dev` dies, even by SIGKILL or an
    OOM kill, which no handler of ours sees (its own session would otherwise outlive it, as
    orphans holding the broker's group memberships). Linux only; Popen runs on the main
    thread, whose end is the process's."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the service leads its own session and group
