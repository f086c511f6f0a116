"""Adversarial review of docs/tutorial.md, section 3 ("Run it for real"), and of `defs register`
(docs/client.md), run as written through the real `runfold` entry point against a real broker,
with a processor and a worker serving the tutorial's own `shop.actions`."""

from __future__ import annotations

import contextlib
import importlib
import os
import pty
import re
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from executor_support import WorkerThread
from processor_support import make_settings, running

from processors.executors import Worker
from processors.runtime.settings import ProcessorSettings
from topology.admin import create_topology, delete_topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RUNFOLD = Path(sys.executable).parent / "runfold"
DOC = (Path(__file__).resolve().parents[2] / "docs" / "tutorial.md").read_text()


@pytest.fixture
def topic_prefix() -> str:
    return f"rv6-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The tutorial's files, written as it says (section 1), its module importable."""
    for name, text in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", DOC, flags=re.S):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "shop" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        if "shop.actions" not in sys.modules:
            importlib.import_module("shop.actions")  # registers shop.price, shop.charge
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    create_topology(s)
    yield s
    with contextlib.suppress(Exception):  # tidy-up only
        delete_topology(s)


def env_for(settings: ProcessorSettings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNFOLD_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, RUNFOLD_TOPIC_PREFIX=settings.topic_prefix)
    return env


def runfold(settings: ProcessorSettings, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUNFOLD), *args], env=env_for(settings), cwd=cwd, capture_output=True, text=True, timeout=90
    )


def on_a_terminal(settings: ProcessorSettings, cwd: Path, *args: str) -> tuple[int, str]:
    """Run a command with a pseudo-terminal as its stdout and stderr, as a user sees it."""
    master, slave = pty.openpty()
    env = {**env_for(settings), "COLUMNS": "160", "LINES": "50", "TERM": "xterm"}
    proc = subprocess.Popen([str(RUNFOLD), *args], env=env, cwd=cwd, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    code = proc.wait(timeout=30)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))


def test_the_tutorial_run_for_real_section_as_written(settings: ProcessorSettings, project: Path) -> None:
    """docs/tutorial.md, "3. Run it for real":
    `runfold runs get big-1   # waiting: the approve step waits` ...
    `runfold runs watch big-1 # succeeded, output {"charged": 135, ...}` (on the user's terminal).
    """
    done = runfold(settings, project, "defs", "register", "definitions")
    assert done.returncode == 0 and "order@1" in done.stdout, done.stderr
    with running(settings), WorkerThread(Worker(name="rv6-tutorial"), settings):
        small = runfold(
            settings,
            project,
            "runs",
            "start",
            "order",
            "--input",
            '{"items": [{"sku": "apple", "qty": 2}]}',
            "--wait",
        )
        assert small.returncode == 0 and "succeeded" in small.stdout and '"charged":60' in small.stdout, small
        big = runfold(
            settings,
            project,
            *(
                "runs",
                "start",
                "order",
                "--run-id",
                "big-1",
                "--input",
                '{"items": [{"sku": "pear", "qty": 3}]}',
            ),
        )
        assert big.returncode == 0 and big.stdout.startswith("started big-1"), big
        # the approve step is reached once price ran: watch for its RunWaiting, then ask
        for _ in range(60):
            got = runfold(settings, project, "runs", "get", "big-1", "--json")
            if orjson.loads(got.stdout).get("status") == "waiting":
                break
        got = runfold(settings, project, "runs", "get", "big-1")
        assert got.returncode == 0 and "waiting" in got.stdout and "approve" in got.stdout, got
        sig = runfold(
            settings, project, "runs", "signal", "big-1", "approval", "--payload", '{"approved": true}'
        )
        assert sig.returncode == 0, sig
        code, screen = on_a_terminal(settings, project, "runs", "watch", "big-1")
        assert code == 0, screen
        assert "succeeded" in screen
        assert '"charged":135' in screen.replace(" ", ""), screen


def test_registering_a_definition_too_large_for_the_broker_names_the_rule(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/definitions.md, intro: "`runfold defs register FILE|FOLDER` ... validates it and
    publishes it; an error names the path and the rule"; "Budgets": the state is limited to
    512 KiB. A 2 MB initial state passed validation and failed at produce with a bare
    `KafkaError{code=MSG_SIZE_TOO_LARGE,...}`."""
    huge = tmp_path / "huge.json"
    huge.write_bytes(
        orjson.dumps(
            {
                "schema": "runfold.workflow/v1",
                "id": "huge",
                "revision": 1,
                "state": {"blob": "x" * 2_000_000},
                "entry": ["a"],
                "nodes": {"a": {"kind": "sleep", "duration_ms": 1}},
            }
        )
    )
    done = runfold(settings, tmp_path, "defs", "register", str(huge))
    assert done.returncode == 1
    assert "KafkaError" not in done.stderr, done.stderr
    assert "state:" in done.stderr and "[state_size]" in done.stderr, done.stderr
