"""The README's CLI block works as written on the default topology: every command of it that is not
a long-running process itself runs here, through the real entry point against the real broker,
and exits 0; the long-running ones (the processor, a worker, ...) are named with why they are
not run, and the processor and a worker the `runs` commands need run beside them, as a user
would have them.

Every line of the block must be in PLAN: a command added to the README without a way to run it
here fails this test, so the block cannot drift from what works. Placeholders (RUN, ID@REV, DIR)
are filled with a run, a definition and a directory this test made.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running

import processors.demo.actions  # noqa: F401  (registers demo.flaky, flaky-retry's action)
from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.settings import KafkaSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]  # ~25 CLI processes: 250 s at load 27
ROOT = Path(__file__).resolve().parents[2]
RUNFOLD = Path(sys.executable).parent / "runfold"

# A README line (the command before its comment) -> the commands run for it, in order, or why it
# is not run. {run}, {waiting}, {failed}, {state_dir} are filled in below.
RUNS_ONLY_ALONGSIDE = "a long-running process: the test runs it beside the commands (in a thread)"
PLAN: dict[str, list[str] | str] = {
    "runfold dev definitions/ --module myapp.actions": "a long-running process (its own test: test_cli_dev.py)",
    "runfold kafka up | status | down": [
        # KAFKA_BOOTSTRAP_SERVERS is set: up checks that the cluster answers, down leaves it alone
        "runfold kafka up",
        "runfold kafka status",
        "runfold kafka down",
    ],
    "runfold topology create | verify": ["runfold topology create", "runfold topology verify"],
    "runfold defs validate examples/definitions/one-step.yaml": [
        "runfold defs validate examples/definitions/one-step.yaml"
    ],
    "runfold defs register examples/definitions/one-step.yaml": [
        "runfold defs register examples/definitions/one-step.yaml",
        "runfold defs list",
        "runfold defs show one-step@1",
    ],
    "runfold defs deprecate ID@REV · defs promote ID@REV · defs unpin ID": [
        "runfold defs promote one-step@1",
        "runfold defs unpin one-step",
        "runfold defs deprecate one-step@1",
        "runfold defs deprecate one-step@1 --undo",  # the runs below start it
    ],
    "runfold processor --instance-id p1": RUNS_ONLY_ALONGSIDE,
    "runfold worker --queue default --module myapp.actions": RUNS_ONLY_ALONGSIDE,
    "runfold child-executor": "a long-running process; no README command here starts a child run",
    'runfold runs start one-step --input \'{"text": "hi"}\' --wait': [
        'runfold runs start one-step --input \'{"text": "hi"}\' --wait'
    ],
    "runfold runs get|watch|events RUN · runs signal RUN approval --payload '{\"approved\": true}'": [
        "runfold runs get {run}",
        "runfold runs watch {run}",
        "runfold runs events {run}",
        "runfold runs signal {waiting} approval --payload '{\"approved\": true}'",
    ],
    "runfold runs cancel RUN · runs resume RUN --budget max_tokens=400000 · runs list --status failed": [
        "runfold runs cancel {cancelled}",
        "runfold runs list --status failed",
        "runfold runs resume {failed} --budget max_tokens=400000",
    ],
    "runfold replay --verify": ["runfold replay --verify"],
    "runfold replay --rebuild --state-dir DIR": ["runfold replay --rebuild --state-dir {state_dir}"],
    "runfold bench all --quick": "minutes of benchmarks (their shapes: test_benchmarks.py)",
    "runfold demo": "its own test: test_cli_demo.py (every run succeeds, no process left)",
    "runfold index run --db .runfold/index.sqlite": "a long-running process (test_index.py)",
    "runfold ui": "a long-running process (test_ui.py)",
    "runfold engine build | status": ["runfold engine build", "runfold engine status"],
}


def readme_cli_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## The CLI\n", 1)[1]
    block = re.search(r"```\n(.*?)```", section, flags=re.S)
    assert block, "the README's CLI section has no code block"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def test_every_line_of_the_readme_cli_block_is_planned() -> None:
    """Offline: a command added to, changed in or removed from the block must be planned here."""
    assert readme_cli_block() == list(PLAN)


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: KafkaSettings
) -> ProcessorSettings:
    # the default topology (4 partitions, queues default and agents): what a new user has;
    # nothing created yet (`runfold topology create` below does)
    return make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state", partitions=4)


class Cli:
    """`runfold ...` as a shell would run it, from a directory holding the README's examples/ (a
    copy: the commands' own files, e.g. a local broker's data, land there, never in the checkout)."""

    def __init__(self, settings: ProcessorSettings, cwd: Path) -> None:
        self.cwd = cwd
        shutil.copytree(ROOT / "examples" / "definitions", cwd / "examples" / "definitions")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")},
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
            "RUNFOLD_KAFKA_DATA_DIR": str(cwd / ".runfold" / "kafka"),
            "RUNFOLD_KAFKA_CLUSTER_DIR": str(cwd / ".runfold" / "kafka-cluster"),
            "RUNFOLD_STATE_DIR": str(cwd / "state"),
        }
        if "RUNFOLD_ENGINE" in os.environ:
            self.env["RUNFOLD_ENGINE"] = os.environ["RUNFOLD_ENGINE"]

    def __call__(self, command: str) -> str:
        argv = shlex.split(command)
        assert argv[0] == "runfold"
        out = subprocess.run(
            [str(RUNFOLD), *argv[1:]],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, f"`{command}` -> exit {out.returncode}\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def json(self, command: str) -> object:
        return orjson.loads(self(f"{command} --json").strip().splitlines()[-1])


@pytest.fixture
def cli(settings: ProcessorSettings, tmp_path: Path) -> Cli:
    (tmp_path / "shell").mkdir()
    return Cli(settings, tmp_path / "shell")


@pytest.fixture
def services(settings: ProcessorSettings) -> Iterator[None]:
    """The processor and a worker on the default queue, as `runfold processor` and `runfold
    worker` would be (started after the definitions are registered: the processor reads them at start)."""
    with running(settings, partitions=4), WorkerThread(Worker(name="readme"), settings):
        yield


def _status(cli: Cli, run_id: str, want: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = cli.json(f"runfold runs get {run_id}")["status"]  # type: ignore[index]
        if status == want:
            return
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} is {status}, not {want}")


def test_the_readme_cli_block_runs_as_written(
    cli: Cli, settings: ProcessorSettings, request: pytest.FixtureRequest
) -> None:
    blocks = readme_cli_block()
    planned = [line for line in blocks if isinstance(PLAN[line], list)]
    before_services = [
        line for line in planned if line.startswith(("runfold kafka", "runfold topology", "runfold defs"))
    ]
    # the broker, the topics and the definitions first, as a new user does
    for line in before_services:
        for command in PLAN[line]:
            cli(command)
    # the definitions of the runs below (not README commands: the test's own setup)
    cli(
        "runfold defs register examples/definitions/await-approval.yaml examples/definitions/flaky-retry.yaml"
    )
    request.getfixturevalue("services")
    # the runs the placeholders name: one that succeeded, one waiting for its signal, one to
    # cancel, one failed (demo.flaky failing more often than its retries allow)
    runs = {"state_dir": str(cli.cwd / "rebuilt")}
    for name, definition, run_input in (
        ("run", "one-step", '{"text": "readme"}'),
        ("waiting", "await-approval", "{}"),
        ("cancelled", "await-approval", "{}"),
        ("failed", "flaky-retry", '{"fail_times": 99, "key": "readme"}'),
    ):
        runs[name] = f"readme-{name}"
        cli(f"runfold runs start {definition} --input '{run_input}' --run-id readme-{name}")
    _status(cli, "readme-run", "succeeded")
    _status(cli, "readme-failed", "failed")
    _status(cli, "readme-waiting", "waiting")
    for line in planned:
        if line in before_services:
            continue
        for command in PLAN[line]:
            for name, value in runs.items():  # not str.format: the JSON's braces stay
                command = command.replace(f"{{{name}}}", value)
            cli(command)
    _status(cli, "readme-waiting", "succeeded")
    _status(cli, "readme-cancelled", "cancelled")
