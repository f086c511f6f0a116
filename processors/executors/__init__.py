"""Executors: the action worker SDK and runner, agent steps, and the child-run executor."""

from processors.executors.context import ActionContext
from processors.executors.errors import ActionError, Cancelled, NonRetryableError, RetryableError
from processors.executors.registry import ActionRegistry
from processors.executors.sdk import Worker, action, registry
from processors.executors.secrets import SecretStore
from processors.executors.settings import AgentsConfig, ProviderConfig, WorkerSettings

__all__ = [
    "ActionContext",
    "ActionError",
    "ActionRegistry",
    "AgentsConfig",
    "Cancelled",
    "NonRetryableError",
    "ProviderConfig",
    "RetryableError",
    "SecretStore",
    "Worker",
    "WorkerSettings",
    "action",
    "registry",
]
