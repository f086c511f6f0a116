"""Agent steps: the provider interface, the OpenAI-compatible and local providers, the attempt loop."""

from processors.executors.agents.base import AgentProvider, AgentRequest, AgentResponse, AgentUsage
from processors.executors.agents.local import LocalProvider
from processors.executors.agents.openai_compat import OpenAICompatProvider
from processors.executors.agents.structured import ProviderRouter, run_agent

__all__ = [
    "AgentProvider",
    "AgentRequest",
    "AgentResponse",
    "AgentUsage",
    "LocalProvider",
    "OpenAICompatProvider",
    "ProviderRouter",
    "run_agent",
]
