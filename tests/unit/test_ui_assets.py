"""The UI's vendored assets are the pinned ones, each with its license; the masking of secrets."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from processors.ui.graph import graph
from processors.ui.redact import MASK, mask

VENDOR = Path(__file__).resolve().parents[2] / "processors" / "ui" / "static" / "vendor"


def test_vendored_assets_match_their_pinned_digests_and_have_licenses() -> None:
    table = (VENDOR / "README.md").read_text()
    rows = re.findall(r"^\| (\S+\.js) \|.*\| ([0-9a-f]{64}) \|$", table, flags=re.M)
    assert len(rows) == 3
    for name, digest in rows:
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    for lic in ("LICENSE.htmx", "LICENSE.htmx-ext-sse", "LICENSE.dagre"):
        assert (VENDOR / lic).stat().st_size > 100


def test_mask_hides_secret_keys_and_values_keeps_the_rest() -> None:
    value = {
        "api_key": "abc",
        "nested": [{"password": 123}, {"note": "sk-abcdefghijklmnopqrstuvwx"}, {"ok": "hello"}],
        "max_tokens": 400,
        "handle": {"$secret": "openai"},
        "authorization": {"deep": "x"},
    }
    assert mask(value) == {
        "api_key": MASK,
        "nested": [{"password": MASK}, {"note": MASK}, {"ok": "hello"}],
        "max_tokens": 400,
        "handle": {"$secret": "openai"},
        "authorization": {"deep": MASK},
    }


def test_graph_counts_items_and_attempts_on_the_node() -> None:
    definition = {
        "entry": ["a"],
        "nodes": {"a": {"kind": "action"}, "m": {"kind": "action"}, "w": {"kind": "wait"}},
        "routes": {"a": ["m", {"to": "end", "when": "x"}], "m": [{"to": "w", "when": "state.ok"}]},
    }
    steps = [
        {"node": "a", "status": "succeeded", "activations": 2},
        {"node": "m", "status": "succeeded", "activations": 1},
        {"node": "m", "status": "failed", "activations": 3},
    ]
    g = graph(definition, steps)
    nodes = {n["id"]: n for n in g["nodes"]}
    assert nodes["a"]["status"] == "succeeded" and nodes["a"]["attempts"] == 2 and nodes["a"]["entry"]
    assert nodes["m"]["status"] == "failed" and nodes["m"]["instances"] == 2 and nodes["m"]["attempts"] == 4
    assert nodes["w"]["status"] == "pending"
    assert g["edges"] == [
        {"from": "a", "to": "m", "when": None},
        {"from": "m", "to": "w", "when": "state.ok"},
    ]
    assert {n["status"] for n in graph(definition)["nodes"]} == {None}  # a definition alone: no statuses
