"""One model turn of a tool-using agent: the executor side of the engine's agent loop.

The engine runs a tool-using agent as a sequence of activations: each model turn is one agent
activation, each tool call the model asks for another activation. This module is the turn. Its
AgentSpec is run_agent's plus `tools: [{name, description, input_schema}]` and `messages`: the
transcript after the prompt (base.py's neutral messages; empty on the first turn). The turn
builds `prompt_messages(prompt, output_schema) + messages`, makes one provider call with the
tools and returns either

    {"content": text, "tool_calls": [{"id", "name", "arguments"}, ...]}   the model asked for tools
    {"content": text, "answer": value}                                   the model answered

With an output schema the answer is parsed and validated; an invalid one is sent back up to
`structured_output_attempts` calls in all, as run_agent does (structured.complete_until_valid),
then `InvalidOutput`. `arguments` is whatever the model sent: a raw string when it was not valid
JSON, for the engine to answer with an error result."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from processors.executors.agents.base import Message, ToolSpec, json_text
from processors.executors.agents.structured import (
    ProviderRouter,
    check_agent_spec,
    complete_until_valid,
    prompt_messages,
    run_agent,
)
from processors.executors.context import ActionContext
from processors.executors.errors import ActionError


def _invalid(message: str) -> ActionError:
    return ActionError("InvalidInput", message)


def tool_specs(raw: Any) -> tuple[ToolSpec, ...]:
    """The spec's `tools`, checked: unique names, each input schema a valid JSON Schema."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _invalid("agent tools must be a list of {name, description, input_schema}")
    specs: list[ToolSpec] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _invalid(f"agent tool {i} needs a name")
        schema = tool.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise _invalid(f"agent tool {tool['name']!r}: input_schema must be an object")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise _invalid(
                f"agent tool {tool['name']!r}: input_schema is not a valid JSON schema: {exc.message[:200]}"
            ) from None
        specs.append(ToolSpec(tool["name"], str(tool.get("description") or ""), schema))
    names = [t.name for t in specs]
    if len(set(names)) != len(names):
        raise _invalid("agent tool names must be unique")
    return tuple(specs)


def _str_field(message: dict[str, Any], key: str, i: int) -> str:
    value = message.get(key)
    if not isinstance(value, str):
        raise _invalid(f"agent transcript message {i}: {key} must be a string")
    return value


def _tool_call(call: Any, i: int) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise _invalid(f"agent transcript message {i}: each tool call is {{id, name, arguments}}")
    return {
        "id": _str_field(call, "id", i),
        "name": _str_field(call, "name", i),
        "arguments": call.get("arguments"),
    }


def transcript(raw: Any) -> list[Message]:
    """The spec's `messages`, checked and in canonical shape (known keys only). A content that is
    not a string is JSON-encoded, as a prompt's is; a structural fault is `InvalidInput`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid("agent messages must be a list")
    out: list[Message] = []
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("system", "user"):
            out.append({"role": role, "content": json_text(m.get("content", ""))})
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _invalid(f"agent transcript message {i}: tool_calls must be a list")
            out.append(
                {
                    "role": "assistant",
                    "content": json_text(m.get("content") or ""),
                    "tool_calls": [_tool_call(c, i) for c in calls],
                }
            )
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _str_field(m, "tool_call_id", i),
                    "name": _str_field(m, "name", i),
                    "content": json_text(m.get("content", "")),
                    "is_error": bool(m.get("is_error", False)),
                }
            )
        else:
            raise _invalid(f"agent transcript message {i}: role must be system, user, assistant or tool")
    return out


async def run_agent_turn(ctx: ActionContext, spec: dict[str, Any], router: ProviderRouter) -> dict[str, Any]:
    """One model turn (see the module docstring for `spec` and the result)."""
    checked = check_agent_spec(spec, router)
    tools = tool_specs(spec.get("tools"))
    messages = prompt_messages(checked.prompt, checked.schema) + transcript(spec.get("messages"))
    response, answer = await complete_until_valid(ctx, checked, messages, tools)
    if response.tool_calls and tools:
        return {
            "content": response.text,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls
            ],
        }
    return {"content": response.text, "answer": answer}


async def run_agent_activation(ctx: ActionContext, spec: dict[str, Any], router: ProviderRouter) -> Any:
    """An agent activation's work: a model turn of an agent loop when the engine sent the tools
    (`run_agent_turn`; the engine runs the tools), else the one-call agent step (`run_agent`)."""
    if spec.get("tools") is not None:
        return await run_agent_turn(ctx, spec, router)
    return await run_agent(ctx, spec, router)
