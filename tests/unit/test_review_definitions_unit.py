"""Adversarial review of docs/definitions.md and docs/client.md ("Checking and registering
definitions") through `runfold defs validate`, run as a user would (a subprocess, no broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

RUNFOLD = [sys.executable, "-m", "processors.cli"]
ROOT = Path(__file__).resolve().parents[2]

HEAD = """schema: runfold.workflow/v1
id: shop
revision: 1
entry: [a]
"""
SLEEP = "nodes: {a: {kind: sleep, duration_ms: 1}}\n"


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNFOLD_", "KAFKA_"))}
    env["KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:1"  # nothing listens: validate needs no broker
    env["RUNFOLD_TOPIC_PREFIX"] = "rv6-unit"
    return subprocess.run(
        [*RUNFOLD, "defs", "validate", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_file_that_is_not_utf8_is_one_error_line_not_a_traceback(tmp_path: Path) -> None:
    """docs/client.md, "Checking and registering definitions": `defs validate` "prints one line
    per problem on stderr, naming the file ..."; exit 1 when a file is not valid."""
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes((HEAD + 'description: "caf\xe9"\n' + SLEEP).encode("latin-1"))
    line = one_error(validate(str(bad)))
    assert line.startswith(f"✗ {bad}") and "UTF-8" in line


def test_a_yaml_syntax_error_says_where(tmp_path: Path) -> None:
    """docs/definitions.md, intro: "an error names the path and the rule". A YAML syntax error
    has no definition path; the line in the file is the only way to find it."""
    bad = tmp_path / "broken.yaml"
    bad.write_text(HEAD + "nodes:\n  a: {kind: sleep, duration_ms: 1\n  b: [\n")
    line = one_error(validate(str(bad)))
    assert "line 7" in line, line


def test_a_nested_duplicate_yaml_key_is_refused_and_located(tmp_path: Path) -> None:
    """docs/definitions.md, intro: "Unknown fields are refused everywhere, duplicate YAML keys
    too" and "an error names the path and the rule"."""
    bad = tmp_path / "dup.yaml"
    bad.write_text(HEAD + "nodes:\n  a:\n    kind: sleep\n    duration_ms: 1\n    duration_ms: 2\n")
    line = one_error(validate(str(bad)))
    assert "duplicate key 'duration_ms'" in line and "line 9" in line, line


def test_duplicate_keys_in_a_json_definition_are_refused_too(tmp_path: Path) -> None:
    """docs/definitions.md, intro: "A definition is one YAML or JSON document ... duplicate YAML
    keys too [are refused]". A JSON file must not silently keep the last of two `revision`s."""
    bad = tmp_path / "dup.json"
    bad.write_text(
        '{"schema": "runfold.workflow/v1", "id": "shop", "revision": 1, "revision": 2,'
        ' "entry": ["a"], "nodes": {"a": {"kind": "sleep", "duration_ms": 1}}}'
    )
    line = one_error(validate(str(bad)))
    assert "duplicate key 'revision'" in line, line


def test_a_typo_in_a_prompt_mapping_is_reported(tmp_path: Path) -> None:
    """docs/definitions.md, "Nodes": `prompt` is "a string, or `{system: ..., user: ...}`", and
    the intro: "Unknown fields are refused everywhere". `usr:` was accepted without a word and
    the executor (agents/structured.py `prompt_messages`) drops it: the agent gets an empty
    user message. examples/definitions/summarize.yaml has this very mistake (`topic:`, `notes:`)."""
    bad = tmp_path / "typo.yaml"
    bad.write_text(
        HEAD.replace("[a]", "[t]")
        + "nodes:\n  t: {kind: agent, agent: support, prompt: {system: 'You triage.', "
        "usr: {from: input, pointer: /ticket}}}\n"
    )
    done = validate(str(bad))
    assert "nodes.t.prompt.usr" in done.stderr and "[prompt_key]" in done.stderr, done.stderr


def test_an_initial_state_over_the_state_ceiling_is_refused(tmp_path: Path) -> None:
    """docs/definitions.md, "Budgets": "Size limits ... (server ceilings): ... the state 512
    KiB". A definition whose initial state is larger validated (and registered) fine, and every
    start of it was then rejected `Limit` (a run-state record the broker refuses)."""
    big = tmp_path / "big.json"
    big.write_bytes(
        orjson.dumps(
            {
                "schema": "runfold.workflow/v1",
                "id": "big",
                "revision": 1,
                "state": {"blob": "x" * 600_000},
                "entry": ["a"],
                "nodes": {"a": {"kind": "sleep", "duration_ms": 1}},
            }
        )
    )
    line = one_error(validate(str(big)))
    assert "state:" in line and "[state_size]" in line, line


def test_a_small_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """docs/definitions.md, "Budgets": "the state 512 KiB". 500 bytes of YAML aliases expand to
    a million-item state: refused, and in seconds."""
    rows = ["state:", "  x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]" for i in range(1, 6)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(HEAD + "\n".join(rows) + "\n" + SLEEP)
    started = time.monotonic()
    line = one_error(validate(str(bomb)))
    assert "[state_size]" in line, line
    assert time.monotonic() - started < 45


def test_a_folder_without_definition_files_is_not_silently_valid(tmp_path: Path) -> None:
    """docs/client.md, "Checking and registering definitions": "Exit 0 when every file is
    valid". A folder holding no `.yaml`/`.yml`/`.json` (a typo, the wrong folder) checked
    nothing, printed nothing and exited 0."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "order.yml.txt").write_text(HEAD + SLEEP)
    done = validate(str(tmp_path / "defs"))
    assert done.returncode == 1
    assert "no definition files" in done.stderr


def test_a_shape_error_names_the_definition(tmp_path: Path) -> None:
    """docs/client.md, "Checking and registering definitions": each line names "the file, the
    definition, the path (node and field) and the rule" (`✗ defs/triage.yaml: triage@2: error:
    ...`); `--json` has "definition". Its id and revision were read fine."""
    bad = tmp_path / "shape.yaml"
    bad.write_text(HEAD + "nodes: {a: {kind: sleep, duration_ms: 1.5}}\n")
    line = one_error(validate(str(bad)))
    assert line.startswith(f"✗ {bad}: shop@1: error: nodes.a.duration_ms: "), line
    row = orjson.loads(validate(str(bad), "--json").stdout)
    assert row["definition"] == "shop@1"


@pytest.mark.parametrize(
    ("text", "rule"),
    [("", "shape"), ("[1, 2]\n", "shape"), ("id: [\n", "syntax")],
    ids=["empty", "a list", "bad yaml"],
)
def test_a_file_level_error_is_said_once_with_its_own_rule(tmp_path: Path, text: str, rule: str) -> None:
    """docs/client.md, "Checking and registering definitions": one line per problem "naming ...
    the path ... and the rule"; `--json`: `errors: [{"path", ..., "rule", "message"}]`. The
    line said `(top level): (top level): ... [shape] [syntax]` and the JSON rule was always
    `syntax`, with the path and rule repeated inside the message."""
    f = tmp_path / "f.yaml"
    f.write_text(text)
    line = one_error(validate(str(f)))
    assert line.count("(top level)") <= 1 and line.endswith(f"[{rule}]"), line
    [error] = orjson.loads(validate(str(f), "--json").stdout)["errors"]
    assert error["rule"] == rule and "[" not in error["message"], error


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_and_infinity_in_a_yaml_definition_are_refused_with_their_path(
    tmp_path: Path, value: str
) -> None:
    """docs/definitions.md: an error names the path and the rule. YAML's `.nan` / `.inf` have no
    JSON form: orjson wrote them as null, so `state.x` silently became null."""
    f = tmp_path / "nan.yaml"
    f.write_text(HEAD + f"state: {{x: {value}}}\nnodes: {{a: {{kind: action, action: do}}}}\n")
    line = one_error(validate(str(f)))
    assert "state.x: NaN and infinity have no JSON form [not_json]" in line, line
