"""`runfold defs validate` (issue 24, point 2): offline (the bootstrap points at a port where
nothing listens), exit 0 when every file is valid and 1 otherwise, one line per problem naming
the file, the definition, the node and field, and the rule; `--json` one object per file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

RUNFOLD = [sys.executable, "-m", "processors.cli"]
ROOT = Path(__file__).resolve().parents[2]

GOOD = """schema: runfold.workflow/v1
id: triage
revision: 1
state: {approved: false}
entry: [classify]
nodes:
  classify: {kind: action, action: do}
  review: {kind: wait, signal: approval, payload_schema: {type: object, required: [approved]},
           writes: {approved: {from: signal, pointer: /approved}}}
routes:
  classify: [review]
"""
BAD = """schema: runfold.workflow/v1
id: triage
revision: 2
state: {approved: false}
entry: [search]
nodes:
  search: {kind: action, action: do, queue: tools}
  done: {kind: action, action: do}
routes:
  search: [{to: done, when: "stat.approved"}]
"""


def validate(*args: str, queues: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))}
    env["KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:1"  # nothing listens: validate must not need it
    if queues is not None:
        env["RUNFOLD_ACTIVATION_QUEUES"] = queues
    return subprocess.run(
        [*RUNFOLD, "defs", "validate", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(BAD)
    return good, bad


def test_valid_files_exit_0(files: tuple[Path, Path]) -> None:
    done = validate(str(files[0]))
    assert done.returncode == 0, done.stderr
    assert "✓ triage@1" in done.stdout and done.stderr == ""


def test_each_problem_is_one_line_naming_file_definition_node_field_and_rule(
    files: tuple[Path, Path],
) -> None:
    good, bad = files
    done = validate(str(good), str(bad))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    queue, scope = sorted(lines)
    assert queue.startswith(f"✗ {bad}: triage@2: error: nodes.search.queue: unknown queue 'tools'")
    assert "RUNFOLD_ACTIVATION_QUEUES=agents,default,tools" in queue and queue.endswith("[unknown_queue]")
    assert scope == (  # as docs/client.md shows it
        f"✗ {bad}: triage@2: error: routes.search[0].when: unknown variable 'stat': "
        "a condition sees only state, input, output [condition_scope]"
    )
    assert "✓ triage@1" in done.stdout


def test_the_served_queues_come_from_the_option_or_the_environment(files: tuple[Path, Path]) -> None:
    bad = files[1]
    fixed = bad.read_text().replace("stat.approved", "state.approved")
    bad.write_text(fixed)
    assert validate(str(bad)).returncode == 1
    assert validate(str(bad), queues="default,tools").returncode == 0
    assert validate(str(bad), "--queue", "tools").returncode == 1  # the option replaces the default queues
    assert validate(str(bad), "-q", "default", "-q", "tools").returncode == 0


def test_json_is_one_object_per_file(files: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("id: [\n")
    done = validate(str(tmp_path), "--json")
    assert done.returncode == 1
    rows = {Path(row["file"]).name: row for row in map(orjson.loads, done.stdout.splitlines())}
    assert rows["good.yaml"]["ok"] is True and rows["good.yaml"]["errors"] == []
    assert rows["broken.yaml"]["ok"] is False and rows["broken.yaml"]["definition"] is None
    bad = rows["bad.yaml"]
    assert bad["definition"] == "triage@2" and not bad["ok"]
    assert {(e["node"], e["field"], e["rule"]) for e in bad["errors"]} == {
        ("search", "queue", "unknown_queue"),
        ("search", "routes[0].when", "condition_scope"),
    }
