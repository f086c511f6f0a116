"""The compiled engine (processors/native_engine.py): a build loads only for the very sources it
was built from, and what a build refuses.

The suite itself runs whichever engine `RUNFOLD_ENGINE` and the build give (scripts/test.sh
builds it, so CI runs compiled); that the two engines agree is tests/unit/test_engine_differential.py's:
the same generated inputs, and the offline fold, through both, outputs compared.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from processors import native_engine
from processors.native_engine import (
    ENGINE_DIR,
    EXT_SUFFIX,
    MANIFEST,
    NativeEngineError,
    build_dir,
    choice_problem,
    compiled_dir,
    engine_key,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    """A copy of the engine's sources, to edit."""
    copy = tmp_path / "engine"
    shutil.copytree(ENGINE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def fake_build(root: Path, key: str, *, manifest_key: str | None = None, skip: str | None = None) -> Path:
    """A build as `build()` leaves it: a directory of its own and the key's link to it (the
    modules are empty files: never imported here)."""
    d = root / f"{key[:32]}-fake"
    d.mkdir(parents=True)
    for name in native_engine._FILES:
        if name != skip:
            (d / f"{name}{EXT_SUFFIX}").write_bytes(b"")
    (d / MANIFEST).write_text(json.dumps({"key": manifest_key or key}))
    build_dir(key, root).symlink_to(d.name)
    return d


def fake_compile(src: Path, lib: Path, tmp: Path, *, echo: bool) -> None:
    """What mypyc leaves in `lib`, without mypyc (empty module files), a little slowly."""
    time.sleep(0.05)
    out = lib / "processors" / "engine"
    out.mkdir(parents=True)
    for name in native_engine._FILES:
        (out / f"{name}{EXT_SUFFIX}").write_bytes(b"")


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


@pytest.mark.parametrize(
    "defect", ["no manifest", "manifest of another key", "a module missing", "no group library"]
)
def test_an_unfinished_or_foreign_build_never_loads(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    root, key = tmp_path / "builds", engine_key(sources)
    if defect == "no manifest":
        (fake_build(root, key) / MANIFEST).unlink()
    elif defect == "manifest of another key":
        fake_build(root, key, manifest_key="0" * 64)
    elif defect == "a module missing":
        fake_build(root, key, skip="superstep")
    else:
        fake_build(root, key, skip="compiled__mypyc")
    assert compiled_dir(sources, root) is None


def test_asking_for_the_compiled_engine_without_a_build_says_what_to_run(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never at import (then `runfold engine build` could not run either): the processor asks."""
    monkeypatch.setenv("RUNFOLD_ENGINE", "compiled")
    root = tmp_path / "builds"
    assert compiled_dir(sources, root) is None
    problem = choice_problem(sources, root)
    assert problem is not None and "runfold engine build" in problem and str(sources) in problem
    fake_build(root, engine_key(sources))
    assert choice_problem(sources, root) is None and compiled_dir(sources, root) is not None


def test_an_unknown_mode_is_an_error_that_names_the_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNFOLD_ENGINE", "compild")
    with pytest.raises(NativeEngineError, match="auto, interpreted, compiled, not 'compild'"):
        native_engine.mode()
    assert "not 'compild'" in (choice_problem() or "")
    assert compiled_dir() is None
    monkeypatch.setenv("RUNFOLD_ENGINE", "Interpreted")
    assert native_engine.mode() == "interpreted" and choice_problem() is None


def test_the_processor_and_engine_status_refuse_an_engine_they_cannot_run_in_a_line_not_a_traceback() -> None:
    env = {**os.environ, "RUNFOLD_ENGINE": "compild", "PYTHONPATH": str(ROOT)}
    runfold = [sys.executable, "-m", "processors.cli"]
    proc = subprocess.run([*runfold, "processor"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "RUNFOLD_ENGINE must be one of auto, interpreted, compiled, not 'compild'" in proc.stderr
    proc = subprocess.run(
        [*runfold, "engine", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["ok"] is False and "not 'compild'" in answer["problem"]


def test_a_forced_build_swaps_the_link_and_deletes_the_old_build_only_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that resolved the link a moment before it moved is still importing from the
    old directory: it must stay until nobody can be (an hour)."""
    monkeypatch.setattr(native_engine, "_compile", fake_compile)
    root = tmp_path / "builds"
    first = native_engine.build(root=root)
    assert first.built and build_dir(first.key, root).resolve() == first.directory
    assert not native_engine.build(root=root).built  # built: nothing to do
    second = native_engine.build(root=root, force=True)
    assert second.directory != first.directory and build_dir(first.key, root).resolve() == second.directory
    assert first.directory.is_dir()  # left, not deleted
    native_engine._prune(root)
    assert first.directory.is_dir()
    monkeypatch.setattr(native_engine, "_GRACE_S", -1)
    native_engine._prune(root)
    assert not first.directory.exists() and second.directory.is_dir()
    assert [p.name for p in root.iterdir() if p.name.startswith(".build-")] == []


def test_concurrent_builds_all_succeed_and_leave_one_finished_build_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_engine, "_compile", fake_compile)
    monkeypatch.setattr(native_engine, "_KEEP", 1)  # prunes on every build, as with many keys
    root = tmp_path / "builds"
    errors: list[BaseException] = []

    def builder(force: bool) -> None:
        try:
            for _ in range(5):
                native_engine.build(root=root, force=force)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=builder, args=(force,)) for force in (True, True, False, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    key = engine_key()
    assert native_engine._build_of(key, root) is not None


def test_a_build_without_a_c_compiler_says_so_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(NativeEngineError, match="no C compiler: '/nonexistent/cc' is not on PATH"):
        native_engine.build(root=tmp_path / "builds")
    assert not (tmp_path / "builds").exists()


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


def test_a_build_killed_mid_compile_leaves_nothing_that_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of the build (and of its compiler, the whole process group) while mypyc runs."""
    if native_engine.missing_prerequisites() is not None:
        pytest.skip("the compiled engine cannot be built here")
    root = tmp_path / "builds"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from processors.native_engine import build; build(root=Path(sys.argv[1]))",
            str(root),
        ],
        cwd=ROOT,
        env=_child_env("auto"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(root.glob(".build-*/tmp")) and time.monotonic() < deadline:  # the compiler has begun
            time.sleep(0.05)
        assert list(root.glob(".build-*/tmp")), "the build never reached its compiler"
        time.sleep(1)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert proc.returncode == -9
    assert [p for p in root.iterdir() if p.is_symlink()] == []  # nothing published
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    assert compiled_dir(root=root) is None
    monkeypatch.setenv("RUNFOLD_ENGINE", "compiled")
    assert "runfold engine build" in (choice_problem(root=root) or "")


def test_a_build_made_by_another_mypy_still_loads_and_build_makes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key says nothing of the compiler, so a mypy upgrade switches no process's engine;
    but `runfold engine build` must not answer "already built" with the old compiler's output."""
    monkeypatch.setattr(native_engine, "_compile", fake_compile)
    monkeypatch.setenv("RUNFOLD_ENGINE", "auto")
    root = tmp_path / "builds"
    first = native_engine.build(root=root)
    assert json.loads((first.directory / MANIFEST).read_text())["mypy"] == native_engine.compiler_version()
    assert not native_engine.build(root=root).built  # same compiler: nothing to do
    assert native_engine.status(root=root)["outdated"] is False

    monkeypatch.setattr(native_engine, "compiler_version", lambda: "99.0")  # mypy upgraded
    assert compiled_dir(root=root) == str(first.directory)  # the old build still loads
    info = native_engine.status(root=root)
    assert info["outdated"] is True and info["built_by_mypy"] != "99.0" and info["installed_mypy"] == "99.0"
    second = native_engine.build(root=root)
    assert second.built and second.directory != first.directory
    assert native_engine.built_by(second.directory) == "99.0"
    assert compiled_dir(root=root) == str(second.directory)
    assert not native_engine.build(root=root).built and native_engine.status(root=root)["outdated"] is False


def test_a_build_from_before_the_compiler_was_recorded_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_engine, "_compile", fake_compile)
    root = tmp_path / "builds"
    old = fake_build(root, engine_key())  # its manifest names only the key
    assert native_engine.built_by(old) is None
    done = native_engine.build(root=root)
    assert done.built and native_engine.built_by(done.directory) == native_engine.compiler_version()
