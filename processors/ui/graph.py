"""A definition as a graph for the UI: nodes (with each one's status in a run) and route edges.

Only the data: the layout is dagre's, in the browser (static/vendor/dagre-*.min.js)."""

from __future__ import annotations

from typing import Any


def definition_of_bundle(bundle: dict[str, Any] | None) -> dict[str, Any] | None:
    """The root definition of a pinned bundle (RunAccepted.bundle)."""
    if not isinstance(bundle, dict):
        return None
    definitions = bundle.get("definitions")
    root = bundle.get("root")
    if not isinstance(definitions, dict) or not isinstance(root, str):
        return None
    found = definitions.get(root)
    return found if isinstance(found, dict) else None


def graph(definition: dict[str, Any], steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`{nodes: [{id, kind, status, instances, attempts}], edges: [{from, to, when}]}`; a mapped
    node's items and attempts are counted on the node, its status the most telling of its items."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for step in steps or []:
        by_node.setdefault(step["node"], []).append(step)
    nodes = []
    raw_nodes = definition.get("nodes") or {}
    for name, spec in raw_nodes.items():
        items = by_node.get(name, [])
        nodes.append(
            {
                "id": name,
                "kind": (spec or {}).get("kind", "?"),
                "status": _summary(items) if steps is not None else None,
                "instances": len(items),
                "attempts": sum(int(s.get("activations") or 0) for s in items),
                "entry": name in (definition.get("entry") or []),
            }
        )
    edges = []
    for source, routes in (definition.get("routes") or {}).items():
        for route in routes if isinstance(routes, list) else [routes]:
            target, when = (route, None) if isinstance(route, str) else (route.get("to"), route.get("when"))
            if isinstance(target, str) and target in raw_nodes:
                edges.append({"from": source, "to": target, "when": when})
    return {"nodes": nodes, "edges": edges}


# the order in which one item's status speaks for a mapped node
_PRIORITY = ("failed", "running", "waiting", "retry_wait", "scheduled", "cancelled", "succeeded", "skipped")


def _summary(items: list[dict[str, Any]]) -> str:
    if not items:
        return "pending"
    statuses = {s["status"] for s in items}
    for status in _PRIORITY:
        if status in statuses:
            return status
    return str(items[0]["status"])
