"""The interpreted and the compiled engine decide alike: on hostile inputs, and whatever the depth
of the caller's stack.

mypyc enforces declared types at run time: where the interpreted engine goes on with a value of
an unexpected type (or raises something else), compiled code raises TypeError; and compiled
functions take no Python frame. Both engines must give byte-identical results for every input (a
processor may restart with the other engine; a replay of the run events must rebuild the same
state), so these tests drive both with the same inputs and compare their answers line by line.

The parent (the test, with whichever engine it runs) makes a batch of cases: hypothesis draws
definitions (engine_world's generator, plus agent loops, maps, waits and state nodes first in
line, every mutation, literal writes, sometimes a hostile field) and a history of inputs in the
abstract: the executor of the k-th activation answers (what it would say next, or a given
receipt), the k-th armed timer fires, the k-th input comes again, a command, a raw message, a
child run starts from its activation (its bundle sometimes altered). Wherever the wire carries
JSON the values may be hostile: outputs, usages, turn outputs and tool calls, payloads, approvals,
budgets, reasons, labels, parents, bundles; and identities that name no attempt, wrong attempts,
top-level fields of the wrong type, huge integers, floats for integers, values nested up to and
past the limits. One child process per engine (`RUNFOLD_ENGINE=interpreted`, then `compiled`;
each checks it runs the engine it was asked for) reads the whole batch, turns each abstract input
into a message against its own run state (deterministically: the same state, the same message),
folds it the way processors/runtime/fold.py does and prints one canonical line per input: the
events, `dropped`, each event's effects, the digest of the state after; or, when `decide` raised,
the exception and what the runtime folds instead (`_instead`). At the end of a case each run's
events, read back, are folded again (replay) and must give the state the decisions carried.

What is compared: every line, whole. That includes an exception's type *and message*: an
exception is acceptable only if both engines raise it alike, because the runtime writes
`"{type}: {message}"` (its first 500 characters) into what it folds instead, a RunRejected's
reason, a StepFailed's or a RunFailed's message (fold.py `_charge` / `_instead`): a CPython
TypeError and a mypyc one word their messages differently, and so would the run events. The
events are compared with sorted keys and, by hash, as the codec writes them (unsorted: the order
of keys is part of the bytes).

Size: RUNFOLD_ENGINE_DIFF_EXAMPLES cases (default 200, ~10 s), seed RUNFOLD_ENGINE_DIFF_SEED.

Beyond the engine alone, the runtime's offline fold (benchmarks/fold_bench.py --digest: the
processor's fold, store and serializers over 400 runs) must give the same digest with either
engine. This module is where the two engines are compared; the rest of the suite runs one engine
(the compiled one where scripts/test.sh built it).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
MODES = ("interpreted", "compiled")
EXAMPLES = int(os.environ.get("RUNFOLD_ENGINE_DIFF_EXAMPLES", "200"))
SEED = int(os.environ.get("RUNFOLD_ENGINE_DIFF_SEED", "1"))
START_MS = 1_000_000
LONG_END = 1 << 63  # a timer's due_ms travels as an Avro long
OPEN = ("scheduled", "running", "stopping")  # an attempt its executor may still answer


# ================================================================================ the child


def _canon(value: Any) -> str:
    """A line: orjson with sorted keys. A value orjson refuses (an integer beyond 64 bits, a lone
    surrogate, nesting past 254 levels) is written by the standard library instead: the same in
    both children, which is all that matters here."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True, default=repr)


def _wire_hash(events: list[dict[str, Any]]) -> str:
    """The codec writes the events' JSON fields with orjson, keys *not* sorted."""
    try:
        data = b"\n".join(orjson.dumps(event) for event in events)
    except TypeError:
        data = json.dumps(events, default=repr).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def _exception(exc: BaseException) -> list[str]:
    kind = type(exc)
    return [f"{kind.__module__}.{kind.__qualname__}", str(exc)[:2000]]


def _key(item: dict[str, Any]) -> str:
    return f"{item['node']}[{item['lineage']}]" if item["lineage"] else item["node"]


def _with_frames(count: int, call: Any) -> Any:
    """`call()` with `count` more Python frames on the stack."""
    return call() if count <= 0 else _with_frames(count - 1, call)


class _Unserializable(Exception):
    """A value the runtime's encoders or state serializer refuse (fold.Unserializable)."""


class _Driver:
    """One case: a catalog, its runs, the activations and timers their effects asked for."""

    def __init__(self, case: dict[str, Any], write: Any) -> None:
        from processors.engine import Catalog, Ceilings, EngineContext

        self.write = write
        self.case_index = case["index"]
        ceilings = Ceilings(**case.get("ceilings", {}))
        self.catalog = Catalog(ceilings)
        for index, raw in enumerate(case["defs"]):
            try:
                self.catalog.register(raw)
                outcome: Any = "registered"
            except Exception as exc:  # DefinitionError, or whatever else validation raised
                outcome = _exception(exc)
            self._line(-1, {"register": index, "outcome": outcome})
        self.ctx = EngineContext(
            catalog=self.catalog, ceilings=ceilings, queues=frozenset({"default", "agents"})
        )
        self.restore = bool(case.get("restore"))  # every state read back from its bytes first
        self.stack_probe: int | None = case.get("stack_probe")  # see _recursion_at
        self.probe_actions = frozenset(case.get("probe_actions", ()))
        self.states: dict[str, Any] = {}
        self.logs: dict[str, list[dict[str, Any]]] = {}
        self.now = START_MS
        self.sent: list[dict[str, Any]] = []
        self.activations: list[dict[str, Any]] = []  # ActionActivation / ChildRunActivation, in order
        self.timers: dict[str, dict[str, Any]] = {}
        self.current = "r"  # the run commands and raw messages address
        self.runs = 1
        self.start: dict[str, Any] = {}  # the case's first StartRun, for the runs after it

    def _line(self, action: int, body: dict[str, Any]) -> None:
        self.write(_canon({"case": self.case_index, "action": action, **body}) + "\n")

    def run(self, actions: list[dict[str, Any]]) -> None:
        for index, action in enumerate(actions):
            msg = self.message(action)
            if msg is not None:
                self.fold(index, msg)
        self.replay()

    # ---- the abstract inputs, made messages against the runs' states -------------------------
    def message(self, action: dict[str, Any]) -> dict[str, Any] | None:
        op = action["op"]
        if op == "advance":
            self.now += action["ms"]
            return None
        if op == "again":  # a redelivery: the same record, its time too
            return copy.deepcopy(self.sent[action["pick"] % len(self.sent)]) if self.sent else None
        self.now += action.get("dt", 10)
        base = {"run_id": self.current, "ts_ms": self.now, "record_id": f"in-{len(self.sent)}"}
        if op == "msg":
            msg = {**base, **copy.deepcopy(action["msg"])}
            if not self.start and msg.get("type") == "StartRun":
                self.start = copy.deepcopy(action["msg"])
        elif op == "new_run":  # another run of the same definition (the last one may be over)
            self.runs += 1
            self.current = f"r{self.runs}"
            msg = {**base, "run_id": self.current, **copy.deepcopy(self.start)}
        elif op == "receipt":
            msg = self._receipt(action, base)
        elif op == "timer":
            msg = self._timer(action, base)
        elif op == "child_start":
            msg = self._child_start(action, base)
        else:
            raise ValueError(f"unknown op {op!r}")
        for name in action.get("drop", ()):
            msg.pop(name, None)
        return msg

    def _step(self, act: dict[str, Any]) -> dict[str, Any] | None:
        state = self.states.get(act["run_id"])
        return state["steps"].get(_key(act)) if state is not None else None

    def _pick(self, pick: int, kinds: tuple[str, ...], live: bool = False) -> dict[str, Any] | None:
        found = [act for act in self.activations if act["type"] in kinds]
        if live:  # what moves a run is likelier than what it drops: an attempt still open
            step = self._step
            found = [
                act
                for act in found
                if (s := step(act)) is not None
                and s["dispatch_id"] == act["dispatch_id"]
                and s["status"] in OPEN
            ] or found
        return found[pick % len(found)] if found else None

    def _receipt(self, action: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        act = self._pick(
            action["pick"], ("ActionActivation", "ChildRunActivation"), action.get("live", False)
        )
        if act is None:  # nothing dispatched yet: an identity that names no attempt
            act = {"type": "ActionActivation", "run_id": "r", "node": "n0", "lineage": "", "attempt": 1}
            act["dispatch_id"] = "x"
        verb = action["verb"]
        if verb == "auto":  # what the executor of that attempt would say next
            step = self._step(act)
            status = step["status"] if step is not None else "scheduled"
            if act["type"] == "ChildRunActivation":
                verb = "child-cancelled" if status == "stopping" else "child"
            else:
                verb = {"scheduled": "accept", "stopping": "cancelled"}.get(status, "complete")
        lease = act.get("lease_ms") or 500
        receipts: dict[str, dict[str, Any]] = {
            "accept": {"type": "ActivationAccepted", "worker_id": "w1", "lease_ms": lease},
            "heartbeat": {"type": "ActivationHeartbeat", "worker_id": "w1", "lease_ms": lease},
            "complete": {"type": "ActivationCompleted", "worker_id": "w1", "output": {"v": 1}, "usage": {}},
            "fail": {
                "type": "ActivationFailed",
                "worker_id": "w1",
                "code": "ExecutionFailed",
                "message": "boom",
                "retryable": False,
                "usage": {},
            },
            "cancelled": {
                "type": "ActivationCancelled",
                "worker_id": "w1",
                "reason": "run cancelled",
                "confirmed": True,
            },
            "child": {
                "type": "ChildRunFinished",
                "child_run_id": act.get("child_run_id", "r/n0"),
                "status": "succeeded",
                "output": {"v": 1},
                "failure": None,
                "usage": {},
            },
        }
        fields = receipts[verb.removesuffix("-cancelled")]
        if verb == "child-cancelled":
            fields["status"] = "cancelled"
        lineage = act["lineage"]
        if verb == "complete" and "turn" in action and "~" in lineage and "." not in lineage:
            fields["output"] = copy.deepcopy(action["turn"])  # a model turn of an agent loop
        ident = {name: act[name] for name in ("node", "lineage", "attempt", "dispatch_id")}
        return {**base, "run_id": act["run_id"], **ident, **fields, **copy.deepcopy(action.get("extra", {}))}

    def _timer(self, action: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        armed = sorted(self.timers.values(), key=lambda t: (t["due_ms"], t["timer_id"]))
        timer: dict[str, Any] = (
            armed[action["pick"] % len(armed)]
            if armed
            else {
                "type": "TimerFired",
                "run_id": "r",
                "timer_id": "t",
                "timer_kind": "sleep",
                "due_ms": self.now,
                "node": "n0",
                "lineage": "",
                "attempt": 1,
                "dispatch_id": "x",
            }
        )
        self.now = max(self.now, timer["due_ms"] + action.get("late", 0))
        return {**base, **timer, "ts_ms": self.now, **copy.deepcopy(action.get("extra", {}))}

    def _child_start(self, action: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """The child executor's StartRun for a ChildRunActivation: its bundle and parent."""
        from processors.engine.catalog import bundle_hash

        act = self._pick(action["pick"], ("ChildRunActivation",))
        if act is None:
            return {**base, "type": "StartRun", "definition_id": "child", "revision": 1, "input": {}}
        msg = {
            **base,
            "type": "StartRun",
            "run_id": act["child_run_id"],
            "definition_id": act["definition_id"],
            "revision": act["revision"],
            "input": copy.deepcopy(act["input"]),
            "bundle": copy.deepcopy(act["bundle"]),
            "parent": dict(act["parent"]),
            "labels": {},
        }
        patch = action.get("bundle_patch")
        if patch is not None:
            bundle = msg["bundle"]
            target = bundle["definitions"][bundle["root"]]
            for key in patch["path"][:-1]:
                if not isinstance(target.get(key), dict):
                    target[key] = {}
                target = target[key]
            target[patch["path"][-1]] = copy.deepcopy(patch["value"])
            if patch["rehash"]:  # a bundle that claims its own hash gets as far as validation
                with contextlib.suppress(TypeError):  # orjson refuses the value: the old hash stays
                    bundle["hash"] = bundle_hash(bundle["root"], bundle["definitions"])
        return {**msg, **copy.deepcopy(action.get("extra", {}))}

    # ---- folding, as processors/runtime/fold.py does -----------------------------------------
    def fold(self, action_index: int, msg: dict[str, Any]) -> None:
        from processors.engine import decide, dump_state, load_state
        from processors.runtime import deadletter
        from processors.runtime.fold import _instead, _refused_value

        self.sent.append(copy.deepcopy(msg))
        run_id = msg.get("run_id")
        state = self.states.get(run_id) if type(run_id) is str else None
        if state is not None and self.restore:  # as a restarted processor has it: from its store
            state = load_state(dump_state(state))
        body: dict[str, Any] = {"msg": msg}
        if self.stack_probe is not None and action_index in self.probe_actions:
            body["recursion_at"] = self._recursion_at(state, msg, self.stack_probe)
        try:
            decision = decide(state, msg, self.ctx)
            body.update(self._apply(state, decision, dry=True))
        except Exception as exc:  # the runtime charges the record (fold.py `_charge`)
            if isinstance(exc, _Unserializable):
                cause, error = deadletter.UNSERIALIZABLE, str(exc)
            else:
                cause = deadletter.UNSERIALIZABLE if _refused_value(exc) else deadletter.PROCESSING_ERROR
                error = f"{type(exc).__name__} while folding {msg.get('type')}: {exc}"
            body.update(raised=_exception(exc), cause=cause)
            if type(run_id) is str:  # what it folds instead (its envelope decoded: run_id, ts_ms, type)
                substitute = _instead(msg, cause, error)
                body["instead"] = substitute
                if substitute["type"] != "RunRejected":
                    try:
                        body["instead_decision"] = self._apply(state, decide(state, substitute, self.ctx))
                    except Exception as again:  # the runtime gives up on it: the dead letter stays
                        body["instead_raised"] = _exception(again)
        else:
            self._apply(state, decision)
        if msg.get("type") == "TimerFired" and isinstance(msg.get("timer_id"), str):
            self.timers.pop(msg["timer_id"], None)  # a timer that came back is done, whatever came of it
        self._line(action_index, body)

    def _apply(self, before: Any, decision: Any, *, dry: bool = False) -> dict[str, Any]:
        """The decision as a line; unless `dry`, applied to the runs, activations and timers.
        Raises _Unserializable where the runtime would: an event, a timer or a state its
        encoders refuse (then nothing of the record is applied)."""
        from processors.engine import effects, state_digest

        lines: list[dict[str, Any] | None] = []
        for event, state in zip(decision.events, decision.states, strict=True):
            try:
                orjson.dumps(event)
            except TypeError as exc:
                raise _Unserializable(f"its {event['type']} event cannot be encoded: {exc}") from exc
            if state is None:
                lines.append(None)
                continue
            fx = effects(state, event)
            for body in fx.set_timers:
                try:
                    orjson.dumps(body)
                    if not body["due_ms"] < LONG_END:
                        raise OverflowError(f"due_ms {body['due_ms']} is beyond a 64-bit long")
                except (TypeError, OverflowError) as exc:
                    raise _Unserializable(f"its timer cannot be stored: {exc}") from exc
            lines.append(
                {
                    "messages": list(fx.messages),
                    "set_timers": list(fx.set_timers),
                    "clear_timers": list(fx.clear_timers),
                }
            )
            if not dry:
                self.activations += [
                    m for m in fx.messages if m["type"] in ("ActionActivation", "ChildRunActivation")
                ]
                for timer_id in fx.clear_timers:
                    self.timers.pop(timer_id, None)
                for timer in fx.set_timers:
                    self.timers[timer["timer_id"]] = timer
        after = decision.state_after(before)
        digest = None
        if decision.events and after is not None:
            try:
                digest = state_digest(after)
            except TypeError as exc:
                raise _Unserializable(f"the run's state cannot be serialized: {exc}") from exc
        if not dry and decision.events:
            run_id = decision.events[0]["run_id"]
            if after is not None:
                self.states[run_id] = after
            self.logs.setdefault(run_id, []).extend(e for e in decision.events if e["sequence"])
        return {
            "events": decision.events,
            "wire": _wire_hash(decision.events),
            "dropped": decision.dropped,
            "effects": lines,
            "digest": digest,
        }

    def _recursion_at(self, state: Any, msg: dict[str, Any], cap: int) -> int | None:
        """The fewest Python frames (0..cap), over the child's own, a caller of `decide` may have
        for it to raise RecursionError on `msg`; None if it does not with `cap` more. The runtime
        calls `decide` from whatever depth its loop has: the outcome must not depend on the engine
        at any of them. (A deeper stack only fails sooner: a bisection finds the first.)"""
        from processors.engine import decide

        def raises(frames: int) -> bool:
            try:
                _with_frames(frames, lambda: decide(state, msg, self.ctx))
            except RecursionError:
                return True
            except Exception:  # any other outcome is on the line already
                return False
            return False

        if raises(0):
            return 0
        if not raises(cap):
            return None
        low, high = 1, cap
        while low < high:
            middle = (low + high) // 2
            if raises(middle):
                high = middle
            else:
                low = middle + 1
        return low

    def replay(self) -> None:
        """Each run's events, read back, fold to the state its decisions carried."""
        from processors.engine import evolve, state_digest

        for run_id in sorted(self.logs):
            state = None
            try:
                for event in self.logs[run_id]:
                    state = evolve(state, orjson.loads(orjson.dumps(event)))
                replayed: Any = state_digest(state) if state is not None else None
            except Exception as exc:
                replayed = _exception(exc)
            live = self.states.get(run_id)
            self._line(
                -2,
                {
                    "replay": run_id,
                    "live": state_digest(live) if live is not None else None,
                    "replayed": replayed,
                },
            )


def child_main(mode: str) -> None:
    """Read cases (JSON lines) on stdin, write their lines on stdout."""
    from processors.native_engine import running

    actual = running()
    if actual != mode:
        raise SystemExit(f"asked for the {mode} engine, running the {actual} one")
    sys.stdout.write(_canon({"engine": actual}) + "\n")
    for raw in sys.stdin:
        if raw.strip():
            case = json.loads(raw)  # the standard library: integers beyond 64 bits too
            _Driver(case, sys.stdout.write).run(case["actions"])
    sys.stdout.flush()


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    child_main(sys.argv[2])
    raise SystemExit(0)


# ================================================================================ the parent

from engine_world import CHILD, OUTPUTS, PAYLOADS, TURN_OUTPUTS, USAGES, definitions, run_inputs  # noqa: E402

from processors import native_engine  # noqa: E402


def run_children(batch: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each engine's lines for the batch: one child per engine, one after the other."""
    native_engine.build()  # a no-op when a build of these sources exists (scripts/test.sh built it)
    data = "".join(json.dumps(case) + "\n" for case in batch)
    out = {}
    for mode in MODES:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode],
            input=data,
            env={**os.environ, "RUNFOLD_ENGINE": mode, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert proc.returncode == 0, f"the {mode} child failed:\n{proc.stderr[-4000:]}"
        out[mode] = proc.stdout.split("\n")[:-1]  # not splitlines(): a JSON string may hold U+2028
        assert json.loads(out[mode][0]) == {"engine": mode}
    return out


def first_difference(lines: dict[str, list[str]]) -> tuple[str, str] | None:
    a, b = lines["interpreted"], lines["compiled"]
    for index in range(1, max(len(a), len(b))):
        left = a[index] if index < len(a) else "{}"
        right = b[index] if index < len(b) else "{}"
        if left != right:
            return left, right
    return None


# ---- hostile values ---------------------------------------------------------------------------


def deep(levels: int) -> Any:
    value: Any = 0
    for index in range(levels):
        value = {"d": value} if index % 2 else [value]
    return value


KEYS = [
    *("v", "k", "w", "d", "q", "id", "name", "arguments", "content", "answer", "tool_calls", "approved"),
    *("reason", "message", "code", "retryable", "node", "lineage", "from", "pointer", "value", "items"),
    *("prompt_tokens", "completion_tokens", "cost_micros", "$secret", "api_key", "password", "depth"),
]
STRINGS = [
    *("", "x", "0", "1", "~", "~1", "~1.0", "0~1", "n0", "n1", "s0", "s1", "ok-poke", "look", "poke"),
    *("ask", "succeeded", "failed", "cancelled", "Timeout", "state", "input", "/v", "éé"),
    *("sk-live-123", "Bearer abc", "\x00", "\ud800"),  # secret-looking, a control character, a lone surrogate
]
SAFE_STRINGS = STRINGS[:-4]
HUGE = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63) - 1, 10**30]
SPECIAL = [deep(3), deep(63), deep(64), deep(65), deep(200), deep(260), "x" * 5000, 1e300, -0.0, 1.5]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(HUGE),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(STRINGS),
    st.text(max_size=5),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS), kids, max_size=3),
    max_leaves=6,
)
hostile = st.one_of(json_values, json_values, st.sampled_from(SPECIAL))
# what a definition holds (validation refuses secrets, orjson integers beyond 64 bits)
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 100) | st.floats(-1e6, 1e6) | st.sampled_from(SAFE_STRINGS),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS[:20]), kids, max_size=3),
    max_leaves=5,
)
ints = st.one_of(st.integers(-2, 3), st.sampled_from(HUGE), st.integers(0, 100_000))
# a top-level field of the wrong type: decide drops the message with the reason
wrong_types = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.sampled_from([[], {}, "1"]))

usages = st.one_of(
    st.sampled_from([*USAGES, None]),
    st.dictionaries(
        st.sampled_from(["prompt_tokens", "completion_tokens", "cost_micros", "x"]),
        st.one_of(ints, hostile, st.just(True), st.just(2.0)),
        max_size=3,
    ),
    hostile,
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["a", "b"]),
            "name": st.sampled_from(["look", "poke", "ask", "nope", ""]),
            "arguments": st.sampled_from([{"q": 1}, {}, {"x": 1}]) | hostile,
        }
    )
    | hostile,
    max_size=3,
)
turn_outputs = st.one_of(
    st.sampled_from(TURN_OUTPUTS),
    st.fixed_dictionaries({"content": hostile, "tool_calls": tool_calls}),
    st.fixed_dictionaries({"content": hostile, "answer": hostile}),
    st.fixed_dictionaries({"content": hostile}),
)
outputs = st.one_of(st.sampled_from(OUTPUTS), turn_outputs, hostile, st.just({"v": 1}))
approvals = st.one_of(
    st.sampled_from([{"approved": True}, {"approved": False, "reason": "no"}]),
    st.fixed_dictionaries({"approved": hostile, "reason": hostile}),
    st.fixed_dictionaries({"approved": st.booleans(), "reason": hostile}),
)
BUDGET_NAMES = [
    *("max_steps", "max_retries", "max_agents", "max_tokens", "max_cost_micros", "wall_time_ms"),
    *("max_concurrency", "max_nesting_depth", "warn_at_percent", "nope"),
]
budget_overrides = st.one_of(
    st.none(),
    st.just({"max_steps": 60, "max_retries": 20, "max_agents": 20, "wall_time_ms": 20000}),
    st.dictionaries(
        st.sampled_from(BUDGET_NAMES), st.one_of(ints, hostile, st.just(True), st.just(5.0)), max_size=3
    ),
    hostile,
)
failure_codes = st.sampled_from(
    ["ExecutionFailed", "Timeout", "PermissionDenied", "Weird", "", "RetryExhausted"]
)
identity_overrides = st.fixed_dictionaries(
    {},
    optional={
        "attempt": ints | wrong_types,
        "dispatch_id": st.sampled_from(["x", ""]) | wrong_types,
        "lineage": st.sampled_from(["", "0", "1", "~1", "~1.0", "0~1", "~2.1"]) | wrong_types,
        "node": st.sampled_from(["n0", "n1", "n2", "nope"]) | wrong_types,
        "worker_id": st.sampled_from(["w1", "w2", ""]) | wrong_types,
    },
)
RECEIPT_EXTRAS: dict[str, Any] = {
    "accept": st.fixed_dictionaries({}, optional={"lease_ms": ints | wrong_types}),
    "heartbeat": st.fixed_dictionaries({}, optional={"lease_ms": ints | wrong_types}),
    "complete": st.fixed_dictionaries({"output": outputs}, optional={"usage": usages}),
    "fail": st.fixed_dictionaries(
        {},
        optional={
            "code": failure_codes | wrong_types,
            "message": st.sampled_from(["boom", "x" * 5000, ""]) | wrong_types,
            "retryable": st.booleans() | hostile,
            "usage": usages,
        },
    ),
    "cancelled": st.fixed_dictionaries(
        {}, optional={"reason": hostile, "confirmed": st.booleans() | hostile}
    ),
    "child": st.fixed_dictionaries(
        {"status": st.sampled_from(["succeeded", "succeeded", "failed", "cancelled", "weird", ""])},
        optional={
            "output": outputs,
            "failure": st.none()
            | st.fixed_dictionaries({"code": hostile, "message": hostile, "retryable": hostile})
            | hostile,
            "usage": usages,
            "child_run_id": st.just("x") | wrong_types,
        },
    ),
}


# ---- abstract inputs --------------------------------------------------------------------------


@st.composite
def receipt_actions(draw: st.DrawFn) -> dict[str, Any]:
    verb = draw(st.sampled_from(["auto"] * 8 + ["accept", "heartbeat", "complete", "complete", "fail"]))
    verb = draw(st.sampled_from([verb, verb, "cancelled", "child"]))
    action: dict[str, Any] = {
        "op": "receipt",
        "verb": verb,
        "pick": draw(st.integers(0, 50)),
        "live": draw(st.integers(0, 3)) > 0,
        "dt": draw(st.integers(0, 400)),
    }
    if verb == "auto":  # the child chooses the receipt: only fields any of them may carry
        extra = draw(st.fixed_dictionaries({}, optional={"output": outputs, "usage": usages}))
        if "output" not in extra and draw(st.booleans()):
            extra["output"] = draw(st.sampled_from(OUTPUTS))
        action["turn"] = draw(turn_outputs)  # if the attempt is a model turn
    elif draw(st.integers(0, 2)) == 0:  # most receipts are well-formed, or the runs would not move
        extra = draw(RECEIPT_EXTRAS[verb])
        if draw(st.integers(0, 4)) == 0:
            extra.update(draw(identity_overrides))
    elif verb == "complete":
        extra = {"output": draw(st.sampled_from(OUTPUTS) | st.sampled_from(TURN_OUTPUTS))}
    elif verb == "fail":
        extra = {"retryable": draw(st.booleans()), "code": draw(failure_codes)}
    elif verb == "child":
        extra = {"status": draw(st.sampled_from(["succeeded", "failed", "cancelled"]))}
    else:
        extra = {}
    if extra:
        action["extra"] = extra
    if draw(st.integers(0, 15)) == 0:
        fields = ["usage", "output", "lease_ms", "failure", "reason", "code", "attempt"]
        action["drop"] = draw(st.lists(st.sampled_from(fields), max_size=2))
    return action


TIMER_KINDS = [
    *("wall_time", "retry_backoff", "node_timeout", "lease_expiry", "stop_timeout", "wait_timeout"),
    *("sleep", "weird"),
]


@st.composite
def timer_actions(draw: st.DrawFn) -> dict[str, Any]:
    action: dict[str, Any] = {
        "op": "timer",
        "pick": draw(st.integers(0, 20)),
        "late": draw(st.integers(0, 300)),
    }
    if draw(st.integers(0, 3)) == 0:
        action["extra"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "timer_kind": st.sampled_from(TIMER_KINDS),
                    "due_ms": ints | wrong_types,
                    "node": st.sampled_from(["n0", "n1"]) | hostile,
                    "lineage": st.sampled_from(["", "0", "~1"]) | hostile,
                    "attempt": ints | hostile,
                    "dispatch_id": hostile,
                },
            )
        )
    return action


PARENTS = st.fixed_dictionaries(
    {
        "parent_run_id": st.just("p"),
        "parent_node": st.just("n"),
        "parent_lineage": st.just(""),
        "parent_dispatch_id": st.just("d"),
        "root_run_id": st.just("p"),
        "depth": ints | wrong_types,
    }
)


@st.composite
def command_actions(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["cancel", "signal", "approve", "resume", "start", "fail_run", "raw"]))
    kind = draw(st.sampled_from([kind, "signal", "approve", "resume"]))
    if kind == "cancel":
        msg: dict[str, Any] = {"type": "CancelRun", "reason": draw(st.just("test") | hostile)}
    elif kind == "signal":
        msg = {
            "type": "SignalRun",
            "signal": draw(st.sampled_from(["s0", "s1", "nope", "ok-poke", "", "s0" * 80])),
            "payload": draw(st.sampled_from(PAYLOADS) | hostile),
        }
    elif kind == "approve":
        msg = {"type": "SignalRun", "signal": "ok-poke", "payload": draw(approvals)}
    elif kind == "resume":
        msg = {
            "type": "ResumeRun",
            "budgets": draw(budget_overrides),
            "reason": draw(st.just("test") | hostile),
        }
    elif kind == "start":  # the same run id again: a duplicate, a conflict, or hostile
        msg = {
            "type": "StartRun",
            "definition_id": draw(st.sampled_from(["wf", "wf", "child", "nope"])),
            "revision": draw(st.none() | st.just(1) | ints | wrong_types),
            "input": draw(st.just({"q": "hi", "notalist": 5}) | hostile),
            **draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "labels": st.just({"a": "b"}) | hostile,
                        "budgets": budget_overrides,
                        "parent": PARENTS | hostile,
                        "bundle": hostile,
                    },
                )
            ),
        }
    elif kind == "fail_run":  # the runtime's own
        msg = {
            "type": "FailRun",
            "code": draw(failure_codes),
            "message": draw(st.sampled_from(["gone", "y" * 3000])),
        }
    else:  # a type decide knows or not, a run id that is not the run's, fields of any type
        msg = {
            "type": draw(
                st.sampled_from(["ActivationCompleted", "TimerFired", "SignalRun", "StartRun", "Nope"])
            ),
            "run_id": draw(st.sampled_from(["r", "other", ""]) | wrong_types),
            "ts_ms": draw(ints | wrong_types),
            **draw(st.dictionaries(st.sampled_from(KEYS), hostile, max_size=3)),
        }
    return {"op": "msg", "msg": msg, "dt": draw(st.integers(0, 300))}


BUNDLE_PATCHES = st.fixed_dictionaries(
    {
        "path": st.sampled_from(
            [
                *(["state"], ["budgets", "max_steps"], ["budgets", "max_nesting_depth"], ["entry"]),
                *(["nodes", "c", "timeout_ms"], ["nodes", "c", "lease_ms"], ["nodes", "c", "retry"]),
                *(["nodes", "c", "input"], ["nodes", "c", "writes"], ["nodes", "c", "queue"]),
                *(["routes"], ["output"], ["revision"]),
            ]
        ),
        "value": hostile,
        "rehash": st.booleans(),
    }
)


@st.composite
def actions(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["receipt"] * 8 + ["timer"] * 3 + ["command"] * 2 + ["again", "advance"]))
    op = draw(st.sampled_from([op] * 6 + ["child_start", "new_run"]))
    if op == "receipt":
        return draw(receipt_actions())
    if op == "timer":
        return draw(timer_actions())
    if op == "command":
        return draw(command_actions())
    if op == "again":
        return {"op": "again", "pick": draw(st.integers(0, 100))}
    if op == "advance":
        return {"op": "advance", "ms": draw(st.integers(0, 1000))}
    if op == "new_run":
        return {"op": "new_run"}
    action: dict[str, Any] = {"op": "child_start", "pick": draw(st.integers(0, 10))}
    if draw(st.booleans()):
        action["bundle_patch"] = draw(BUNDLE_PATCHES)
    if draw(st.integers(0, 2)) == 0:
        action["extra"] = draw(
            st.fixed_dictionaries(
                {},
                optional={"input": hostile, "labels": hostile, "budgets": budget_overrides, "revision": ints},
            )
        )
    return action


# ---- definitions ------------------------------------------------------------------------------

mutations = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["set", "increment", "append", "remove"]),
        "target": st.sampled_from(["n", "items", "m", "flag", "out", "list"]),
        "value": plain_values
        | st.sampled_from([{"from": "state", "pointer": "/n"}, {"from": "input", "pointer": "/q"}]),
    }
)
DEFINITION_PATCHES = [
    *(("budgets", "max_steps"), ("budgets", "wall_time_ms"), ("state", "n"), ("output",), ("reducers", "n")),
    *(("nodes", "n0", "timeout_ms"), ("nodes", "n0", "input"), ("nodes", "n0", "writes")),
    *(("nodes", "n0", "retry"), ("nodes", "n0", "tools"), ("routes", "n0")),
    *(("nodes", "n1", "mutations"), ("nodes", "n1", "prompt"), ("nodes", "n1", "map")),
]


@st.composite
def loop_nodes(draw: st.DrawFn) -> dict[str, Any]:
    """An agent loop with every kind of tool: an action with an input schema, one that waits for
    an approval, a child run (engine_world draws these too, too rarely to reach their paths)."""
    poke: dict[str, Any] = {"action": "work", "approval": {"signal": "ok-poke"}}
    if draw(st.booleans()):
        poke["approval"]["timeout_ms"] = draw(st.integers(50, 1000))
    if draw(st.booleans()):
        poke["retry"] = {"max_attempts": draw(st.integers(1, 3)), "backoff_ms": draw(st.integers(0, 50))}
    node: dict[str, Any] = {
        "kind": "agent",
        "agent": "helper",
        "model": "small",
        "prompt": {"user": draw(st.sampled_from(["hi", {"from": "input", "pointer": "/q"}]))},
        "tools": {
            "look": {"action": "work", "input_schema": {"type": "object", "required": ["q"]}},
            "poke": poke,
            "ask": {"workflow": "child", "revision": 1},
        },
        "max_turns": draw(st.integers(1, 4)),
        "max_tool_calls": draw(st.integers(0, 6)),
        "lease_ms": 500,
        "heartbeat_ms": 100,
    }
    if draw(st.booleans()):
        node["tools"]["look"]["timeout_ms"] = draw(st.integers(50, 500))
    if draw(st.integers(0, 2)) == 0:
        node["output_schema"] = {"type": "object", "required": ["v"]}
    if draw(st.integers(0, 2)) == 0:
        node["map"] = {"from": "input", "pointer": "/items"}
    if draw(st.booleans()):
        node["retry"] = {"max_attempts": draw(st.integers(1, 3))}
    return node


@st.composite
def first_nodes(draw: st.DrawFn, flavor: str) -> dict[str, Any]:
    """The entry node of a case of that flavor: what engine_world reaches too rarely."""
    if flavor == "loop":
        return draw(loop_nodes())
    if flavor == "map":
        node: dict[str, Any] = {
            "kind": "action",
            "action": "work",
            "map": {"from": "input", "pointer": "/items"},
            "input": {"i": {"from": "item"}},
            "writes": {"items": {"from": "output"}},
            "on_failure": draw(st.sampled_from(["fail_fast", "continue", "skip_dependents"])),
        }
        if draw(st.booleans()):  # each item a child run
            del node["action"]
            node.update(kind="workflow", workflow="child", revision=1)
        return node
    if flavor == "state":  # every mutation and reducer on literal values, at the first barrier
        return {"kind": "state", "mutations": draw(st.lists(mutations, min_size=1, max_size=4))}
    node = {"kind": "wait", "signal": draw(st.sampled_from(["s0", "s1"]))}
    if draw(st.booleans()):
        node["timeout_ms"] = draw(st.integers(50, 1000))
    return node


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    raw = draw(definitions())
    flavor = draw(st.sampled_from(["any", "any", "loop", "loop", "map", "wait", "state"]))
    if flavor != "any":
        raw["nodes"]["n0"] = draw(first_nodes(flavor))
        raw["entry"] = ["n0"]
        raw["budgets"]["max_concurrency"] = draw(st.integers(0, 2))
        for node in raw["nodes"].values():  # every wait on a signal has the same contract
            if node["kind"] == "wait":
                node.pop("payload_schema", None)
                node.pop("accept_early", None)
    for node in raw["nodes"].values():  # what engine_world leaves out: every mutation, literal writes
        if node["kind"] == "state" and draw(st.integers(0, 2)) == 0:
            node["mutations"] = draw(st.lists(mutations, min_size=1, max_size=3))
        if node["kind"] != "sleep" and draw(st.integers(0, 4)) == 0:
            key = draw(st.sampled_from(["n", "items", "m", "rc", "flag", "out", "list"]))
            node["writes"] = {key: {"from": "literal", "value": draw(plain_values)}}
    if draw(st.integers(0, 7)) == 0:  # a hostile field: registration refuses it, or takes it alike
        path = draw(st.sampled_from(DEFINITION_PATCHES))
        target = raw
        for key in path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[path[-1]] = draw(hostile)
    ceilings: dict[str, int] = {}
    if draw(st.integers(0, 5)) == 0:  # small enough for every size and depth check to trip
        ceilings = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "max_json_depth": st.integers(7, 10),
                    "max_payload_bytes": st.integers(20, 400),
                    "max_state_bytes": st.integers(200, 3000),
                    "max_input_bytes": st.integers(20, 400),
                },
            )
        )
    run_input = draw(run_inputs()) if draw(st.integers(0, 5)) else draw(hostile)
    start = {"type": "StartRun", "definition_id": "wf", "revision": None, "input": run_input}
    return {
        "defs": [CHILD, raw],
        "ceilings": ceilings,
        "restore": draw(st.booleans()),
        "actions": [{"op": "msg", "msg": start}, *draw(st.lists(actions(), min_size=20, max_size=80))],
    }


def generate(count: int, seed_value: int) -> list[dict[str, Any]]:
    """`count` cases from hypothesis, the same for a seed (drawn only: nothing fails in here)."""
    found: list[dict[str, Any]] = []

    @seed(seed_value)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def collect(case: dict[str, Any]) -> None:
        found.append({"index": len(found), **copy.deepcopy(case)})

    collect()
    return found


def test_both_engines_decide_alike_on_hostile_inputs() -> None:
    batch = generate(EXAMPLES, SEED)
    found = first_difference(run_children(batch))
    if found is None:
        return
    left, right = found
    where = json.loads(left if left != "{}" else right)
    case = batch[where["case"]]
    cut = {**case, "actions": case["actions"][: max(where["action"], 0) + 1]}
    raise AssertionError(
        "the engines differ\n"
        f"case (its inputs up to the one that differs):\n{json.dumps(cut)[:6000]}\n"
        f"interpreted:\n{left[:6000]}\ncompiled:\n{right[:6000]}"
    )


# ---- the caller's stack -----------------------------------------------------------------------

# A JSON Schema that recurses through a few combinators at each level of its instance: valid, if
# contrived (about 16 Python frames of jsonschema per level; a generated schema can look alike).
TREE_SCHEMA: dict[str, Any] = {
    "$defs": {
        "t": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/u"}]}}]},
        "u": {"oneOf": [{"allOf": [{"anyOf": [{"$ref": "#/$defs/t"}]}]}]},
    },
    "$ref": "#/$defs/t",
}
CALLER_FRAMES = 64  # how many frames deeper than the child's own the runtime's caller may be


def nested_list(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def stack_case() -> dict[str, Any]:
    """Values nested up to and past max_json_depth (64 by default, 100 at most), validated by a
    schema that recurses with them: a step's output, a signal's payload, a run's input."""
    from processors.engine.ids import dispatch_id

    def definition(definition_id: str, nodes: dict[str, Any], **extra: Any) -> dict[str, Any]:
        head = {"schema": "runfold.workflow/v1", "id": definition_id, "revision": 1, "entry": [*nodes]}
        return {**head, "nodes": nodes, **extra}

    defs = [
        definition("out", {"a": {"kind": "action", "action": "work", "output_schema": TREE_SCHEMA}}),
        definition("sig", {"w": {"kind": "wait", "signal": "go", "payload_schema": TREE_SCHEMA}}),
        definition("in", {"a": {"kind": "action", "action": "work"}}, input_schema=TREE_SCHEMA),
    ]
    messages: list[dict[str, Any]] = []
    probed: list[int] = []
    for levels in range(40, 76):
        value = nested_list(levels)
        out, sig, inp = f"o{levels}", f"s{levels}", f"i{levels}"
        completed = {
            "type": "ActivationCompleted",
            "run_id": out,
            **{"node": "a", "lineage": "", "attempt": 1, "dispatch_id": dispatch_id(out, "a", "", 1)},
            **{"worker_id": "w1", "output": value, "usage": {}},
        }
        probed += [len(messages) + 1, len(messages) + 3, len(messages) + 4]
        messages += [
            {"type": "StartRun", "run_id": out, "definition_id": "out", "input": {}},
            completed,
            {"type": "StartRun", "run_id": sig, "definition_id": "sig", "input": {}},
            {"type": "SignalRun", "run_id": sig, "signal": "go", "payload": value},
            {"type": "StartRun", "run_id": inp, "definition_id": "in", "input": value},
        ]
    return {
        "index": 0,
        "defs": defs,
        "ceilings": {"max_json_depth": 100},
        "stack_probe": CALLER_FRAMES,
        "probe_actions": probed,
        "actions": [{"op": "msg", "msg": msg} for msg in messages],
    }


def test_both_engines_decide_alike_whatever_the_callers_stack_depth() -> None:
    """The runtime calls `decide` from its loop, some frames deep. Compiled, the engine's own
    functions take no Python frame, so what they call (jsonschema, walking a value as deep as
    max_json_depth allows) has a few frames more of the recursion limit than interpreted: at some
    depths of the caller the interpreted engine raises RecursionError (the runtime charges the
    record: a StepFailed, a RunRejected) where the compiled one goes on (a StepSucceeded); where
    both raise, the message says where the limit was hit, and the runtime writes it into the run's
    events. Each probed input's line has the first depth at which `decide` raises."""
    found = first_difference(run_children([stack_case()]))
    if found is None:
        return
    left, right = found
    a, b = json.loads(left), json.loads(right)
    value = a["msg"].get("output", a["msg"].get("payload", a["msg"].get("input")))
    levels = 0
    while isinstance(value, list):
        levels, value = levels + 1, value[0]
    raise AssertionError(
        f"the engines differ on {a['msg']['type']} of {a['msg']['run_id']} (a value nested {levels} levels)\n"
        f"interpreted: RecursionError from {a.get('recursion_at')} more caller frames; "
        f"at the child's own depth: {json.dumps(a.get('raised'))} {json.dumps(a.get('events'))[:600]}\n"
        f"compiled: RecursionError from {b.get('recursion_at')} more caller frames; "
        f"at the child's own depth: {json.dumps(b.get('raised'))} {json.dumps(b.get('events'))[:600]}"
    )


def test_both_engines_fold_byte_identical_outputs() -> None:
    """The offline fold's digest (every output's bytes, in order, and the store's contents)."""
    native_engine.build()  # a no-op when a build of these sources exists
    results = {}
    for mode in MODES:
        proc = subprocess.run(
            [sys.executable, "benchmarks/fold_bench.py", "--runs", "400", "--digest"],
            cwd=ROOT,
            env={**os.environ, "RUNFOLD_ENGINE": mode, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {m: r["engine"] for m, r in results.items()} == {
        "interpreted": "interpreted",
        "compiled": "compiled",
    }
    assert results["interpreted"]["succeeded"] == 400
    assert results["interpreted"]["digest"] == results["compiled"]["digest"]
