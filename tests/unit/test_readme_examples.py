"""The README's definition example must stay a valid definition (users copy it first)."""

from __future__ import annotations

import re
from pathlib import Path

from processors.engine import load_definition

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_definition_example_is_valid() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no yaml example"
    defn = load_definition(blocks[0])
    assert (defn.id, defn.revision) == ("research-brief", 4)
    assert set(defn.nodes) == {"plan", "search", "write", "review"}
    assert defn.nodes["search"].map is not None
