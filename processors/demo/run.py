"""The end-to-end demo: everything runfold does, on one machine, in about a minute.

1. a broker (topology.broker's one selection path: an existing cluster, Docker, or the
   local Apache Kafka jars), 2. the topics under a fresh prefix, 3. the example
   definitions, 4. the processor, an action worker (with the demo actions) and the child
   executor as subprocesses, 5. a batch of runs — agent research with a map fan-out, a
   child workflow and an approval wait the demo signals; retries of a flaky action; a
   budget warning; plain one-step runs — with live progress from the committed run events,
   6. the outcome table, 7. `replay --verify`, 8. a clean shutdown of every process.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from processors.client import RunClient
from processors.client.progress import RunBoard
from processors.client.reader import PartitionReader
from processors.demo.procs import Children, managed
from processors.executors.settings import WorkerSettings
from processors.replay import VerifyReport, verify
from schemas import Codec
from topology import broker, local_kafka
from topology.admin import create_topology, delete_topology
from topology.settings import KafkaSettings, admin_config, load_settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "definitions"
DEMO_DEFINITIONS = (
    "summarize.yaml",
    "demo-research.yaml",
    "flaky-retry.yaml",
    "demo-budget.yaml",
    "one-step.yaml",
    "noop-3.yaml",
)
TOPICS = ("Kafka transactions", "event sourcing", "durable AI agents")
_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "waiting": "cyan",
    "running": "blue",
    "paused": "magenta",
    "rejected": "red",
}


class DemoError(RuntimeError):
    """A demo step failed; the message says which and where the logs are."""


@dataclass
class DemoResult:
    prefix: str
    bootstrap: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    verify: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    log_dir: str = ""
    stopped: dict[str, int | None] = field(default_factory=dict)
    broker: str = ""

    @property
    def ok(self) -> bool:
        roots = [r for r in self.runs if not r["child"]]
        return bool(roots) and all(r["status"] == "succeeded" for r in roots) and bool(self.verify.get("ok"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "prefix": self.prefix,
            "bootstrap": self.bootstrap,
            "seconds": round(self.seconds, 1),
            "runs": self.runs,
            "verify": self.verify,
            "log_dir": self.log_dir,
            "processes": self.stopped,
            "broker": self.broker,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_broker(console: Console, keep_broker: bool) -> tuple[str, Any]:
    """Start (or find) the broker. Returns its bootstrap servers and a stop callback (or None)."""
    try:
        choice = broker.choose_broker()
    except broker.BrokerError as e:  # RUNFOLD_BROKER refused: one line, no traceback
        raise DemoError(str(e)) from e
    console.print(f"[bold]1. broker[/]  {choice.kind}: {choice.reason}", highlight=False)
    if choice.kind == "local":
        try:
            cfg = local_kafka.LocalKafkaConfig.from_env()
            status = local_kafka.up(cfg)
        except local_kafka.LocalKafkaError as e:  # port taken, no Java, jars not fetched: its message says
            raise DemoError(f"the local Kafka broker could not start: {e}") from e
        started_here = not status.already_running
        console.print(
            f"   local Apache Kafka on {status.bootstrap} "
            f"({'started in %.1fs' % (status.startup_seconds or 0) if started_here else 'already running'})",
            highlight=False,
        )
        stop = (lambda: broker.stop_broker(choice, cfg)) if started_here and not keep_broker else None
        return status.bootstrap, stop
    try:
        bootstrap = broker.start_broker(choice)
    except broker.BrokerError as e:  # no broker answering at KAFKA_BOOTSTRAP_SERVERS, Docker's not up
        raise DemoError(str(e)) from e
    console.print(f"   {bootstrap} answers", highlight=False)
    return bootstrap, None


def _start_runs(client: RunClient) -> list[str]:
    ids = [client.start("demo-research", {"topic": t}, run_id=f"research-{i}") for i, t in enumerate(TOPICS)]
    ids += [
        client.start("flaky-retry", {"fail_times": 1 + i % 2, "key": f"k{i}"}, run_id=f"flaky-{i}")
        for i in range(4)
    ]
    ids += [client.start("demo-budget", {}, run_id=f"budget-{i}") for i in range(2)]
    ids += [client.start("one-step", {"text": f"hello {i}"}, run_id=f"echo-{i}") for i in range(6)]
    ids += [client.start("noop-3", {}, run_id=f"noop-{i}") for i in range(3)]
    return ids


def _board_view(board: RunBoard, roots: list[str], started: float, note: str) -> Group:
    counts = board.counts()
    done = sum(
        1 for r in roots if board.runs.get(r, {}).get("status") in ("succeeded", "failed", "cancelled")
    )
    head = Text.assemble(
        ("5. runs ", "bold"),
        f"{done}/{len(roots)} finished · {len(board.runs)} incl. child runs · ",
        *[(f"{k} {v}  ", _STYLE.get(k, "")) for k, v in sorted(counts.items())],
        f"· {time.monotonic() - started:.1f}s",
    )
    table = Table("run", "definition", "status", "steps", "retries", "events", box=None, padding=(0, 1))
    for run_id in sorted(board.runs):
        r = board.runs[run_id]
        table.add_row(
            Text(run_id),
            r["definition"],
            Text(r["status"], style=_STYLE.get(r["status"], "")),
            str(r["steps_done"]),
            str(r["retries"]),
            str(r["events"]),
        )
    return Group(head, table, Text(note, style="dim"))


def follow_runs(
    client: RunClient,
    settings: KafkaSettings,
    roots: list[str],
    children: Children,
    console: Console,
    timeout_s: float,
    quiet: bool,
) -> RunBoard:
    """Live table from the committed run events; approves research runs when they wait."""
    board = RunBoard()
    decode = Codec.default().decoder("run_events")
    approved: set[str] = set()
    waiting_since: dict[str, float] = {}
    reader = PartitionReader(settings)
    topic = client.topics.run_events
    parts = reader.partition_count(topic)
    started = time.monotonic()
    note = ""
    try:
        live_view = Live(_board_view(board, roots, started, note), console=console, refresh_per_second=6)
        with nullcontext(None) if quiet else live_view as live:
            for msg in reader.read(
                {(topic, p): OFFSET_BEGINNING for p in range(parts)},
                follow=True,
                deadline=started + timeout_s,
            ):
                if msg is not None:
                    ev = decode(msg.value())
                    board.apply(ev)
                    if ev["type"] == "RunWaiting" and ev["signal"] == "approval":
                        waiting_since[ev["run_id"]] = time.monotonic()
                # a person would take longer: approve each waiting research run after a visible pause
                for run_id, since in list(waiting_since.items()):
                    if run_id not in approved and time.monotonic() - since > 1.0:
                        client.signal(run_id, "approval", {"approved": True, "by": "demo"})
                        approved.add(run_id)
                        note = f"approved {', '.join(sorted(approved))} (SignalRun 'approval')"
                dead = children.dead()
                if dead:
                    raise DemoError(
                        f"{dead[0].name} exited with {dead[0].proc.returncode}:\n{dead[0].tail()}"
                    )
                if live is not None:
                    live.update(_board_view(board, roots, started, note))
                if all(
                    board.runs.get(r, {}).get("status") in ("succeeded", "failed", "cancelled", "rejected")
                    for r in roots
                ):
                    break
    finally:
        reader.close()
    return board


def outcome_rows(board: RunBoard, roots: list[str]) -> list[dict[str, Any]]:
    rows = []
    for run_id in sorted(board.runs, key=lambda r: (r not in roots, r)):
        r = board.runs[run_id]
        usage = r["usage"] or {}
        rows.append(
            {
                "run_id": run_id,
                "child": run_id not in roots,
                "definition": r["definition"],
                "status": r["status"],
                "steps": r["steps_done"],
                "retries": r["retries"],
                "budget_warnings": r["warnings"],
                "tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
                "cost_micros": usage.get("cost_micros", 0),
                "ms": r["last_ms"] - r["first_ms"],
                "failure": r["failure"],
            }
        )
    return rows


def outcome_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="6. outcomes", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("run", "definition", "status", "steps", "retries", "warn", "tokens", "µ$", "ms"):
        table.add_column(
            col, no_wrap=True, justify="left" if col in ("run", "definition", "status") else "right"
        )
    for r in rows:
        table.add_row(
            Text(("↳ " if r["child"] else "") + r["run_id"]),
            r["definition"],
            Text(r["status"], style=_STYLE.get(r["status"], "")),
            str(r["steps"]),
            str(r["retries"]),
            str(r["budget_warnings"] or ""),
            str(r["tokens"]),
            str(r["cost_micros"]),
            str(r["ms"]),
        )
    return table


def _print_verify(console: Console, report: VerifyReport) -> None:
    if report.ok:
        console.print(
            f"[bold]7. replay --verify[/]  [green]OK[/]: {report.runs} runs folded from "
            f"{report.events} committed events, every state digest equals its snapshot "
            f"(in {report.seconds:.2f}s)",
            highlight=False,
        )
    else:
        console.print(
            f"[bold]7. replay --verify[/]  [red]{len(report.differences)} difference(s)[/]", highlight=False
        )
        for d in report.differences:
            console.print(Text(f"   {d.run_id}: {d.kind} {d.detail}"))


def _wait_ready(
    query_port: int,
    partitions: int,
    children: Children,
    groups: list[str],
    admin: AdminClient,
    timeout_s: float,
) -> None:
    """The processor owns its partitions, restored, and the worker's and child executor's groups
    hold theirs: runs started before the executors joined would wait for them, and their
    durations (the `ms` column) would show the executors' start-up, not runfold's latency."""
    deadline = time.monotonic() + timeout_s
    waiting = ["the processor", *groups]
    while time.monotonic() < deadline:
        dead = children.dead()
        if dead:
            raise DemoError(f"{dead[0].name} exited with {dead[0].proc.returncode}:\n{dead[0].tail()}")
        if waiting[0] == "the processor":
            try:  # and owns every partition, restored: a run started before that waits for it
                health = httpx.get(f"http://127.0.0.1:{query_port}/health", timeout=1).json()
                if (
                    health.get("ready")
                    and len(health.get("owned", [])) == partitions
                    and not health.get("restoring")
                ):
                    waiting.pop(0)
            except (httpx.HTTPError, ValueError):
                pass
        waiting = [w for w in waiting if w == "the processor" or not _group_holds_partitions(admin, w)]
        if not waiting:
            return
        time.sleep(0.2)
    raise DemoError(f"not ready within {timeout_s:.0f}s: {', '.join(waiting)}")


def _group_holds_partitions(admin: AdminClient, group: str) -> bool:
    try:
        [description] = [
            f.result(10) for f in admin.describe_consumer_groups([group], request_timeout=5).values()
        ]
    except (KafkaException, TimeoutError):  # not answered yet: ask again
        return False
    return description.state == ConsumerGroupState.STABLE and any(
        m.assignment is not None and m.assignment.topic_partitions for m in description.members
    )


def run_demo(
    console: Console,
    *,
    prefix: str | None = None,
    partitions: int = 4,
    keep_broker: bool = False,
    timeout_s: float = 150.0,
    quiet: bool = False,
    log_dir: Path | None = None,
    delete_topics: bool = False,
) -> DemoResult:
    t0 = time.monotonic()
    prefix = prefix or f"demo-{uuid.uuid4().hex[:6]}"
    queues = ("default", "agents")
    # Checked before a broker is started: invalid settings stop here, with nothing to clean up.
    base = load_settings(topic_prefix=prefix, partitions=partitions, activation_queues=queues)
    bootstrap, stop_broker = ensure_broker(console, keep_broker)
    work = log_dir or Path(tempfile.mkdtemp(prefix=f"runfold-{prefix}-"))
    result = DemoResult(prefix=prefix, bootstrap=bootstrap, log_dir=str(work))
    settings = base.model_copy(update={"bootstrap_servers": bootstrap})
    try:
        report = create_topology(settings)
        console.print(
            f"[bold]2. topics[/]  {len(report.to_dict().get('created', []))} created under prefix "
            f"[bold]{prefix}[/] ({partitions} partitions)",
            highlight=False,
        )
        with RunClient(settings, timeout_s=20, answer_timeout_s=0) as client:  # outcomes via wait_all
            for name in DEMO_DEFINITIONS:
                client.register(EXAMPLES / name)
            console.print(
                f"[bold]3. definitions[/]  {', '.join(n.removesuffix('.yaml') for n in DEMO_DEFINITIONS)}",
                highlight=False,
            )
            env = {
                **_base_env(),
                "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                "RUNFOLD_BOOTSTRAP_SERVERS": bootstrap,
                "RUNFOLD_TOPIC_PREFIX": prefix,
                "RUNFOLD_PARTITIONS": str(partitions),
                "RUNFOLD_ACTIVATION_QUEUES": ",".join(queues),
            }
            # The query endpoint listens on 127.0.0.1, where any user of this machine reaches it: a
            # token (a file only this user reads) keeps the demo's runs to itself on a shared host.
            env["RUNFOLD_QUERY_TOKEN_FILE"] = str(_token_file(work))
            query_port = _free_port()
            cli = [sys.executable, "-m", "processors.cli"]
            with managed(Children(work, env)) as children:
                children.start(
                    "processor",
                    [
                        *cli,
                        "processor",
                        "--instance-id",
                        f"{prefix}-0",
                        "--state-dir",
                        str(work / "state"),
                        "--query-port",
                        str(query_port),
                    ],
                )
                children.start(
                    "worker",
                    [
                        *cli,
                        "worker",
                        "--module",
                        "processors.demo.actions",
                        "--name",
                        "demo",
                        "--queue",
                        "default",
                        "--queue",
                        "agents",
                    ],
                )
                children.start("child-executor", [*cli, "child-executor", "--instance-id", f"{prefix}-0"])
                console.print(
                    f"[bold]4. processes[/]  processor, worker (demo.flaky, demo.search, local agents), "
                    f"child executor — logs in {work}",
                    highlight=False,
                )
                # model_construct: the group id depends only on the queues (the children get a
                # filtered environment, so this shell's RUNFOLD_WORKER_* must not matter here)
                groups = [
                    WorkerSettings.model_construct(queues=list(queues)).group_id(prefix),
                    f"{prefix}-child-executor",
                ]
                _wait_ready(query_port, partitions, children, groups, AdminClient(admin_config(settings)), 60)
                roots = _start_runs(client)
                board = follow_runs(
                    client,
                    settings,
                    roots,
                    children,
                    console,
                    max(timeout_s - (time.monotonic() - t0), 10),
                    quiet,
                )
                result.runs = outcome_rows(board, roots)
                if not quiet:
                    console.print()
                    console.print(outcome_table(result.runs))
                report_v = verify(settings)
                result.verify = report_v.to_dict()
                if not quiet:
                    _print_verify(console, report_v)
            result.stopped = children.exit_codes
    finally:
        if delete_topics:
            delete_topology(settings)
        if stop_broker is not None:
            result.broker = stop_broker()
    result.seconds = time.monotonic() - t0
    return result


def _token_file(work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "query-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def _base_env() -> dict[str, str]:
    keep = (
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "JAVA_HOME",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "RUNFOLD_CONFIG",
    )
    return {k: v for k, v in os.environ.items() if k in keep or k.startswith("RUNFOLD_CLIENT_")}
