"""Processes the chaos scenarios start, kill -9 and restart: processors and noop/sleep workers.

Each is a real subprocess (`python -m processors.runtime`, `python -m processors.cli.worker
worker`) with its own log file under the test's tmp dir; `ready()` waits until the
processor group is Stable with every processor holding partitions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from processors.runtime.settings import ProcessorSettings
from topology.settings import admin_config


class Fleet:
    def __init__(self, settings: ProcessorSettings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kills: dict[str, int] = {}
        self.exits: list[tuple[str, int]] = []  # (name, code) of processes that ended by themselves
        self.args: dict[str, list[str]] = {}  # how each was started: a restart starts it the same way
        self.extra_env: dict[str, dict[str, str]] = {}

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RUNFOLD_") and k != "KAFKA_BOOTSTRAP_SERVERS"
        }
        return {
            **env,
            "KAFKA_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "RUNFOLD_TOPIC_PREFIX": self.settings.topic_prefix,
            **(extra or {}),
        }

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with self.log(name).open("ab") as lf:
            proc = subprocess.Popen(args, env=self._env(env), stdout=subprocess.DEVNULL, stderr=lf)
        self.procs[name] = proc
        self.args[name] = args
        self.extra_env[name] = dict(env or {})
        return proc

    def processor(self, name: str = "p1", instance_id: str | None = None) -> subprocess.Popen[bytes]:
        s = self.settings
        return self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "processors.runtime",
                "--instance-id",
                instance_id or name,
                "--state-dir",
                str(Path(s.state_dir) / name),
                "--commit-interval-ms",
                str(s.commit_interval_ms),
            ],
        )

    def worker(
        self,
        name: str = "w1",
        concurrency: int = 64,
        modules: tuple[str, ...] = (),
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`modules`: action modules to load; `config`: a WorkerSettings YAML; `env`: variables
        for the handlers (the fleet passes on no RUNFOLD_* of the test's own)."""
        extra = [arg for module in modules for arg in ("--module", module)]
        if config is not None:
            extra += ["--config", str(config)]
        return self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "processors.cli.worker",
                "worker",
                "--queue",
                "default",
                "--name",
                name,
                "--concurrency",
                str(concurrency),
                "--log-level",
                "WARNING",
                *extra,
            ],
            env,
        )

    def child_executor(self, name: str = "c1") -> subprocess.Popen[bytes]:
        return self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "processors.cli.worker",
                "child-executor",
                "--instance-id",
                name,
                "--log-level",
                "INFO",
            ],
        )

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.kills[name] = self.kills.get(name, 0) + 1

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        if name in self.args:
            return self._spawn(name, self.args[name], self.extra_env[name])
        if name.startswith("c"):
            return self.child_executor(name)
        return self.worker(name) if name.startswith("w") else self.processor(name)

    def supervise(self) -> list[str]:
        """Restart any process that ended by itself (what a supervisor would do); returns them."""
        restarted = []
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None:
                self.exits.append((name, code))
                self.restart(name)
                restarted.append(name)
        return restarted

    def ready(self, processors: int = 1, timeout: float = 90.0) -> None:
        self._group_ready(f"{self.settings.topic_prefix}-processor", processors, timeout, "processor")

    def workers_ready(self, workers: int, queue: str = "default", timeout: float = 90.0) -> None:
        """The workers' group is Stable with `workers` members each holding partitions (so no
        rebalance moves activations between them once the load starts)."""
        self._group_ready(f"{self.settings.topic_prefix}-worker-{queue}", workers, timeout, "worker")

    def _group_ready(self, group: str, members: int, timeout: float, what: str) -> None:
        """Until `group` is Stable with `members` members that all hold partitions; an exited
        process of the fleet fails at once (waiting on would only hide why)."""
        admin = AdminClient(admin_config(self.settings))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = {name: proc.returncode for name, proc in self.procs.items() if proc.poll() is not None}
            if ended:
                raise AssertionError(f"{ended} exited while the fleet started; logs: {self.tails()}")
            try:
                desc = admin.describe_consumer_groups([group])[group].result(10)
                holding = [m for m in desc.members if m.assignment and m.assignment.topic_partitions]
                if str(desc.state).endswith("STABLE") and len(holding) == members:
                    return
            except Exception:
                pass
            time.sleep(0.3)
        raise AssertionError(
            f"{what} group {group} not stable with {members} member(s) in {timeout}s; logs: {self.tails()}"
        )

    def tails(self, n: int = 1200) -> dict[str, str]:
        out = {}
        for name in self.procs:
            try:
                out[name] = self.log(name).read_text(errors="replace")[-n:]
            except OSError:
                out[name] = ""
        return out

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                codes[name] = None
        return codes
