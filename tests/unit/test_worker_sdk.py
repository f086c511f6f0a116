"""The worker SDK without a broker: registration, error mapping, secrets, terminal receipts."""

from __future__ import annotations

import asyncio

import pytest

from processors.executors import ActionError, NonRetryableError, RetryableError, SecretStore, Worker
from processors.executors.context import ActionContext
from processors.executors.errors import Cancelled, classify, redact
from processors.executors.receipts import accepted, heartbeat, terminal_receipt
from processors.executors.registry import ActionRegistry
from processors.executors.secrets import (
    SecretResolver,
    SecretsPolicy,
    contains_any,
    contains_handle,
    env_var_for,
)
from processors.executors.settings import SecretRule

POLICY = SecretsPolicy({"api": SecretRule(definitions=["*"]), "db": SecretRule(queues=["*"])})


def _activation(**extra: object) -> dict:
    act = {
        "type": "ActionActivation",
        "run_id": "r-1",
        "node": "fetch",
        "lineage": "2",
        "attempt": 3,
        "dispatch_id": "d" * 32,
        "kind": "action",
        "action": "x",
        "input": {},
        "lease_ms": 9000,
        "heartbeat_ms": 1000,
        "capabilities": ["secret:api"],
        "deadline_ms": None,
    }
    act.update(extra)
    return act


def _ctx(store: SecretStore | None = None, **extra: object) -> ActionContext:
    act = _activation(**extra)
    return ActionContext(
        act,
        SecretResolver(
            store or SecretStore({"api": "s3cr3t-value"}, use_env=False), act["capabilities"], POLICY
        ),
        "w-1",
    )


def test_registry_requires_ctx_and_input_and_unique_names() -> None:
    reg = ActionRegistry()

    @reg.action("a")
    def a(ctx: ActionContext, input: dict) -> dict:
        return input

    async def b(ctx: ActionContext, input: dict) -> dict:
        return input

    assert reg.get("a") is not None and not reg.get("a").is_async
    assert reg.register("b", b).is_async
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", b)
    with pytest.raises(TypeError, match=r"\(ctx, input\)"):
        reg.register("c", lambda input: input)


def test_worker_lookup_prefers_own_actions_then_builtins() -> None:
    worker = Worker(name="w", queues=["q"])

    @worker.action("echo")
    def my_echo(ctx: ActionContext, input: dict) -> str:
        return "mine"

    assert worker.lookup("echo").fn is my_echo
    assert worker.lookup("noop") is not None and worker.lookup("http.request") is not None
    assert worker.lookup("missing") is None
    assert worker.settings.queues == ["q"] and worker.settings.group_id("p") == "p-worker-q"


def test_classify_maps_errors_and_redacts_secrets() -> None:
    assert classify(RetryableError("flaky")) == ("ExecutionFailed", "flaky", True)
    assert classify(NonRetryableError("bad", code="InvalidInput")) == ("InvalidInput", "bad", False)
    assert classify(ActionError("PermissionDenied", "no")) == ("PermissionDenied", "no", False)
    code, message, retryable = classify(KeyError("token=s3cr3t-value"), ["s3cr3t-value"])
    assert (code, retryable) == ("ExecutionFailed", True)
    assert "s3cr3t-value" not in message and "KeyError" in message
    assert classify(Cancelled("x"))[0] == "Cancelled"
    with pytest.raises(ValueError, match="unknown failure code"):
        ActionError("Oops", "x")
    assert len(redact("x" * 5000, [])) < 2100


def test_secret_resolver_is_capability_scoped() -> None:
    store = SecretStore({"api": "s3cr3t-value", "db": "other-value"}, use_env=False)
    resolver = SecretResolver(store, ["secret:api"], POLICY)
    out = resolver.resolve({"headers": {"authorization": {"$secret": "api"}}, "n": [1, {"k": "v"}]})
    assert out == {"headers": {"authorization": "s3cr3t-value"}, "n": [1, {"k": "v"}]}
    assert resolver.resolved == ["s3cr3t-value"]
    with pytest.raises(ActionError) as denied:
        resolver.resolve({"$secret": "db"})
    assert denied.value.code == "PermissionDenied" and "other-value" not in denied.value.message
    with pytest.raises(ActionError) as malformed:
        resolver.resolve({"$secret": "api", "extra": 1})
    assert malformed.value.code == "InvalidInput"
    with pytest.raises(ActionError, match="not configured"):
        SecretResolver(store, ["secret:nope"], SecretsPolicy({"nope": SecretRule(definitions=["*"])})).get(
            "nope"
        )
    assert contains_handle([{"a": {"$secret": "x"}}]) and not contains_handle({"a": "$secret"})
    assert contains_any({"k": ["xx s3cr3t-value"]}, ["s3cr3t-value"]) and not contains_any({"k": 1}, ["s"])


def test_secret_store_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_var_for("github.token"), "gh-value")
    assert env_var_for("github.token") == "RUNFOLD_SECRET_GITHUB_TOKEN"
    assert SecretStore().lookup("github.token") == "gh-value"
    assert SecretStore(use_env=False).lookup("github.token") is None


def test_terminal_receipt_outcomes() -> None:
    ok = terminal_receipt(_ctx(), output={"a": 1})
    assert ok["type"] == "ActivationCompleted" and ok["output"] == {"a": 1}
    assert (ok["node"], ok["lineage"], ok["attempt"], ok["run_id"]) == ("fetch", "2", 3, "r-1")

    ctx = _ctx()
    ctx.usage(prompt_tokens=5, completion_tokens=7, cost_micros=11)
    failed = terminal_receipt(ctx, error=RetryableError("flaky"))
    assert (failed["type"], failed["code"], failed["retryable"]) == (
        "ActivationFailed",
        "ExecutionFailed",
        True,
    )
    assert failed["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "cost_micros": 11}

    not_json = terminal_receipt(_ctx(), output={"s": {1, 2}})
    assert (not_json["code"], not_json["retryable"]) == ("InvalidOutput", False)

    ctx = _ctx()
    secret = ctx.secrets.get("api")
    leak = terminal_receipt(ctx, output={"echo": f"Bearer {secret}"})
    assert leak["code"] == "InvalidOutput" and secret not in str(leak)

    literal = terminal_receipt(_ctx(), output={"auth": {"api_key": "abc123"}, "ok": "Bearer xyz"})
    assert literal["code"] == "InvalidOutput" and "abc123" not in literal["message"]
    assert "/auth/api_key" in literal["message"] or "auth" in literal["message"]

    ctx = _ctx()
    ctx.signal_cancel("user asked", "cancel")
    ctx.signal_cancel("later reason", "deadline")  # first reason wins
    assert terminal_receipt(ctx, output={"done": True})["type"] == "ActivationCancelled"

    ctx = _ctx()
    ctx.signal_cancel("deadline passed", "deadline")
    timeout = terminal_receipt(ctx, error=Cancelled("x"))
    assert (timeout["code"], timeout["retryable"]) == ("Timeout", True)

    ctx = _ctx()
    ctx.signal_cancel("worker shutting down", "shutdown")
    assert terminal_receipt(ctx, output={"done": 1})["type"] == "ActivationCompleted"
    shut = terminal_receipt(ctx, error=Cancelled("x"))
    assert (shut["code"], shut["retryable"]) == ("Cancelled", True)


def test_lease_receipts_carry_lease_and_identity() -> None:
    act = _activation()
    a, h = accepted(act, "w-1"), heartbeat(act, "w-1", 4)
    assert (
        a["type"] == "ActivationAccepted" and a["lease_ms"] == 9000 and a["dispatch_id"] == act["dispatch_id"]
    )
    assert h["type"] == "ActivationHeartbeat" and h["record_id"] != a["record_id"]


def test_context_cancellation_for_sync_and_async_handlers() -> None:
    ctx = _ctx(deadline_ms=None)
    assert ctx.idempotency_key == "d" * 32 and ctx.step_key == "r-1/fetch[2]" and ctx.remaining_ms() is None
    ctx.check_cancelled()

    async def scenario() -> str:
        waiter = asyncio.create_task(ctx.wait_cancelled())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        ctx.signal_cancel("stop", "cancel")
        await asyncio.wait_for(waiter, 1)
        return ctx.cancel_reason

    assert asyncio.run(scenario()) == "stop"
    with pytest.raises(Cancelled):
        ctx.check_cancelled()
