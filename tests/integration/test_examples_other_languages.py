"""The Java and Node examples (examples/java, examples/node), written from docs/contract.md and
schemas/standalone/ alone, against the real broker with a processor and a worker running:
each starts runs (inputs with a 64-bit integer), cancels one while it waits, signals another
three times with one idempotency key (one effect), and reads the run events back read_committed. Built and cached by scripts/examples.sh (Maven, npm)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from executor_support import WorkerThread
from processor_support import CODEC, Reader, make_settings, running, setup_topology, terminal_of

from processors.executors.sdk import Worker
from processors.kafka.partitioning import partition_for
from processors.runtime.settings import ProcessorSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "scripts" / "examples.sh"
DEFINITIONS = [ROOT / "examples" / "definitions" / name for name in ("one-step.yaml", "await-approval.yaml")]


@pytest.fixture(scope="module")
def built() -> None:
    """Both examples built (a cache hit after the first time: no Maven or npm run)."""
    missing = [tool for tool in ("mvn", "java", "npm", "node") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the examples need {', '.join(missing)} on PATH", pytrace=False)
    proc = subprocess.run(
        ["bash", str(EXAMPLES), "build"], capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, f"building the examples failed:\n{proc.stderr[-4000:]}"


@pytest.fixture
def settings(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, kafka_settings: object
) -> ProcessorSettings:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [yaml.safe_load(p.read_text()) for p in DEFINITIONS])
    return s


def test_java_and_node_services_start_cancel_and_read_runs(built: None, settings: ProcessorSettings) -> None:
    events = Reader(settings, [settings.topics.run_events], "run_events")
    args = [
        "--bootstrap",
        settings.bootstrap_servers,
        "--prefix",
        settings.topic_prefix,
        "--runs",
        "3",
        "--timeout-s",
        "90",
    ]
    with running(settings), WorkerThread(Worker(name="examples-test", queues=["default"]), settings):
        procs = {
            lang: subprocess.Popen(
                ["bash", str(EXAMPLES), lang, *args, "--id-prefix", lang],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for lang in ("java", "node")
        }
        outputs = {lang: p.communicate(timeout=150) for lang, p in procs.items()}
    reports: dict[str, Any] = {}
    for lang, (out, err) in outputs.items():
        assert procs[lang].returncode == 0, (
            f"{lang} example failed (exit {procs[lang].returncode}):\n{out}\n{err[-3000:]}"
        )
        reports[lang] = orjson.loads(out.strip().splitlines()[-1])
        assert reports[lang]["ok"] is True, reports[lang]
        assert reports[lang]["fingerprints"] == {
            "commands": CODEC.fingerprint("commands").hex(),
            "run_events": CODEC.fingerprint("run_events").hex(),
        }
    # what the services saw is what the log holds (read here with the Python codec)
    run_ids = [r for report in reports.values() for r in report["runs"]]
    assert len(run_ids) == 10
    signalled = [r for r in run_ids if r.endswith("-signal")]
    events.wait_for(
        lambda evs: (
            all(terminal_of(evs, r) for r in run_ids)
            and all(len([e for e in evs if e["run_id"] == r and e["sequence"] == 0]) == 2 for r in signalled)
        ),
        what="terminal events and the repeats' answers",
    )
    for run_id in run_ids:
        mine = events.of(run_id)
        assert [e["type"] for e in mine].count("RunAccepted") == 1
        assert [e["type"] for e in terminal_of(mine, run_id)] == (
            ["RunCancelled"] if run_id.endswith("-wait") else ["RunSucceeded"]
        )
        assert {e["_partition"] for e in mine} == {partition_for(run_id, settings.partitions)}
        if run_id.endswith("-signal"):
            # issue 44: the service sent one SignalRun 3 times with one key: one effect
            report = next(rep["runs"][run_id] for rep in reports.values() if run_id in rep["runs"])
            assert report["signal"]["sent"] == 3
            (received,) = [e for e in mine if e["type"] == "SignalReceived"]
            assert received["idempotency_key"] == report["signal"]["key"]
            repeats = [e for e in mine if e["type"] == "CommandDeduplicated"]
            assert [(e["answer_sequence"], e["idempotency_key"]) for e in repeats] == [
                (received["sequence"], received["idempotency_key"])
            ] * 2
            assert terminal_of(mine, run_id)[0]["output"] is True
        elif not run_id.endswith("-wait"):
            (done,) = terminal_of(mine, run_id)
            assert done["output"]["big"] > 2**62  # the 64-bit integer the service sent came back whole
    events.close()
