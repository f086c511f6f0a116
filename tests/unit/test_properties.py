"""Property tests of the engine (hypothesis).

(a) any interleaving and duplication of valid receipts reaches the same terminal status
    and byte-identical state; (b) folding the emitted events from None rebuilds the live
    state exactly; (c) decide never raises on well-typed but nonsensical input.
"""

from __future__ import annotations

from typing import Any

from engine_harness import RunHarness, definition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.engine import dump_state
from processors.engine.ids import dispatch_id

RETRY = {"max_attempts": 3, "backoff_ms": 10}
WORKFLOW = definition(
    {
        "a": {"kind": "action", "action": "a", "retry": RETRY, "writes": {"items": {"from": "output"}}},
        "b": {
            "kind": "action",
            "action": "b",
            "on_failure": "continue",
            "writes": {"notes": {"from": "output"}},
        },
        "m": {
            "kind": "action",
            "action": "m",
            "map": {"from": "state", "pointer": "/items"},
            "retry": RETRY,
            "input": {"q": {"from": "item"}},
            "writes": {"notes": {"from": "output"}},
        },
        "join": {"kind": "state", "mutations": [{"op": "increment", "target": "joins", "value": 1}]},
    },
    entry=["a", "b"],
    routes={"a": ["m"], "b": ["join"], "m": ["join"]},
    state={"items": [], "notes": [], "joins": 0},
    reducers={"notes": "append"},
)


def planned_receipt(h: RunHarness, step: dict[str, Any]) -> dict[str, Any]:
    """The one terminal outcome each attempt has, whatever the delivery order."""
    node, lineage, attempt = step["node"], step["lineage"], step["attempt"]
    ident = h.ident(node, lineage, attempt)
    if node == "b" or (node in ("a", "m") and attempt == 1 and lineage in ("", "1")):
        retryable = node != "b"
        return {
            "type": "ActivationFailed",
            **ident,
            "worker_id": "w",
            "code": "ExecutionFailed",
            "message": f"{node} attempt {attempt}",
            "retryable": retryable,
            "usage": {"cost_micros": 1},
        }
    output: Any = ["x", "y", "z"] if node == "a" else f"{node}{lineage}"
    return {
        "type": "ActivationCompleted",
        **ident,
        "worker_id": "w",
        "output": output,
        "usage": {"prompt_tokens": attempt, "completion_tokens": 1, "cost_micros": 2},
    }


def deliverable(h: RunHarness) -> list[dict[str, Any]]:
    assert h.state is not None
    out: list[dict[str, Any]] = []
    for key in sorted(h.state["steps"]):
        step = h.state["steps"][key]
        if step["status"] == "scheduled":
            out.append(
                {
                    "type": "ActivationAccepted",
                    **h.ident(step["node"], step["lineage"]),
                    "worker_id": "w",
                    "lease_ms": 60_000,
                }
            )
        elif step["status"] == "running":
            out.append(planned_receipt(h, step))
        elif step["status"] == "retry_wait":
            timer = next(
                t
                for t in h.timers.values()
                if t["timer_kind"] == "retry_backoff"
                and t["node"] == step["node"]
                and t["lineage"] == step["lineage"]
            )
            out.append(dict(timer))
    return out


def run_scenario(choices: st.DataObject) -> RunHarness:
    h = RunHarness(WORKFLOW).start({})
    delivered: list[dict[str, Any]] = []
    for _ in range(200):
        if h.status in ("succeeded", "failed", "cancelled"):
            break
        options = deliverable(h)
        if delivered and choices.draw(st.booleans(), label="duplicate"):
            msg = choices.draw(st.sampled_from(delivered), label="dup")
        else:
            msg = choices.draw(st.sampled_from(options), label="msg")
        delivered.append(msg)
        h.send(msg, advance=0)
        if msg["type"] in ("ActivationCompleted", "ActivationFailed") and h.last.events:
            assert h.last.events[0]["type"] != "ReceiptConflict"
    # a few duplicates after the end change nothing
    for msg in delivered[-3:]:
        h.send(msg, advance=0)
        assert h.last.events == []
    return h


REFERENCE: dict[str, bytes] = {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_interleaving_and_duplication_reaches_the_same_state(data: st.DataObject) -> None:
    h = run_scenario(data)
    assert h.status == "succeeded"
    assert h.state is not None and h.state["state"]["notes"] == ["m0", "m1", "m2"]
    final = dump_state(h.state)
    assert h.refold() == final  # (b) the fold of the events is the live state
    expected = REFERENCE.setdefault("final", final)
    assert final == expected


def test_scenario_content() -> None:
    """The reference scenario does what the property assumes (b fails and continues)."""
    h = RunHarness(WORKFLOW).start({})
    while h.status == "running":
        h.send(deliverable(h)[-1], advance=0)
    assert h.status == "succeeded"
    assert h.state is not None and h.state["state"]["notes"] == ["m0", "m1", "m2"]
    assert h.state["state"]["joins"] == 2 and h.step("b")["status"] == "failed"
    assert h.step("m", "1")["attempt"] == 2 and h.state["usage"]["retries"] == 2


MESSAGE_TYPES = [
    "StartRun",
    "CancelRun",
    "SignalRun",
    "ResumeRun",
    "ActivationAccepted",
    "ActivationHeartbeat",
    "ActivationCompleted",
    "ActivationFailed",
    "ActivationCancelled",
    "ChildRunFinished",
    "TimerFired",
]
TIMER_KINDS = ["retry_backoff", "node_timeout", "wait_timeout", "sleep", "wall_time", "lease_expiry", "bogus"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def nonsense(draw: st.DrawFn, h: RunHarness) -> dict[str, Any]:
    mtype = draw(st.sampled_from(MESSAGE_TYPES))
    node = draw(st.sampled_from(["a", "b", "m", "join", "ghost"]))
    lineage = draw(st.sampled_from(["", "0", "1", "2", "9"]))
    attempt = draw(st.integers(0, 3))
    real = draw(st.booleans())
    msg: dict[str, Any] = {
        "type": mtype,
        "node": node,
        "lineage": lineage,
        "attempt": attempt,
        "dispatch_id": dispatch_id(h.run_id, node, lineage, attempt) if real else draw(st.text(max_size=8)),
        "worker_id": draw(st.sampled_from(["w", "w2"])),
        "lease_ms": draw(st.integers(-1, 100_000)),
        "output": draw(json_values),
        "usage": draw(st.sampled_from([{}, {"prompt_tokens": 3}, {"cost_micros": -1}])),
        "code": draw(st.sampled_from(["ExecutionFailed", "Timeout", "Nope"])),
        "message": "m",
        "retryable": draw(st.booleans()),
        "reason": "r",
        "child_run_id": "c",
        "status": draw(st.sampled_from(["succeeded", "failed", "cancelled", "odd"])),
        "failure": None,
        "timer_id": "t",
        "timer_kind": draw(st.sampled_from(TIMER_KINDS)),
        "due_ms": draw(st.integers(0, 2_000_000)),
        "definition_id": draw(st.sampled_from(["wf", "missing"])),
        "revision": draw(st.sampled_from([None, 1, 7])),
        "input": draw(json_values),
        "signal": draw(st.sampled_from(["approval", "x"])),
        "payload": draw(json_values),
        "budgets": draw(st.sampled_from([None, {}, {"max_steps": 1}, {"max_steps": -1}, {"bogus": 1}, "x"])),
    }
    if draw(st.booleans()):
        msg["run_id"] = draw(st.sampled_from([h.run_id, "other-run"]))
    return msg


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decide_never_raises_on_nonsense(data: st.DataObject) -> None:
    h = RunHarness(WORKFLOW)
    if data.draw(st.booleans(), label="started"):
        h.start({})
    for _ in range(data.draw(st.integers(1, 25), label="n")):
        if data.draw(st.booleans(), label="valid") and h.state is not None and h.status == "running":
            options = deliverable(h)
            if options:
                h.send(data.draw(st.sampled_from(options)), advance=data.draw(st.integers(0, 100_000)))
                continue
        msg = data.draw(nonsense(h))
        if msg.get("run_id") == "other-run":
            continue  # the runtime routes by run id; another run's state is never passed
        h.send(msg, advance=data.draw(st.integers(0, 100_000)))
        for event in h.last.events:
            assert event["sequence"] == 0 or event["type"] != "RunRejected"
    if h.state is not None:
        assert h.refold() == dump_state(h.state)
        sequences = [event["sequence"] for event in h.log]
        assert sequences == list(range(1, len(sequences) + 1))  # gap-free
