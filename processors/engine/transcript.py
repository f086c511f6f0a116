"""An agent loop's transcript, read from its turns and tool calls in the run state.

The transcript is not stored twice: a model turn's output (`{content, tool_calls}`) and each tool
call's outcome are already step records (`node[~t]`, `node[~t.i]`, ids.py), so the messages a turn
is sent are derived from them, in the provider-neutral form the executors convert
(docs/executors.md): an assistant message per earlier turn, then a `tool` message per call.
Pure: the same state gives the same messages, so a replay dispatches byte-identical turns.
"""

from __future__ import annotations

from typing import Any

import orjson

from processors.engine.definition import Node
from processors.engine.ids import call_lineage, instance_key, turn_lineage
from processors.engine.state import RunState

# A tool result goes back to the model cut to this many characters: every later turn carries it,
# so one huge result must not make the turn's activation too large for Kafka.
TOOL_RESULT_CHARS = 8_000


def tool_specs(node: Node) -> list[dict[str, Any]]:
    """What the model is told about the tools, in the definition's (sorted) order."""
    return [
        {"name": name, "description": tool.description, "input_schema": tool.input_schema}
        for name, tool in sorted(node.tools.items())
    ]


def tool_call(state: RunState, node: str, loop: tuple[str, int, int | None]) -> dict[str, Any]:
    """The call the model asked for that the tool-call instance `loop` runs."""
    parent, turn, call = loop
    assert call is not None
    output = state["steps"][instance_key(node, turn_lineage(parent, turn))]["output"]
    requested: dict[str, Any] = output["tool_calls"][call]
    return requested


def result_content(record: dict[str, Any]) -> str:
    """A settled tool call as the text the model reads: its output, or its error."""
    if record["status"] == "succeeded":
        output = record["output"]
        content = (
            output if isinstance(output, str) else orjson.dumps(output, option=orjson.OPT_SORT_KEYS).decode()
        )
    else:
        problem = record["failure"] or {"code": "Cancelled", "message": record.get("reason") or "cancelled"}
        content = f"error {problem['code']}: {problem['message']}"
    if len(content) > TOOL_RESULT_CHARS:
        content = content[:TOOL_RESULT_CHARS] + f" … (cut: {len(content)} characters in all)"
    return content


def transcript(state: RunState, node: str, parent: str, turn: int) -> list[dict[str, Any]]:
    """The messages after the prompt that turn `turn` of the loop at `node[parent]` is sent."""
    steps = state["steps"]
    messages: list[dict[str, Any]] = []
    for earlier in range(1, turn):
        output = steps[instance_key(node, turn_lineage(parent, earlier))]["output"]
        calls = output.get("tool_calls") or []
        messages.append({"role": "assistant", "content": output.get("content") or "", "tool_calls": calls})
        for index, call in enumerate(calls):
            record = steps[instance_key(node, call_lineage(parent, earlier, index))]
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "content": result_content(record),
                    "is_error": record["status"] != "succeeded",
                }
            )
    return messages
