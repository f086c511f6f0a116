"""runfold's Python client SDK: `RunClient` and its typed errors (see docs/client.md)."""

from processors.client.answers import CommandAnswer
from processors.client.client import RunClient, new_run_id
from processors.client.errors import (
    AnswerTimeout,
    BrokerUnavailable,
    CommandRejected,
    DefinitionConflict,
    InvalidArgument,
    InvalidDefinition,
    RunfoldError,
    RunfoldTimeout,
    RunNotFound,
    RunRejected,
    UnknownDefinition,
)
from processors.client.reader import TopicMissing
from processors.client.views import RunView

__all__ = [
    "AnswerTimeout",
    "BrokerUnavailable",
    "CommandAnswer",
    "CommandRejected",
    "DefinitionConflict",
    "InvalidArgument",
    "InvalidDefinition",
    "RunClient",
    "RunNotFound",
    "RunRejected",
    "RunView",
    "RunfoldError",
    "RunfoldTimeout",
    "TopicMissing",
    "UnknownDefinition",
    "new_run_id",
]
