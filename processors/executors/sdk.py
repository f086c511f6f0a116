"""The action-worker SDK: a plain Python function becomes an action.

    from processors.executors import Worker, ActionContext, action

    @action("greet")                      # module-level registry (what `runfold worker --module` loads)
    def greet(ctx: ActionContext, input: dict) -> dict:
        return {"hello": input["name"]}

    worker = Worker(name="billing", queues=["default"])
    @worker.action("charge")              # or on one worker only
    async def charge(ctx: ActionContext, input: dict) -> dict:
        ...                               # use ctx.idempotency_key with the payment API
    worker.run()                          # blocks; SIGTERM drains

One signature: `(ctx: ActionContext, input) -> JSON-able`, sync (runs in a thread pool) or
async (runs on the worker's event loop). Raise `ActionError` / `RetryableError` /
`NonRetryableError` to fail; any other exception is `ExecutionFailed`, retryable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processors.executors.builtin import builtin_registry
from processors.executors.registry import Action, ActionRegistry, Handler
from processors.executors.runner import run_worker
from processors.executors.secrets import SecretStore
from processors.executors.settings import WorkerSettings
from processors.kafka.exits import ExitCode

registry = ActionRegistry()
"""The module-level registry: `@action(...)` registers here; every Worker includes it."""


def action(name: str) -> Callable[[Handler], Handler]:
    """Register a handler on the module-level registry (see `registry`)."""
    return registry.action(name)


class Worker:
    """A pool of handlers serving one or more activation queues."""

    def __init__(
        self,
        name: str | None = None,
        queues: list[str] | None = None,
        settings: WorkerSettings | None = None,
        secrets: SecretStore | None = None,
        builtins: bool = True,
        **overrides: Any,
    ) -> None:
        base = settings or WorkerSettings()
        updates = dict(overrides)
        if name is not None:
            updates["name"] = name
        if queues is not None:
            updates["queues"] = list(queues)
        # validated like any settings (model_copy would take `queues=["a b"]` or `agents={...}`
        # unchecked and unconverted, to fail later inside the runner)
        self.settings = WorkerSettings.model_validate({**base.model_dump(), **updates}) if updates else base
        self.secrets = secrets or SecretStore()
        self.registry = ActionRegistry()
        if builtins:
            self._builtins = builtin_registry(self.settings)
        else:
            self._builtins = ActionRegistry()

    def action(self, name: str) -> Callable[[Handler], Handler]:
        return self.registry.action(name)

    def lookup(self, name: str) -> Action | None:
        """This worker's own actions first, then the module-level registry, then the built-ins."""
        return self.registry.get(name) or registry.get(name) or self._builtins.get(name)

    def action_names(self) -> list[str]:
        return sorted(set(self.registry.names()) | set(registry.names()) | set(self._builtins.names()))

    def run(self, kafka: Any = None, topic_prefix: str | None = None) -> ExitCode:
        """Consume activations until SIGTERM/SIGINT, then drain. Returns the exit code
        (`ExitCode`: docs/runtime.md, "Exit codes")."""
        return run_worker(self, kafka, topic_prefix)
