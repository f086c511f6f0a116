"""`runfold dev`: one command for the edit-run loop of one's own workflows.

1. the broker (`KAFKA_BOOTSTRAP_SERVERS`, else the demo's one selection path: Docker or the
   local Apache Kafka, started if it is not running, and left running afterwards for the next
   session: `runfold kafka down` stops it);
2. the topics of the prefix, with an activation topic for every queue the definitions name
   (and `default`, `agents`), which the processor is told to serve;
3. the definitions of the folder, registered (an unchanged file again is a no-op);
4. the processor, one worker for the user's modules on all those queues, and the child
   executor, as child processes whose lines are merged into this terminal, all in one format
   (`--log-format`, human by default);
5. then a loop, twice a second: a change to a module's files restarts the worker (a worker
   that crashed, e.g. on a syntax error, starts again at the next change); a change in the
   definitions folder registers the changed files (a new revision is needed for new content:
   the error says so); the processor or the child executor ending stops the session (exit 1).

Ctrl-C (SIGINT) or SIGTERM stops every process it started and returns 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from processors.client import RunClient
from processors.client.definitions import load_source
from processors.client.errors import DefinitionConflict, InvalidDefinition
from processors.dev.services import Service, say
from processors.dev.watch import FileWatch, definition_files
from processors.engine import Catalog
from processors.engine.definition import DEFAULT_QUEUES
from topology.admin import ClusterUnreachable, TopologyError, create_topology
from topology.settings import KafkaSettings, load_settings

EXIT_OK, EXIT_SERVICE_ENDED = 0, 1
ME = "dev"


class DevError(RuntimeError):
    """The session could not start; the message says why."""


class DevBrokerUnavailable(DevError):
    """No broker answered at the configured bootstrap servers: `runfold dev` exits 3, as the
    one-shot commands do (a local broker that could not be started is exit 1: its message says why)."""


@dataclass
class DevOptions:
    definitions: Path
    modules: list[str]
    topic_prefix: str | None = None
    state_dir: Path = Path(".runfold/dev")
    log_format: str = "human"
    log_level: str = "INFO"
    poll_s: float = 0.5
    reload: bool = True


class _Stop(Exception):
    pass


def _raise_stop(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _bootstrap(console: Console) -> str:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    # The demo's broker path (kept running), imported only when no broker is configured: it
    # brings the local broker launcher, which every other `runfold` command would load for nothing.
    from processors.demo.run import DemoError, ensure_broker
    from topology.broker import BrokerError

    try:
        bootstrap, _ = ensure_broker(console, keep_broker=True)
    except (DemoError, BrokerError) as e:  # BrokerError: RUNFOLD_BROKER refused, Docker's broker not up
        raise DevError(str(e)) from None
    return bootstrap


def _register(client: RunClient, files: list[Path]) -> list[Any]:
    """Register each file; a bad one is reported and skipped, the others still count."""
    registered = []
    for path in files:
        try:
            record = client.register(path)
        except (InvalidDefinition, DefinitionConflict) as e:
            say(ME, f"{path.name}: not registered: {e}")
            continue
        say(ME, f"{path.name}: {record['definition_id']}@{record['revision']} registered")
        registered.append(record)
    return registered


def _queues(folder: Path) -> list[str]:
    """Every queue the folder's definitions name, with the processor's defaults."""
    queues = set(DEFAULT_QUEUES.values()) | {"default"}
    catalog = Catalog()
    for path in definition_files(folder):
        try:
            defn = catalog.register(load_source(path)[1])
        except Exception:  # reported when it is registered
            continue
        queues |= {node.queue for node in defn.nodes.values() if node.queue}
    return sorted(queues)


def _services(opts: DevOptions, settings: KafkaSettings, queues: list[str]) -> list[Service]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        "RUNFOLD_ACTIVATION_QUEUES": ",".join(queues),
        "RUNFOLD_LOG_FORMAT": opts.log_format,
        "PYTHONUNBUFFERED": "1",
    }
    cli = [sys.executable, "-m", "processors.cli"]
    logs = ["--log-level", opts.log_level, "--log-format", opts.log_format]
    worker = [*cli, "worker", "--name", "dev"]
    for module in opts.modules:
        worker += ["--module", module]
    for queue in queues:
        worker += ["--queue", queue]
    return [
        Service(
            "processor",
            [*cli, "processor", "--instance-id", "dev", "--state-dir", str(opts.state_dir / "state"), *logs],
            env,
        ),
        Service("worker", [*worker, *logs], env),
        Service("child-executor", [*cli, "child-executor", *logs], env),
    ]


def run_dev(opts: DevOptions, console: Console) -> int:
    if not opts.definitions.is_dir():
        raise DevError(f"{opts.definitions} is not a folder of definitions (*.yaml, *.yml, *.json)")
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    services: list[Service] = []
    try:
        bootstrap = _bootstrap(console)
        queues = _queues(opts.definitions)
        overrides: dict[str, Any] = {"bootstrap_servers": bootstrap, "activation_queues": tuple(queues)}
        if opts.topic_prefix:
            overrides["topic_prefix"] = opts.topic_prefix
        settings = load_settings(**overrides)
        try:
            report = create_topology(settings)
        except TopologyError as e:  # no cluster answering, a topic refused: one line, no traceback
            why = DevBrokerUnavailable if isinstance(e, ClusterUnreachable) else DevError
            raise why(f"the topics of {settings.topic_prefix!r} could not be created: {e}") from None
        say(
            ME,
            f"broker {bootstrap}, prefix {settings.topic_prefix!r}: {len(report.created)} topics created, "
            f"{len(report.existing)} there; queues {', '.join(queues)}",
        )
        with RunClient(settings) as client:
            _register(client, definition_files(opts.definitions))
            services = _services(opts, settings, queues)
            for service in services:
                service.start()
            say(
                ME,
                f"{', '.join(s.name for s in services)} started; "
                f"watching {'the modules and ' if opts.reload else ''}{opts.definitions}; Ctrl-C stops",
            )
            say(
                ME,
                f"try: RUNFOLD_TOPIC_PREFIX={settings.topic_prefix} KAFKA_BOOTSTRAP_SERVERS={bootstrap} "
                "runfold runs start <definition> --input '{...}' --wait",
            )
            return _loop(opts, client, services)
    except _Stop as stop:
        say(ME, f"{stop} received: stopping")
        return EXIT_OK
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
        try:
            codes = {s.name: s.stop() for s in services}
            if codes:
                say(ME, "stopped: " + ", ".join(f"{name}={code}" for name, code in codes.items()))
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _loop(opts: DevOptions, client: RunClient, services: list[Service]) -> int:
    by_name = {s.name: s for s in services}
    modules = FileWatch(opts.modules)
    definitions = FileWatch(folder=opts.definitions)
    reported_dead = False
    while True:
        time.sleep(opts.poll_s)
        for name in ("processor", "child-executor"):
            if not by_name[name].alive:
                say(ME, f"{name} exited with code {by_name[name].returncode}: stopping the session")
                return EXIT_SERVICE_ENDED
        worker = by_name["worker"]
        if not worker.alive and not reported_dead:
            say(ME, f"worker exited with code {worker.returncode}; it starts again when a module changes")
            reported_dead = True
        if opts.reload and (changed := modules.changed()):
            say(ME, f"{', '.join(p.name for p in changed)} changed: restarting the worker")
            worker.restart()  # the old one drained and stopped: what comes next is the new code's
            say(ME, f"worker restarted ({worker.restarts})")
            reported_dead = False
        if changed_defs := [p for p in definitions.changed() if p.exists()]:
            _register(client, changed_defs)
