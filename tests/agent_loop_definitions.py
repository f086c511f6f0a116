"""The ticket-triage agent loop the agent-loop tests share (pure engine, harness, real broker):
one agent node `triage` with the tools a test gives, writing its answer to state `triage`."""

from __future__ import annotations

from typing import Any

TRIAGE_SCHEMA = {
    "type": "object",
    "required": ["category"],
    "properties": {"category": {"enum": ["billing", "bug"]}},
}
SEARCH_SCHEMA = {"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}


def triage_node(tools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The agent node; `extra` fields override or add to it (output_schema, limits, retry...)."""
    return {
        "kind": "agent",
        "agent": "support",
        "model": "small",
        "prompt": {"system": "You triage tickets.", "user": {"from": "input", "pointer": "/ticket"}},
        "tools": tools,
        "writes": {"triage": {"from": "output"}},
        **extra,
    }


def triage_definition(definition_id: str, tools: dict[str, Any], **node_extra: Any) -> dict[str, Any]:
    return {
        "schema": "runfold.workflow/v1",
        "id": definition_id,
        "revision": 1,
        "state": {"triage": None},
        "entry": ["triage"],
        "nodes": {"triage": triage_node(tools, **node_extra)},
    }
