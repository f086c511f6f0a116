"""What the harness's in-memory worker does with an activation: the worker runner's own steps.

An `ActionActivation` runs the way `processors.executors.runner` runs it: the handler is looked
up in the same order (the environment's own actions, then the module-level `@action` registry,
then the built-ins), it gets a real `ActionContext`, and its return value or exception becomes a
receipt through `receipts.terminal_receipt` (the same classification, redaction and output
checks). Agent steps go through the real `run_agent` (prompt, output schema, structured-output
attempts, usage) with the environment's agents as providers, the deterministic local provider
for the others. Only time differs: receipts carry the virtual clock, and `ctx.remaining_ms()`
counts down on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from processors.executors.agents import AgentRequest, AgentResponse, ProviderRouter, run_agent_activation
from processors.executors.context import ActionContext
from processors.executors.errors import ActionError, Cancelled
from processors.executors.receipts import accepted, failed, terminal_receipt
from processors.executors.registry import Action
from processors.executors.sdk import Worker
from processors.executors.secrets import SecretResolver, SecretsPolicy, SecretStore
from processors.executors.settings import AgentsConfig
from processors.executors.tracebacks import log_handler_failure

WORKER_ID = "harness-worker"
log = logging.getLogger("runfold.testing")


class _NoAnswer:
    """A canned result: the worker accepts the activation and is never heard from again (it
    died, or hangs without heartbeats), so the step's lease and timeout timers decide."""

    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER: Any = _NoAnswer()


class VirtualContext(ActionContext):
    """An `ActionContext` whose deadline counts down on the environment's clock."""

    def __init__(self, activation: dict[str, Any], secrets: SecretResolver, clock: Callable[[], int]) -> None:
        super().__init__(activation, secrets, WORKER_ID)
        self._clock = clock

    def remaining_ms(self) -> int | None:
        if self.deadline_ms is None:
            return None
        return int(self.deadline_ms - self._clock())


class _FunctionProvider:
    """An agent given to the environment: a function of the `AgentRequest`, or a canned answer."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    async def complete(self, request: AgentRequest) -> AgentResponse:
        value = self._answer(request) if callable(self._answer) else self._answer
        if isinstance(value, BaseException):
            raise value
        if asyncio.iscoroutine(value):
            value = await value
        if isinstance(value, AgentResponse):
            return value
        if isinstance(value, str):  # a text answer, parsed against the output schema if there is one
            return AgentResponse(text=value)
        return AgentResponse(text=orjson.dumps(value).decode(), json=value)


def _canned(value: Any) -> Callable[[ActionContext, Any], Any]:
    def handler(ctx: ActionContext, input: Any) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value

    return handler


class HarnessWorker:
    """Runs activations to receipts, synchronously, on one event loop of its own."""

    def __init__(
        self,
        actions: Mapping[str, Any],
        agents: Mapping[str, Any],
        secrets: SecretStore | None,
        clock: Callable[[], int],
    ) -> None:
        self.worker = Worker(name="harness", secrets=secrets or SecretStore())
        self._no_answer: set[str] = set()
        for name, impl in actions.items():
            if impl is NO_ANSWER:
                self._no_answer.add(name)
            else:
                self.worker.action(name)(impl if callable(impl) else _canned(impl))
        config = AgentsConfig()
        self.router = ProviderRouter(config, self.worker.secrets)
        self._agents_no_answer: set[str] = set()
        for name, answer in agents.items():
            if answer is NO_ANSWER:
                self._agents_no_answer.add(name)
            else:
                self.router.add(f"harness:{name}", _FunctionProvider(answer), route=name)
        self._policy = SecretsPolicy()
        self._clock = clock
        self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        self._loop.run_until_complete(self.router.aclose())
        self._loop.close()

    def run(self, act: dict[str, Any]) -> list[dict[str, Any]]:
        """The receipts a worker sends for this activation, in order (none when it never answers)."""
        now = self._clock()
        stamp = {"ts_ms": now}
        if act.get("kind") == "agent":
            spec = act.get("agent")
            if not spec:
                return [
                    {
                        **failed(
                            act, WORKER_ID, "InvalidInput", "agent activation without an agent spec", False
                        ),
                        **stamp,
                    }
                ]
            if str(spec.get("agent") or "") in self._agents_no_answer:
                return [{**accepted(act, WORKER_ID), **stamp}]
            handler: Action | None = None
        else:
            name = act.get("action") or ""
            if name in self._no_answer:
                return [{**accepted(act, WORKER_ID), **stamp}]
            handler = self.worker.lookup(name)
            if handler is None:
                message = f"action {name!r} is not registered on the test environment's worker"
                return [{**failed(act, WORKER_ID, "UnknownReference", message, False), **stamp}]
        deadline = act.get("deadline_ms")
        if deadline is not None and now >= deadline:
            message = "activation deadline passed before start"
            return [{**failed(act, WORKER_ID, "Timeout", message, True), **stamp}]
        resolver = SecretResolver(
            self.worker.secrets,
            act.get("capabilities") or (),
            self._policy,
            act.get("definition_id") or "",
            act.get("queue") or "",
        )
        ctx = VirtualContext(act, resolver, self._clock)
        try:
            output = self._loop.run_until_complete(self._call(ctx, act, handler))
            receipt = terminal_receipt(ctx, output=output)
        except Exception as exc:  # what the runner does: a receipt, and the traceback in the log
            receipt = terminal_receipt(ctx, error=exc)
            label = act.get("action") or f"agent:{(act.get('agent') or {}).get('agent') or ''}"
            log_handler_failure(log, label, act, exc, isinstance(exc, ActionError | Cancelled))
        return [{**accepted(act, WORKER_ID), **stamp}, {**receipt, **stamp}]

    async def _call(self, ctx: ActionContext, act: dict[str, Any], handler: Action | None) -> Any:
        if handler is None:
            return await run_agent_activation(ctx, act["agent"], self.router)
        if handler.is_async:
            return await handler.fn(ctx, act.get("input"))
        return handler.fn(ctx, act.get("input"))
