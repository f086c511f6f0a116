"""Agent loops on the real broker: the processor, real workers, and a local stand-in model server
(tests/agent_stand_in.py) speaking the OpenAI and the Anthropic protocols, so runfold's own HTTP
client code runs. Tools count their executions (agent_tools_for_tests.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_support import WorkerThread, spawn_worker
from processor_support import Commands, Reader, make_settings, running, setup_topology, spawn_processor

from processors.executors import Worker
from processors.executors.settings import AgentsConfig, ProviderConfig, WorkerSettings
from processors.replay.verify import verify
from processors.runtime.settings import ProcessorSettings
from tests.agent_loop_definitions import TRIAGE_SCHEMA, triage_definition
from tests.agent_stand_in import Answer, Call, Recorded, StandIn

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KB_SEARCH = {
    "kb_search": {
        "action": "loop.record",
        "description": "Search the knowledge base",
        "input_schema": {"type": "object", "required": ["query"]},
    }
}


def triage(definition_id: str, **node: Any) -> dict[str, Any]:
    return triage_definition(
        definition_id, node.pop("tools", KB_SEARCH), **{"output_schema": TRIAGE_SCHEMA, **node}
    )


FAST = triage("loop-fast")
# leased tightly so that a killed worker's turn or call is retried within seconds
DURABLE = triage(
    "loop-durable",
    lease_ms=3000,
    heartbeat_ms=500,
    retry={"max_attempts": 5},
    tools={
        "kb_search": {
            "action": "loop.record",
            "input_schema": {"type": "object", "required": ["query"]},
            "retry": {"max_attempts": 5},
        }
    },
)


BUDGETED = {**triage("loop-budgeted"), "budgets": {"max_tokens": 25}}
HURRIED = triage(
    "loop-hurried",
    tools={
        "refund": {
            "action": "loop.record",
            "input_schema": {"type": "object", "required": ["query"]},
            "approval": {"signal": "refund-approval", "timeout_ms": 1500},
        }
    },
)
APPROVAL = triage(
    "loop-approval",
    tools={
        "refund": {
            "action": "loop.record",
            "description": "Refund an order",
            "input_schema": {"type": "object", "required": ["query"]},
            "approval": {"signal": "refund-approval", "timeout_ms": 120_000},
        }
    },
)


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> Iterator[ProcessorSettings]:
    s = make_settings(kafka_bootstrap, topic_prefix, tmp_path / "state")
    setup_topology(s, [FAST, DURABLE, APPROVAL, BUDGETED, HURRIED])
    yield s
    from topology.admin import delete_topology

    try:
        delete_topology(s)
    except Exception as e:
        print(f"cleanup of {topic_prefix} failed: {e}")


def _assistant_turns(request: Recorded) -> int:
    return sum(1 for m in request.body["messages"] if m.get("role") == "assistant")


def three_turns(request: Recorded) -> Answer:
    """Turn 1: two parallel searches, one of which fails; turn 2: a search again (the model
    recovering from the failure); turn 3: the answer."""
    turn = _assistant_turns(request)
    if turn == 0:
        calls = [
            Call("c1", "kb_search", {"query": "late order"}),
            Call("c2", "kb_search", {"query": "broken"}),
        ]
        return Answer(text="let me look", tool_calls=calls)
    if turn == 1:
        return Answer(text="one failed, again", tool_calls=[Call("c3", "kb_search", {"query": "refund"})])
    return Answer(text='{"category": "billing"}', prompt_tokens=30, completion_tokens=6)


def _agents(kind: str, base_url: str) -> AgentsConfig:
    url = base_url + "/v1" if kind == "openai" else base_url
    return AgentsConfig(
        providers={"stand-in": ProviderConfig(kind=kind, base_url=url)}, routes={"*": "stand-in"}
    )


@contextlib.contextmanager
def loop_fleet(settings: ProcessorSettings, kind: str, script: list[Any]) -> Iterator[StandIn]:
    """A stand-in model answering from `script`, the processor, and one in-process worker
    (default and agents queues) whose agents talk to the stand-in over `kind`'s protocol."""
    with StandIn(script) as model:
        agents = _agents(kind, model.base_url)
        worker = Worker(name="loop", queues=["default", "agents"], settings=WorkerSettings(agents=agents))
        with running(settings), WorkerThread(worker, settings):
            yield model


def _tool_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_three_turn_loop_with_two_parallel_calls_and_a_failed_tool_over_each_protocol(
    settings: ProcessorSettings, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(log))
    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    with loop_fleet(settings, kind, [three_turns] * 3) as model:
        commands.start("t-1", "loop-fast", {"ticket": "my order is late"})
        commands.flush()
        events.wait_for(
            lambda r: bool(events.of("t-1", "RunSucceeded") or events.of("t-1", "RunFailed")),
            90,
            "terminal",
        )
        requests = list(model.requests)
    assert not events.of("t-1", "RunFailed"), events.of("t-1", "RunFailed")
    assert events.of("t-1", "RunSucceeded")[0]["output"]["triage"] == {"category": "billing"}
    scheduled = [(e["lineage"], e["kind"]) for e in events.of("t-1", "StepScheduled")]
    assert scheduled == [
        ("", "agent"),
        ("~1", "agent"),
        ("~1.0", "action"),
        ("~1.1", "action"),
        ("~2", "agent"),
        ("~2.0", "action"),
        ("~3", "agent"),
    ]
    runs = Counter((e["lineage"], e["at"]) for e in _tool_log(log) if e["at"] != "start")
    assert runs == {("~1.0", "end"): 1, ("~1.1", "failed"): 1, ("~2.0", "end"): 1}
    assert len(requests) == 3
    second = requests[1].body
    if kind == "openai":
        assert [t["function"]["name"] for t in requests[0].body["tools"]] == ["kb_search"]
        tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in tool_messages] == ["c1", "c2"]
        assert "found late order" in tool_messages[0]["content"]
        assert tool_messages[1]["content"] == "error ExecutionFailed: the knowledge base is offline"
    else:
        assert [t["name"] for t in requests[0].body["tools"]] == ["kb_search"]
        results = [
            b
            for m in second["messages"]
            for b in (m["content"] if isinstance(m["content"], list) else [])
            if b.get("type") == "tool_result"
        ]
        assert [b["tool_use_id"] for b in results] == ["c1", "c2"]
        assert [bool(b.get("is_error")) for b in results] == [False, True]
    usage = events.of("t-1", "RunSucceeded")[0]["usage"]
    assert usage["prompt_tokens"] == 10 + 10 + 30  # every turn, recorded once each
    report = verify(settings, timeout_s=60)
    assert report.ok, report.to_dict()
    events.close()


def _tool_env(agents: AgentsConfig, log: Path) -> dict[str, str]:
    return {"RUNFOLD_WORKER_AGENTS": agents.model_dump_json(), "RUNFOLD_TEST_TOOL_LOG": str(log)}


def _stop(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_kill_9_of_the_worker_mid_turn_and_of_the_processor_mid_loop(
    settings: ProcessorSettings, tmp_path: Path
) -> None:
    """The worker dies while the model is answering turn 1; the processor dies while turn 2's
    tool calls run. The run still succeeds, no completed model turn is asked again, and every
    tool call ran to completion exactly once per attempt that was not killed."""
    tool_log = tmp_path / "tools.jsonl"
    proc_log = tmp_path / "processor.log"
    first_turn_answered = []

    def script(request: Recorded) -> Answer:
        turn = _assistant_turns(request)
        if turn == 0:
            if not first_turn_answered:  # the first try of turn 1 is slow: its worker is killed meanwhile
                first_turn_answered.append(True)
                time.sleep(6)
            return Answer(text="", tool_calls=[Call("a", "kb_search", {"query": "one", "ms": 200})])
        if turn == 1:
            calls = [
                Call(f"b{i}", "kb_search", {"query": f"two-{i}", "ms": 2500, "pad": 1024}) for i in range(3)
            ]
            return Answer(text="more", tool_calls=calls)
        return Answer(text='{"category": "bug"}')

    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    processor = worker = rescuer = None
    with StandIn([script] * 10) as model:
        agents = _agents("openai", model.base_url)
        try:
            processor = spawn_processor(settings, proc_log)
            worker = spawn_worker(
                settings,
                "doomed",
                "agent_tools_for_tests",
                ("default", "agents"),
                _tool_env(agents, tool_log),
            )
            commands.start("k-1", "loop-durable", {"ticket": "crash test"})
            commands.flush()
            events.wait_for(
                lambda r: any(e["lineage"] == "~1" for e in events.of("k-1", "StepStarted")),
                90,
                "turn 1 started",
            )
            time.sleep(1.0)  # the model is answering turn 1 now
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            rescuer = spawn_worker(
                settings,
                "rescuer",
                "agent_tools_for_tests",
                ("default", "agents"),
                _tool_env(agents, tool_log),
            )
            events.wait_for(
                lambda r: any(e["lineage"].startswith("~2.") for e in events.of("k-1", "StepStarted")),
                90,
                "turn 2's calls started",
            )
            processor.send_signal(signal.SIGKILL)
            processor.wait(10)
            processor = spawn_processor(settings, proc_log)
            events.wait_for(
                lambda r: bool(events.of("k-1", "RunSucceeded") or events.of("k-1", "RunFailed")),
                120,
                "terminal",
            )
        finally:
            _stop(worker, rescuer, processor)
        requests = list(model.requests)
    assert not events.of("k-1", "RunFailed"), events.of("k-1", "RunFailed")
    assert events.of("k-1", "RunSucceeded")[0]["output"]["triage"] == {"category": "bug"}
    # turn 1 was asked again (its first worker died before answering); turns 2 and 3 only once
    turns = Counter(_assistant_turns(r) for r in requests)
    assert turns[0] >= 2 and turns[1] == 1 and turns[2] == 1 and set(turns) == {0, 1, 2}, turns
    finished = Counter(e["lineage"] for e in _tool_log(tool_log) if e["at"] == "end")
    assert finished == {"~1.0": 1, "~2.0": 1, "~2.1": 1, "~2.2": 1}, finished
    succeeded = Counter(e["lineage"] for e in events.of("k-1", "StepSucceeded"))
    assert all(count == 1 for count in succeeded.values()), succeeded
    report = verify(settings, timeout_s=60)
    assert report.ok, report.to_dict()
    events.close()


def test_cancel_mid_loop_stops_the_tools_in_flight_before_the_run_is_cancelled(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(log))

    def slow_tools(request: Recorded) -> Answer:
        calls = [Call(f"s{i}", "kb_search", {"query": f"slow-{i}", "ms": 60_000}) for i in range(2)]
        return Answer(text="", tool_calls=calls)

    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    with loop_fleet(settings, "openai", [slow_tools] * 2) as model:
        commands.start("c-1", "loop-fast", {"ticket": "cancel me"})
        commands.flush()
        events.wait_for(
            lambda r: len([e for e in events.of("c-1", "StepStarted") if "." in e["lineage"]]) == 2,
            90,
            "both calls started",
        )
        commands.cancel("c-1", "the user gave up")
        commands.flush()
        events.wait_for(lambda r: bool(events.of("c-1", "RunCancelled")), 60, "RunCancelled")
        cancelled_at = time.time()
    entries = _tool_log(log)
    ended = {e["lineage"]: e["t"] for e in entries if e["at"] == "end"}
    started = {e["lineage"] for e in entries if e["at"] == "start"}
    assert started == {"~1.0", "~1.1"}
    assert not ended  # the handlers were stopped (check_cancelled), not run to the end
    stops = {s["lineage"]: s["stop"] for s in events.of("c-1", "RunCancelled")[0]["stops"]}
    assert stops == {"~1.0": "confirmed", "~1.1": "confirmed"}
    assert len(model.requests) == 1 and cancelled_at > 0
    events.close()


def test_approvals_from_the_cli_and_the_client_approve_and_deny_tool_calls(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    from processors.client import RunClient

    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(log))

    def refunds(request: Recorded) -> Answer:
        turn = _assistant_turns(request)
        if turn < 2:
            return Answer(text="", tool_calls=[Call(f"r{turn}", "refund", {"query": f"order-{turn}"})])
        return Answer(text='{"category": "billing"}')

    events = Reader(settings, [settings.topics.run_events], "run_events")
    with loop_fleet(settings, "openai", [refunds] * 3) as model, RunClient(settings) as client:
        client.start("loop-approval", {"ticket": "refund me"}, run_id="a-1")
        events.wait_for(lambda r: len(events.of("a-1", "RunWaiting")) == 1, 90, "the first call waits")
        assert client.get("a-1").status == "waiting"
        assert not _tool_log(log)  # nothing ran before the approval
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "RUNFOLD_TOPIC_PREFIX": settings.topic_prefix,
        }
        cli = subprocess.run(
            [sys.executable, "-m", "processors.cli", "runs", "signal", "a-1", "refund-approval",
             "--payload", '{"approved": true}', "--json"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stdout + cli.stderr
        events.wait_for(lambda r: len(events.of("a-1", "RunWaiting")) == 2, 90, "the second call waits")
        client.signal("a-1", "refund-approval", {"approved": False, "reason": "over the limit"})
        events.wait_for(
            lambda r: bool(events.of("a-1", "RunSucceeded") or events.of("a-1", "RunFailed")),
            90,
            "terminal",
        )
        requests = list(model.requests)
    assert events.of("a-1", "RunSucceeded"), events.of("a-1", "RunFailed")
    ran = Counter(e["lineage"] for e in _tool_log(log) if e["at"] == "end")
    assert ran == {"~1.0": 1}  # the approved call ran once, the denied one never
    denial = [m for m in requests[2].body["messages"] if m["role"] == "tool"][-1]
    assert denial["content"] == "error PermissionDenied: the call was denied: over the limit"
    events.close()


def test_a_token_budget_pauses_mid_loop_and_a_resume_finishes_the_same_loop(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """25 tokens: turn 1 (15) fits, turn 2 (15 more) overruns; the run pauses before turn 3,
    a resume with more budget asks the model for turn 3 only."""
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    from processors.client import RunClient

    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(tmp_path / "tools.jsonl"))
    events = Reader(settings, [settings.topics.run_events], "run_events")
    with loop_fleet(settings, "anthropic", [three_turns] * 3) as model, RunClient(settings) as client:
        client.start("loop-budgeted", {"ticket": "t"}, run_id="b-1")
        events.wait_for(lambda r: bool(events.of("b-1", "RunPaused")), 90, "RunPaused")
        assert client.get("b-1").status == "paused" and len(model.requests) == 2
        client.resume("b-1", {"max_tokens": 10_000})
        events.wait_for(
            lambda r: bool(events.of("b-1", "RunSucceeded") or events.of("b-1", "RunFailed")),
            90,
            "terminal",
        )
        turns = Counter(_assistant_turns(r) for r in model.requests)
    assert events.of("b-1", "RunSucceeded"), events.of("b-1", "RunFailed")
    assert events.of("b-1", "BudgetExhausted")[0]["dimension"] == "tokens"
    assert turns == {0: 1, 1: 1, 2: 1}  # no turn asked twice across the pause
    events.close()


def test_an_unanswered_approval_times_out_as_an_error_result_the_model_reads(
    settings: ProcessorSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_tools_for_tests  # noqa: F401  (registers loop.record)

    log = tmp_path / "tools.jsonl"
    monkeypatch.setenv("RUNFOLD_TEST_TOOL_LOG", str(log))

    def one_refund(request: Recorded) -> Answer:
        if _assistant_turns(request) == 0:
            return Answer(text="", tool_calls=[Call("r0", "refund", {"query": "order-1"})])
        return Answer(text='{"category": "bug"}')

    events, commands = Reader(settings, [settings.topics.run_events], "run_events"), Commands(settings)
    with loop_fleet(settings, "openai", [one_refund] * 2) as model:
        commands.start("h-1", "loop-hurried", {"ticket": "t"})
        commands.flush()
        events.wait_for(
            lambda r: bool(events.of("h-1", "RunSucceeded") or events.of("h-1", "RunFailed")),
            90,
            "terminal",
        )
        requests = list(model.requests)
    assert events.of("h-1", "RunSucceeded"), events.of("h-1", "RunFailed")
    assert not _tool_log(log)  # the refund never ran
    result = next(m for m in requests[1].body["messages"] if m["role"] == "tool")
    assert result["content"] == "error Timeout: no signal 'refund-approval' within 1500 ms"
    events.close()
