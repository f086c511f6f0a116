"""The compiled engine (processors/native_engine.py): a build loads only for the very sources it
was built from, and the two engines agree.

The suite itself runs whichever engine `RUNFOLD_ENGINE` and the build give (scripts/test.sh
builds it, so CI runs compiled); the tests here run the engine's own tests and the offline fold
with the *other* engine in a child process, so both are checked on every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from processors import native_engine
from processors.native_engine import (
    COMPILED,
    ENGINE_DIR,
    EXT_SUFFIX,
    MANIFEST,
    NativeEngineError,
    build_dir,
    compiled_dir,
    engine_key,
)

ROOT = Path(__file__).resolve().parents[2]
# The engine's own tests and the fold's: what must pass with either engine.
ENGINE_TESTS = sorted(
    str(p.relative_to(ROOT))
    for pattern in (
        "test_engine_*.py",
        "test_fold_isolation.py",
        "test_properties.py",
        "test_refs.py",
        "test_reducers.py",
        "test_secrets.py",
        "test_dropped_reasons.py",
        "test_runtime_restore_equivalence.py",
    )
    for p in (ROOT / "tests" / "unit").glob(pattern)
    if p.name != "test_engine_differential.py"  # it runs both engines itself
)


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A copy of the engine's sources, to edit."""
    copy = tmp_path / "engine"
    shutil.copytree(ENGINE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def fake_build(root: Path, key: str, *, manifest_key: str | None = None, skip: str | None = None) -> Path:
    """A build directory as `build()` leaves it (the modules are empty files: never imported here)."""
    d = build_dir(key, root)
    d.mkdir(parents=True)
    for name in COMPILED:
        if name != skip:
            (d / f"{name}{EXT_SUFFIX}").write_bytes(b"")
    (d / MANIFEST).write_text(json.dumps({"key": manifest_key or key}))
    return d


def other_mode() -> str:
    return "interpreted" if native_engine.running() == "compiled" else "compiled"


def test_the_copy_has_the_key_of_the_sources(sources: Path) -> None:
    assert engine_key(sources) == engine_key(ENGINE_DIR)


@pytest.mark.parametrize("name", sorted(p.name for p in ENGINE_DIR.glob("*.py")))
def test_an_edit_to_any_engine_source_names_another_build(sources: Path, name: str) -> None:
    """Any source, compiled or not: compiled code may have inlined what an interpreted module defines."""
    before = engine_key(sources)
    path = sources / name
    path.write_bytes(path.read_bytes() + b"\n")
    assert engine_key(sources) != before


def test_a_new_or_removed_module_names_another_build(sources: Path) -> None:
    before = engine_key(sources)
    (sources / "extra.py").write_text("X = 1\n")
    added = engine_key(sources)
    (sources / "extra.py").unlink()
    (sources / "nesting.py").unlink()
    assert len({before, added, engine_key(sources)}) == 3


def test_only_a_finished_build_of_these_sources_loads(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    root = tmp_path / "builds"
    assert compiled_dir(sources, root) is None  # nothing built: interpreted
    built = fake_build(root, engine_key(sources))
    assert compiled_dir(sources, root) == str(built)
    monkeypatch.setenv("RUNFOLD_ENGINE", "interpreted")
    assert compiled_dir(sources, root) is None
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    (sources / "evolve.py").write_text((sources / "evolve.py").read_text() + "# edited\n")
    assert compiled_dir(sources, root) is None, "a build of the sources before the edit must not load"


@pytest.mark.parametrize("defect", ["no manifest", "manifest of another key", "a module missing"])
def test_an_unfinished_or_foreign_build_never_loads(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    root, key = tmp_path / "builds", engine_key(sources)
    if defect == "no manifest":
        (fake_build(root, key) / MANIFEST).unlink()
    elif defect == "manifest of another key":
        fake_build(root, key, manifest_key="0" * 64)
    else:
        fake_build(root, key, skip="superstep")
    assert compiled_dir(sources, root) is None


def test_asking_for_the_compiled_engine_without_a_build_says_what_to_run(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "compiled")
    with pytest.raises(NativeEngineError, match="runfold engine build"):
        compiled_dir(sources, tmp_path / "builds")


def test_an_unknown_mode_is_an_error_that_names_the_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "compild")
    with pytest.raises(NativeEngineError, match="auto, interpreted, compiled, not 'compild'"):
        native_engine.mode()


def test_a_build_that_fails_says_why_and_leaves_nothing_that_loads(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evolve = sources / "evolve.py"
    evolve.write_text(evolve.read_text() + "\n_BROKEN: int = 'not an int'\n")
    monkeypatch.setattr(native_engine, "ENGINE_DIR", sources)
    root = tmp_path / "builds"
    with pytest.raises(NativeEngineError, match=r"mypyc failed \(exit 1\):[\s\S]*evolve\.py"):
        native_engine.build(root=root)
    assert list(root.iterdir()) == []  # the scratch went with it
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    assert compiled_dir(sources, root) is None


def _child_env(mode: str) -> dict[str, str]:
    return {**os.environ, "RUNFOLD_ENGINE": mode, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def built() -> native_engine.Build:
    """The build of the sources as they are (about 20 s when there is none yet; scripts/test.sh
    built it already). A failure here is a failure: the other engine would go untested."""
    return native_engine.build()


def test_the_engine_tests_pass_with_the_other_engine(built: native_engine.Build) -> None:
    mode = other_mode()
    which = subprocess.run(
        [sys.executable, "-c", "from processors.native_engine import running; print(running())"],
        env=_child_env(mode),
        capture_output=True,
        text=True,
        check=True,
    )
    assert which.stdout.strip() == mode  # the child really runs the other engine
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENGINE_TESTS],
        cwd=ROOT,
        env=_child_env(mode),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"engine tests with the {mode} engine:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}"
    )
    assert " passed" in proc.stdout.splitlines()[-1]


def test_both_engines_fold_byte_identical_outputs(built: native_engine.Build) -> None:
    """The offline fold's digest (every output's bytes, in order, and the store's contents)."""
    results = {}
    for mode in ("interpreted", "compiled"):
        proc = subprocess.run(
            [sys.executable, "benchmarks/fold_bench.py", "--runs", "400", "--digest"],
            cwd=ROOT,
            env=_child_env(mode),
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {m: r["engine"] for m, r in results.items()} == {
        "interpreted": "interpreted",
        "compiled": "compiled",
    }
    assert results["interpreted"]["succeeded"] == 400
    assert results["interpreted"]["digest"] == results["compiled"]["digest"]
