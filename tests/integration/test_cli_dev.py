"""`runfold dev` through the real entry point against the test broker: a project of one's own
(a definition on a queue of its own, an action module), a run started and finished, an edit of
the module restarting the worker (the next run gets the new code), a broken edit that the
worker cannot import and the fix after it, then SIGINT: exit 0 and no process left behind."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processors.client import RunClient
from topology.admin import delete_topology
from topology.settings import KafkaSettings, load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
RUNFOLD = Path(sys.executable).parent / "runfold"
DEFINITION = """\
schema: runfold.workflow/v1
id: greet
revision: 1
state: {greeting: null}
output: {from: state, pointer: /greeting}
entry: [hello]
nodes:
  hello: {kind: action, action: greet, queue: people, input: {name: {from: input, pointer: /name}},
          writes: {greeting: {from: output}}}
"""
ACTIONS = """\
from processors.executors import ActionContext, action


@action("greet")
def greet(ctx: ActionContext, input: dict) -> str:
    return "{word} " + input["name"]
"""


def _own_processes(prefix: str) -> list[int]:
    """Our processes whose environment carries the session's topic prefix (dev's children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"RUNFOLD_TOPIC_PREFIX={prefix}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


class Lines:
    """The session's output, read by a thread, searchable while it runs."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.all: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.all.append(line.rstrip("\n"))
            self._new.put(line)

    def wait_for(self, text: str, timeout: float = 90) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._new.get(timeout=0.5)
            except queue.Empty:
                continue
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in {timeout}s; output:\n" + "\n".join(self.all[-60:]))


def _start_dev(
    tmp_path: Path, bootstrap: str, prefix: str
) -> tuple[subprocess.Popen[str], Lines, KafkaSettings]:
    """A project of one's own in `tmp_path` (the greet definition, myapp/actions.py saying
    "hello") and `runfold dev` started on it, its output read as it comes."""
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "greet.yaml").write_text(DEFINITION)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "actions.py").write_text(ACTIONS.format(word="hello"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")},
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "RUNFOLD_TOPIC_PREFIX": prefix,
    }
    proc = subprocess.Popen(
        [str(RUNFOLD), "dev", "definitions", "--module", "myapp.actions"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, Lines(proc), load_settings(bootstrap_servers=bootstrap, topic_prefix=prefix)


def test_dev_runs_reloads_and_stops_cleanly(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    prefix = f"{topic_prefix}-dev"
    proc, lines, settings = _start_dev(tmp_path, kafka_bootstrap, prefix)
    actions = tmp_path / "myapp" / "actions.py"
    try:
        lines.wait_for("greet@1 registered")
        lines.wait_for("started; watching")
        with RunClient(settings, answer_timeout_s=60) as client:
            first = client.start("greet", {"name": "Ada"}, run_id="dev-1")
            assert client.wait(first, timeout=90).output == "hello Ada"

            time.sleep(1.1)  # a new mtime even on a coarse clock
            actions.write_text(ACTIONS.format(word="hi"))
            lines.wait_for("actions.py changed: restarting the worker", 30)
            lines.wait_for("worker restarted (1)", 60)
            second = client.start("greet", {"name": "Bob"}, run_id="dev-2")
            assert client.wait(second, timeout=90).output == "hi Bob"

            actions.write_text("this is not python\n")  # restart 2 cannot import it: dev waits for a fix
            lines.wait_for("worker exited with code", 60)
            actions.write_text(ACTIONS.format(word="hey"))
            lines.wait_for("worker restarted (3)", 60)
            third = client.start("greet", {"name": "Cy"}, run_id="dev-3")
            assert client.wait(third, timeout=90).output == "hey Cy"
        children = _own_processes(prefix)
        assert len(children) >= 3, children  # processor, worker, child executor
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "\n".join(lines.all[-40:])
        time.sleep(0.5)  # the reader thread has the last lines
        assert any("stopped: processor=0, worker=0, child-executor=0" in line for line in lines.all), (
            lines.all[-10:]
        )
        assert _own_processes(prefix) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            delete_topology(settings)
        except Exception as e:
            print(f"cleanup of {prefix} failed: {e}")


def test_dev_killed_outright_takes_its_services_with_it(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    # SIGKILL (or an OOM kill) runs no handler of dev's: its services, each in a session of its
    # own, must still end with it instead of living on as orphans.
    prefix = f"{topic_prefix}-devkill"
    proc, lines, settings = _start_dev(tmp_path, kafka_bootstrap, prefix)
    try:
        lines.wait_for("started; watching")
        assert len(_own_processes(prefix)) >= 3
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 30
        while _own_processes(prefix) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _own_processes(prefix) == []
    finally:
        for pid in _own_processes(prefix):
            os.kill(pid, signal.SIGKILL)
        try:
            delete_topology(settings)
        except Exception as e:
            print(f"cleanup of {prefix} failed: {e}")
