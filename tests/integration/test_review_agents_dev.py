"""Adversarial review: tool-using agent loops end to end on the real broker, and the developer
commands (`runfold dev`, `runfold kafka`). Each test quotes the promise it checks.

No test here starts or stops a broker: the `runfold dev` / `runfold kafka` error paths are
driven with settings that fail before any broker would start, in a temporary working directory
with its own RUNFOLD_KAFKA_DATA_DIR."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import WorkerThread
from processor_support import Reader, make_settings, running, setup_topology

from processors.executors import Worker
from processors.executors.settings import AgentsConfig, ProviderConfig, WorkerSettings
from processors.runtime.settings import ProcessorSettings
from tests.agent_loop_definitions import TRIAGE_SCHEMA, triage_definition
from tests.agent_stand_in import Answer, Call, Recorded, StandIn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parent.parent.parent

KB = {"kb_search": {"action": "loop.record", "input_schema": {"type": "object", "required": ["query"]}}}
ERRORS = triage_definition("rv-tool-errors", KB, output_schema=TRIAGE_SCHEMA)
COSTED = {
    **triage_definition("rv-cost", KB, output_schema=TRIAGE_SCHEMA),
    "budgets": {"max_cost_micros": 1000},
}


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [ERRORS, COSTED])
    yield s
    from topology.admin import delete_topology

    with contextlib.suppress(Exception):
        delete_topology(s)


@contextlib.contextmanager
def fleet(
    settings: ProcessorSettings, model: StandIn, prices: dict[str, Any] | None = None
) -> Iterator[None]:
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    agents = AgentsConfig(
        providers={"m": ProviderConfig(kind="openai", base_url=model.base_url + "/v1", prices=prices or {})},
        routes={"*": "m"},
    )
    worker = Worker(name="rv", queues=["default", "agents"], settings=WorkerSettings(agents=agents))
    with running(settings), WorkerThread(worker, settings):
        yield


def _turn(request: Recorded) -> int:
    return sum(1 for m in request.body["messages"] if m.get("role") == "assistant")


def _terminal(events: Reader, run: str) -> None:
    events.wait_for(
        lambda r: bool(
            events.of(run, "RunSucceeded") or events.of(run, "RunFailed") or events.of(run, "RunPaused")
        ),
        90,
        "terminal or paused",
    )


def test_every_kind_of_tool_failure_is_an_error_result_the_model_reads(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/semantics.md "Agent loops": "A call of an unknown tool, or whose arguments are not an
    object or fail the tool's input_schema, settles at once (UnknownReference / InvalidInput, no
    activation) as an error result; a call whose tool fails ... is an error result as well";
    "Size limits": an action output over max_payload_bytes fails the attempt InvalidOutput;
    docs/executors.md "Receipts": a receipt over message.max.bytes "is replaced by a small
    ActivationFailed InvalidOutput". executors.md "Providers for tool-using agents": arguments
    that are not valid JSON are kept raw "for the engine to answer with an error result"."""
    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(tmp_path / "tools.jsonl"))

    def script(request: Recorded) -> Answer:
        if _turn(request) == 0:
            return Answer(
                text="",
                tool_calls=[
                    Call("huge", "kb_search", {"query": "huge", "pad": 1_500_000}),
                    Call("big", "kb_search", {"query": "big", "pad": 300_000}),
                    Call("shell", "shell", {"cmd": "rm -rf /"}),
                    Call("noquery", "kb_search", {"q": 1}),
                    Call("broken", "kb_search", {"query": "broken"}),
                    Call("raw", "kb_search", '{"query": "unterminated'),
                    Call("fine", "kb_search", {"query": "fine"}),
                ],
            )
        return Answer(text='{"category": "bug"}')

    events = Reader(settings, [settings.topics.run_events], "run_events")
    with StandIn([script] * 2) as model:
        with fleet(settings, model):
            from processors.client import RunClient

            with RunClient(settings) as client:
                client.start("rv-tool-errors", {"ticket": "t"}, run_id="e-1")
            _terminal(events, "e-1")
        requests = list(model.requests)
    assert events.of("e-1", "RunSucceeded"), events.of("e-1", "RunFailed")
    assert len(requests) == 2
    second = requests[1].body["messages"]
    results = {m["tool_call_id"]: m["content"] for m in second if m["role"] == "tool"}
    assert list(results) == ["huge", "big", "shell", "noquery", "broken", "raw", "fine"]
    assert results["huge"].startswith("error InvalidOutput:"), results["huge"][:300]
    assert results["big"].startswith("error InvalidOutput: output of "), results["big"][:300]
    assert "max_payload_bytes" in results["big"]
    assert results["shell"].startswith("error UnknownReference: there is no tool 'shell'")
    assert results["noquery"].startswith("error InvalidInput:")
    assert results["broken"] == "error ExecutionFailed: the knowledge base is offline"
    assert results["raw"] == "error InvalidInput: the arguments of kb_search must be a JSON object"
    assert '"found fine"' in results["fine"]
    assistant = next(m for m in second if m["role"] == "assistant")
    raw_call = next(c for c in assistant["tool_calls"] if c["id"] == "raw")
    assert raw_call["function"]["arguments"] == '{"query": "unterminated'  # sent back verbatim
    # the refused calls never reached a worker
    started = {e["lineage"] for e in events.of("e-1", "StepStarted")}
    assert {"~1.2", "~1.3", "~1.5"}.isdisjoint(started)
    events.close()


def test_a_cost_budget_holds_when_the_server_names_a_dated_model(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """docs/semantics.md "Agent loops": "tokens and cost after each turn. An exhausted budget
    pauses the run (BudgetExhausted, RunPaused)"; docs/executors.md: `prices` are "micros per 1000
    prompt / completion tokens", usage "priced by prices". The route's price table is keyed by
    the node's model ("small"); the server answers as "small-2025-01-01" (as OpenAI answers
    "gpt-4o" as "gpt-4o-2024-08-06"). 1000+1000 tokens at 1000 micros/1000 = 2000 micros > 1000."""

    def script(request: Recorded) -> Answer:
        if _turn(request) == 0:
            return Answer(
                text="",
                tool_calls=[Call("c0", "kb_search", {"query": "a"})],
                prompt_tokens=1000,
                completion_tokens=1000,
                model="small-2025-01-01",
            )
        return Answer(text='{"category": "bug"}', model="small-2025-01-01")

    events = Reader(settings, [settings.topics.run_events], "run_events")
    with StandIn([script] * 3) as model, fleet(settings, model, prices={"small": (1000, 1000)}):
        from processors.client import RunClient

        with RunClient(settings) as client:
            client.start("rv-cost", {"ticket": "t"}, run_id="b-1")
        _terminal(events, "b-1")
    assert not events.of("b-1", "RunSucceeded"), "the cost budget was never charged"
    assert events.of("b-1", "RunPaused")
    assert events.of("b-1", "BudgetExhausted")[0]["dimension"] == "cost_micros"
    events.close()


# --------------------------------------------------------------------------- developer commands


def _cli(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processors.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "RUNFOLD_"))}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_dev_with_no_broker_answering_says_so_in_one_line(tmp_path: Path, topic_prefix: str) -> None:
    """README.md "The CLI": "Human output by default ... non-zero exit codes on failure";
    docs/runtime.md "Exit codes": "exits only when no retry in-process can mend what happened, with
    one line ... saying why and what to do". `runfold dev` pointed at an address where no broker
    answers must say so in one line (like `runfold topology create`, which exits 3), not with a
    Python traceback."""
    (tmp_path / "defs").mkdir()
    env = _env(KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{_free_port()}")
    t0 = time.monotonic()
    proc = _cli(
        ["dev", "defs", "--topic-prefix", topic_prefix, "--state-dir", str(tmp_path / "st"), "--no-reload"],
        env,
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-2000:]  # broker unreachable, as the one-shot commands say it
    assert "Traceback" not in out, out[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "runfold dev:" in lines[0] and env["KAFKA_BOOTSTRAP_SERVERS"] in lines[0], out
    assert time.monotonic() - t0 < 60


def test_dev_with_the_local_broker_port_taken_fails_in_one_line_without_a_broker(tmp_path: Path) -> None:
    """README.md "Troubleshooting": "`runfold kafka up` fails: the message names the cause (... port
    taken ...)"; docs/tutorial.md "3. Run it for real": `runfold dev` "starts the local broker if
    none is running". With the port taken by something else, `runfold dev` says so and starts
    nothing."""
    (tmp_path / "defs").mkdir()
    data = tmp_path / "kafka"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(
            RUNFOLD_BROKER="local",
            RUNFOLD_KAFKA_PORT=str(port),
            RUNFOLD_KAFKA_CONTROLLER_PORT=str(_free_port()),
            RUNFOLD_KAFKA_DATA_DIR=str(data),
        )
        proc = _cli(
            ["dev", "defs", "--topic-prefix", "rvdevtaken", "--state-dir", str(tmp_path / "st")],
            env,
            tmp_path,
        )
    assert proc.returncode == 1
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and f"port {port}" in err[0] and "RUNFOLD_KAFKA_PORT" in err[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (data / "broker.json").exists()  # no broker was started


def test_dev_on_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    """docs/tutorial.md / README.md "The CLI": non-zero exit codes on failure, the message says why."""
    proc = _cli(
        ["dev", "nope", "--topic-prefix", "rvdevnope"], _env(KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9"), tmp_path
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "nope is not a folder" in proc.stderr


@pytest.mark.parametrize("command", ["up", "status", "down"])
@pytest.mark.parametrize(
    ("port", "controller"), [("abc", "19961"), ("²", "19961"), ("19960", "19960"), ("19960", "0")]
)
def test_kafka_commands_refuse_a_bad_port_setting_in_one_line(
    tmp_path: Path, command: str, port: str, controller: str
) -> None:
    """README.md "Which Kafka": ports come from RUNFOLD_KAFKA_PORT / RUNFOLD_KAFKA_CONTROLLER_PORT;
    "Troubleshooting": "the message names the cause". A bad setting is one `error:` line naming the
    variable (or the clash), exit 1, and no broker is started."""
    data = tmp_path / "kafka"
    env = _env(
        RUNFOLD_BROKER="local",
        RUNFOLD_KAFKA_PORT=port,
        RUNFOLD_KAFKA_CONTROLLER_PORT=controller,
        RUNFOLD_KAFKA_DATA_DIR=str(data),
    )
    proc = _cli(["kafka", command], env, tmp_path, timeout=60)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stdout + proc.stderr
    assert "RUNFOLD_KAFKA" in lines[0] or "must differ" in lines[0]
    assert not (data / "broker.json").exists()


def test_dev_with_an_unknown_broker_choice_is_one_line(tmp_path: Path) -> None:
    """README.md "Which Kafka": "`RUNFOLD_BROKER=external|docker|local` forces a choice";
    README.md "The CLI": non-zero exit codes on failure, human output. `runfold dev` with
    RUNFOLD_BROKER set to anything else says so in one line (as `runfold kafka status` does), not
    with a traceback."""
    (tmp_path / "defs").mkdir()
    proc = _cli(["dev", "defs", "--topic-prefix", "rvdevbogus"], _env(RUNFOLD_BROKER="bogus"), tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "RUNFOLD_BROKER='bogus'" in lines[0], proc.stderr


def test_dev_refuses_a_bad_log_level_before_it_starts_anything(kafka_bootstrap: str, tmp_path: Path) -> None:
    """README.md "The CLI": "non-zero exit codes on failure"; docs/client.md exit codes: "`2` usage";
    `runfold dev --log-format` is checked up front (exit 2, one line). `--log-level`, the other
    option it hands to every service, must be too: today the topics are created, the three
    services start and each prints a usage box, and dev exits 1 ("processor exited with code 2")."""
    from confluent_kafka.admin import AdminClient

    (tmp_path / "defs").mkdir()
    prefix = f"rvlvl{os.getpid()}"
    env = _env(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)
    bad_format = _cli(["dev", "defs", "--topic-prefix", prefix, "--log-format", "bogus"], env, tmp_path)
    assert bad_format.returncode == 2  # the documented usage code, as a reference
    proc = _cli(
        [
            "dev",
            "defs",
            "--topic-prefix",
            prefix,
            "--state-dir",
            str(tmp_path / "st"),
            "--log-level",
            "bogus",
        ],
        env,
        tmp_path,
    )
    try:
        topics = [
            t
            for t in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
            if t.startswith(prefix + ".")
        ]
        assert proc.returncode == 2, proc.stdout[-1500:]
        assert "started" not in proc.stdout and not topics, (proc.stdout[-1500:], topics)
    finally:
        from topology.admin import delete_topology
        from topology.settings import KafkaSettings

        with contextlib.suppress(Exception):
            delete_topology(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))


def test_demo_with_no_broker_answering_says_so_in_one_line(tmp_path: Path) -> None:
    """docs/client.md "runfold demo": it uses the existing cluster when KAFKA_BOOTSTRAP_SERVERS is
    set; README.md "The CLI": human output, non-zero exit codes on failure; "Troubleshooting":
    the message names the cause. With no broker at that address: one line, not a traceback."""
    env = _env(KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{_free_port()}")
    proc = _cli(["demo"], env, ROOT, timeout=100)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-1500:]
    assert "no broker answered" in proc.stderr
