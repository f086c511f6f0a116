"""docs/tutorial.md's project works as written: its files (the blocks after a `<!-- file: ... -->`
line) written to a fresh folder, and its test command run there, pass. `runfold dev` itself, as
the tutorial uses it, is tests/integration/test_cli_dev.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "tutorial.md").read_text()


def test_the_tutorial_project_passes_its_own_tests(tmp_path: Path) -> None:
    files = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", DOC, flags=re.S)
    assert {name for name, _ in files} == {"definitions/order.yaml", "shop/actions.py", "tests/test_order.py"}
    for name, text in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "shop" / "__init__.py").write_text("")
    assert "python -m pytest tests -q" in DOC
    assert "pip install -e . pytest" in DOC  # the harness's tests need pytest, not in the base install
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "RUNFOLD_"))}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout
