"""Agent steps: the provider interface, the OpenAI-compatible, Anthropic and local providers,
the attempt loop, and one turn of a tool-using agent."""

from processors.executors.agents.anthropic import AnthropicProvider
from processors.executors.agents.base import (
    AgentProvider,
    AgentRequest,
    AgentResponse,
    AgentUsage,
    Message,
    ToolCall,
    ToolSpec,
)
from processors.executors.agents.local import LocalProvider
from processors.executors.agents.openai_compat import OpenAICompatProvider
from processors.executors.agents.structured import ProviderRouter, run_agent
from processors.executors.agents.tool_turn import run_agent_activation, run_agent_turn

__all__ = [
    "AgentProvider",
    "AgentRequest",
    "AgentResponse",
    "AgentUsage",
    "AnthropicProvider",
    "LocalProvider",
    "Message",
    "OpenAICompatProvider",
    "ProviderRouter",
    "ToolCall",
    "ToolSpec",
    "run_agent",
    "run_agent_activation",
    "run_agent_turn",
]
